"""What the simulator holds to be true of each app: speed per GPU type, statistics, restart delay.

An :class:`AppTruth` bundles, for one app on one simulated cluster, the three inputs a simulated
job needs (reference section 6):

* ``speed``: its measured step and sync times on every GPU type of the cluster
  (:class:`~sia_slurm.sim.groundtruth.GroundTruth`, loaded *uncalibrated*, see below);
* ``stats``: its gradient statistics over training progress and its completion target
  (:class:`~sia_slurm.sim.gradstats.AppGradStats`);
* ``restart``: the delay a (re)start really costs it, and the one policies are told
  (:func:`~sia_slurm.sim.restart.restart_delay`).

Calibration. The artifact slows every app by a factor (cifar10 1.8, ncf 1.5, others 1.2) to
match its physical runs, and applies it to *progress*, while jobs report the measured step times
to the scheduler's models unchanged. The seed profiles in ``profiles/`` are those same measured
times, so a job's reports agree with its seed profile, and the factor acts as a slow-down the
step timer does not see (data loading, evaluation, logging). The simulator does the same: the
ground truth is loaded with calibration 1.0 (what jobs report) and ``calibration`` divides the
rate of progress.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from sia_slurm.sim.clusterfile import ClusterSpec, check_ground_truth
from sia_slurm.sim.gradstats import AppGradStats, GradStatsError
from sia_slurm.sim.groundtruth import GroundTruth, GroundTruthError, default_calibration
from sia_slurm.sim.restart import RestartDelay, restart_delay


class SimInputError(ValueError):
    """The simulator's inputs do not fit together; the message names the files involved."""


@dataclass(frozen=True)
class AppTruth:
    """Ground truth of one app on one simulated cluster (GPU types by their cluster names)."""

    app: str
    speed: Mapping[str, GroundTruth]  # cluster GPU type -> measured (uncalibrated) times
    stats: AppGradStats
    restart: RestartDelay
    calibration: float  # progress is slowed by this factor (module doc)

    @property
    def init_batch_size(self) -> int:
        """M0 of the app's gradient statistics: the batch progress is measured at."""
        return self.stats.init_batch_size

    @property
    def completion_samples(self) -> float:
        """M0-equivalent samples after which a job of this app is done."""
        return self.stats.completion_samples


def load_truths(
    apps: Iterable[str], cluster: ClusterSpec, traces_dir: Path | str
) -> dict[str, AppTruth]:
    """The :class:`AppTruth` of every app in ``apps`` on every GPU type of ``cluster``.

    Every (app, GPU type) pair must have ground truth: a workload job could be placed on any
    type, and the simulator cannot invent its speed there. Missing pairs are reported together,
    each with the file that would hold it.
    """
    names = sorted(set(apps))
    missing = check_ground_truth(cluster, names, traces_dir)
    if missing:
        where = cluster.path or cluster.name
        lines = "\n".join(f"  {item}" for item in missing)
        raise SimInputError(
            f"{where}: GPU types without ground truth for the workload's apps:\n{lines}\n"
            "remove those GPU types from the cluster file or add the traces"
        )
    truths = {}
    for app in names:
        try:
            speed = {
                t.name: GroundTruth.load(traces_dir, app, t.trace_key, calibration=1.0)
                for t in cluster.gpu_types
            }
            stats = AppGradStats.load(traces_dir, app)
        except (GroundTruthError, GradStatsError) as exc:
            raise SimInputError(str(exc)) from None
        truths[app] = AppTruth(
            app=app,
            speed=MappingProxyType(speed),
            stats=stats,
            restart=restart_delay(app),
            calibration=default_calibration(app),
        )
    return truths
