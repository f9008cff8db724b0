"""What the job measured, reported to the controller so it can refit the job's models.

Rank 0 times each uniform step: ``step_time`` is the synchronising micro-batch (the last one of
the step: data, forward, backward) plus the gradient all-reduce after it, ``sync_time`` the
all-reduce alone (the meaning of :class:`sia_slurm.protocol.observation.Observation`). Every
``interval_s`` the means since the previous report are written atomically to
``jobs/<sia_id>/metrics.json`` as a :class:`~sia_slurm.protocol.MetricsReport`, with the smoothed
gradient noise statistics. The window restarts when the batch changes, so a report never
mixes two configurations.

Every measurement also goes into the job's *profile* (totals per configuration and local
batch), which the checkpoint keeps across restarts.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.protocol import MetricsReport, StatePaths, write_document

logger = logging.getLogger(__name__)


@dataclass
class _Totals:
    count: int = 0
    step_time: float = 0.0
    sync_time: float = 0.0

    def add(self, step_time: float, sync_time: float) -> None:
        self.count += 1
        self.step_time += step_time
        self.sync_time += sync_time


class MetricsReporter:
    """Collects step timings and writes the job's metrics report (rank 0 only)."""

    def __init__(
        self,
        env: JobEnvironment,
        interval_s: float | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.env = env
        self.paths = StatePaths(env.state_dir)
        self.interval_s = env.metrics_interval_s if interval_s is None else interval_s
        self._clock = clock
        self._window = _Totals()
        self._last_report = clock()
        self.profile: dict[tuple[str, int, int, int, int], _Totals] = {}
        self.reports_written = 0

    def record(self, step_time: float, sync_time: float, local_bsz: int, accum_steps: int) -> None:
        """One uniform step's timings (seconds)."""
        sync_time = min(max(sync_time, 0.0), step_time)
        self._window.add(step_time, sync_time)
        key = (self.env.gpu_type, self.env.nodes, self.env.gpus, local_bsz, accum_steps)
        self.profile.setdefault(key, _Totals()).add(step_time, sync_time)

    def restart_window(self) -> None:
        """Forget the timings since the last report (the batch changed under them)."""
        self._window = _Totals()

    def due(self) -> bool:
        return self._clock() - self._last_report >= self.interval_s

    def report(
        self,
        *,
        steps: int,
        local_bsz: int,
        accum_steps: int,
        round_index: int,
        noise: GradientNoise,
    ) -> MetricsReport | None:
        """Write the report of the current window; ``None`` (nothing written) if it is empty."""
        self._last_report = self._clock()
        window = self._window
        if window.count == 0:
            return None
        step_time = window.step_time / window.count
        sync_time = window.sync_time / window.count
        if step_time <= 0:
            return None
        report = MetricsReport(
            sia_id=self.env.sia_id,
            time=self._clock(),
            gpu_type=self.env.gpu_type,
            nodes=self.env.nodes,
            gpus=self.env.gpus,
            local_bsz=local_bsz,
            accum_steps=accum_steps,
            step_time=step_time,
            sync_time=min(sync_time, step_time * 0.999),
            grad_sqr=noise.grad_sqr,
            grad_var=noise.grad_var,
            steps=steps,
            round_index=round_index,
            slurm_job_id=self.env.slurm_job_id,
            slurm_restart_count=self.env.restarts,
            node_list=self.env.hostnames,
        )
        try:
            write_document(self.paths.metrics(self.env.sia_id), report)
        except OSError as exc:  # a full or unreachable state dir must not stop training
            logger.warning("metrics report not written: %s", exc)
            return None
        self.reports_written += 1
        self._window = _Totals()
        return report

    # ---- the profile, for the checkpoint -----------------------------------------------------

    def profile_state(self) -> list[list[Any]]:
        return [
            [*key, totals.count, totals.step_time, totals.sync_time]
            for key, totals in sorted(self.profile.items())
        ]

    def load_profile_state(self, rows: list[list[Any]]) -> None:
        self.profile = {}
        for gpu_type, nodes, gpus, local_bsz, accum, count, step_time, sync_time in rows:
            key = (str(gpu_type), int(nodes), int(gpus), int(local_bsz), int(accum))
            self.profile[key] = _Totals(int(count), float(step_time), float(sync_time))
