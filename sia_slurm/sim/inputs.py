"""Everything a simulation reads, loaded and cross-checked up front, and workload jobs as specs.

:func:`load_inputs` reads the cluster file, the profiles and the traces folder once, so a bad
input fails before any simulation starts, with the file (and line) at fault.
:func:`job_specs` turns a workload into what the controller and the simulated cluster need.

How a workload row becomes a :class:`~sia_slurm.protocol.JobSpec` (the artifact's meaning):

* ``kind`` adaptive; ``init_batch_size`` (M0) and ``max_batch_size`` are the app profile's
  (``profiles/<app>/app.yaml``: the smallest and largest batch with a validation trace). M0 is
  not the workload's ``batch_size``: progress and gradient statistics are measured at the app's
  M0, and the artifact starts every adaptive job there whatever its row says.
* ``requested_gpus`` = ``num_replicas`` and ``requested_batch_size`` = ``batch_size``: the
  size and batch the user asked for, which the policies that do not adapt jobs (Gavel, FIFO) run
  it at, as the artifact's Gavel runs ``target_num_replicas`` and ``target_batch_size``.
* ``restart_cost`` is the restart delay the policy *assumes* for the app (cifar10 30 s, yolov3
  45 s), while the simulated cluster charges the true one (50 s, 80 s).
* ``sia_id`` is the row's ``name``; ``submit_time`` its ``time``.

With Sia's profiling on (``profiling`` "each" or "shared", :mod:`sia_slurm.sim.sweep`), the
controller has no profile to take M0 and the largest batch from, so the spec carries them, from
the app's truth (its smallest and largest validated batch: the same numbers as its profile).
"each" leaves the spec's ``app`` empty, so that every job profiles for itself alone (the
controller keys an app-less job's profiling by its id); the simulated cluster keeps the true
app in :class:`SimJobSpec`. "shared" keys profilings by app and account, and the controller
would take a job without an account for one profiling for itself alone, so such a job is given
the account its fair share already counts it under
(:data:`~sia_slurm.policy.shares.DEFAULT_ACCOUNT`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.core import JobKind
from sia_slurm.policy.shares import DEFAULT_ACCOUNT
from sia_slurm.protocol import JobSpec, ProtocolError, check_sia_id
from sia_slurm.protocol.profile import ProfileError, ProfileSet, load_profiles
from sia_slurm.sim.apps import APPS, default_traces_dir
from sia_slurm.sim.apptruth import AppTruth, SimInputError, load_truths
from sia_slurm.sim.clusterfile import ClusterError, ClusterSpec, load_cluster
from sia_slurm.sim.simulated_cluster import SimJobSpec
from sia_slurm.sim.workload import Workload, WorkloadError, WorkloadJob, load_workloads


@dataclass(frozen=True)
class SimulationInputs:
    """The cluster, the profiles the controller learns from, and where the ground truth is."""

    cluster: ClusterSpec
    profiles: ProfileSet
    traces_dir: Path

    @property
    def apps(self) -> tuple[str, ...]:
        """Apps a workload may name: those with traces *and* a profile (sorted)."""
        return tuple(sorted(set(APPS) & set(self.profiles.apps)))

    @property
    def type_aliases(self) -> dict[str, str]:
        """Cluster GPU type -> profile GPU type (``a100`` -> ``dgx``)."""
        return {t.name: t.profile for t in self.cluster.gpu_types}


def load_inputs(
    cluster_path: Path | str,
    *,
    profiles_dir: Path | str | None = None,
    traces_dir: Path | str | None = None,
) -> SimulationInputs:
    """Load the cluster file against the profiles; :class:`SimInputError` on any problem."""
    try:
        profiles = load_profiles(profiles_dir)
    except ProfileError as exc:
        raise SimInputError(str(exc)) from None
    try:
        cluster = load_cluster(cluster_path, profile_types=set(profiles.gpu_types))
    except ClusterError as exc:
        raise SimInputError(str(exc)) from None
    traces = Path(traces_dir) if traces_dir is not None else default_traces_dir()
    if not traces.is_dir():
        raise SimInputError(f"{traces}: expected the traces folder (data/traces/), not found")
    return SimulationInputs(cluster, profiles, traces)


def load_sim_workloads(
    path: Path | str, inputs: SimulationInputs, *, max_jobs: int | None = None
) -> tuple[Workload, ...]:
    """The workload file, or every ``*.csv`` in a folder, restricted to apps with a profile.

    ``max_jobs`` keeps the first that many jobs of each workload (quick runs and tests).
    """
    if max_jobs is not None and max_jobs < 1:
        raise SimInputError(f"max_jobs: expected a positive number of jobs, got {max_jobs}")
    try:
        workloads = load_workloads(path, apps=inputs.apps)
    except WorkloadError as exc:
        raise SimInputError(
            f"{exc}\n(an app needs traces under {inputs.traces_dir} and a profile under "
            f"{inputs.profiles.root} to be simulated)"
            if "application:" in str(exc)
            else str(exc)
        ) from None
    if max_jobs is None:
        return workloads
    return tuple(Workload(w.path, w.jobs[:max_jobs]) for w in workloads)


def load_workload_truths(
    workloads: Sequence[Workload], inputs: SimulationInputs
) -> dict[str, AppTruth]:
    """Ground truth of every app the workloads use, on every GPU type of the cluster."""
    apps = {job.application for workload in workloads for job in workload.jobs}
    return load_truths(apps, inputs.cluster, inputs.traces_dir)


def job_spec(
    job: WorkloadJob, truth: AppTruth, where: str = "", *, profiling: str = "off"
) -> JobSpec:
    """The :class:`JobSpec` of one workload row (see the module doc for each field)."""
    try:
        check_sia_id(job.name)
    except ProtocolError as exc:
        raise SimInputError(f"{where}: name: {exc}") from None
    profiled = profiling != "off"
    return JobSpec(
        sia_id=job.name,
        app="" if profiling == "each" else job.application,
        kind=JobKind.ADAPTIVE,
        init_batch_size=truth.init_batch_size if profiled else 0,
        max_batch_size=max(truth.stats.batch_sizes) if profiled else 0,
        requested_gpus=job.num_replicas,
        requested_batch_size=job.batch_size,
        restart_cost=truth.restart.assumed_s,
        submit_time=job.submit_time,
    )


def job_specs(
    workload: Workload, truths: Mapping[str, AppTruth], *, profiling: str = "off"
) -> list[SimJobSpec]:
    """Every job of ``workload`` with its app's truth, in submission order (``profiling``:
    see the module doc)."""
    specs = []
    for job in workload.jobs:
        truth = truths[job.application]
        spec = job_spec(job, truth, str(workload.path), profiling=profiling)
        account = job.account or (DEFAULT_ACCOUNT if profiling == "shared" else "")
        specs.append(SimJobSpec(spec, truth, user=job.user, account=account))
    return specs
