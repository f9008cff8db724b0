"""Simulation metrics, computed as the Sia artifact computes them (reference section 6).

Per workload (:func:`workload_metrics`), over its completed jobs:

* ``avg_jct_h``: mean job completion time (completion - submission), hours;
* ``p99_jct_h``: ``sorted(jcts)[int(0.99 * n)]``;
* ``makespan_h``: ``max(submit + jct) - min(submit)``;
* ``gpu_hours_per_job``: GPU-hours held (restart delays included) / number of jobs;
* ``restarts_per_job``: restarts (grants of GPUs after a job's first) / number of jobs;
* ``contention_mean``: per job, the mean number of active (submitted, unfinished) jobs over the
  rounds it was active in; averaged over jobs (a mean of means). ``contention_max``: the most
  active jobs in any round;
* ``solve_ms_median``, ``solve_ms_p95``: the policy stage of the controller round (goodput
  evaluation, model refits and solve), over rounds with at least one active job; the p95 is
  ``sorted(ms)[int(0.95 * n)]`` like the p99 above;
* ``wall_s``: wall-clock seconds of the whole simulation;
* ``jct_h``: every job's JCT by name.

Pooled over workloads (:func:`pooled_metrics`): the average JCT is the mean over *all* jobs, with
``avg_jct_std_h`` the (population) standard deviation of the per-workload means; the p99 is over
all jobs; the makespan is averaged over workloads; GPU-hours and restarts per job are totals over
total jobs; contention is a mean over all jobs and a max over workloads; solve times pool every
round; ``wall_s`` is the sum (CPU time across workloads), ``wall_max_s`` the longest.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

HOUR = 3600.0


@dataclass(frozen=True)
class JobOutcome:
    """What happened to one simulated job: its times, GPU use and restarts."""

    name: str
    app: str
    submit_time: float
    finish_time: float | None  # None: never completed
    gpu_seconds: float
    restarts: int
    contention: float  # mean active jobs over the rounds it was active in
    account: str = ""  # the workload's owner of the job (fair shares)
    # Sia's profiling (SimulationConfig.profiling): GPU-seconds of its profiling grants'
    # restarts and sweeps (part of gpu_seconds), and the sweeps it completed.
    profiling_gpu_seconds: float = 0.0
    sweeps: int = 0

    @property
    def jct(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.submit_time


@dataclass(frozen=True)
class WorkloadMetrics:
    """The metrics of one simulated workload (module doc)."""

    jobs: int
    completed: int
    avg_jct_h: float
    p99_jct_h: float
    makespan_h: float
    gpu_hours_per_job: float
    restarts_per_job: float
    contention_mean: float
    contention_max: int
    solve_ms_median: float
    solve_ms_p95: float
    wall_s: float
    jct_h: Mapping[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class PooledMetrics:
    """Metrics over several workloads (module doc)."""

    workloads: int
    jobs: int
    completed: int
    avg_jct_h: float
    avg_jct_std_h: float
    p99_jct_h: float
    makespan_h: float
    gpu_hours_per_job: float
    restarts_per_job: float
    contention_mean: float
    contention_max: int
    solve_ms_median: float
    solve_ms_p95: float
    wall_s: float
    wall_max_s: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile_index(values: Sequence[float], fraction: float) -> float:
    """``sorted(values)[int(fraction * n)]`` (the artifact's p99), nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(int(fraction * len(ordered)), len(ordered) - 1)]


def workload_metrics(
    jobs: Sequence[JobOutcome],
    *,
    contention: Sequence[int],
    solve_ms: Sequence[float],
    wall_s: float,
) -> WorkloadMetrics:
    """Metrics of one workload from its jobs, the active jobs per round and the solve times."""
    done = [job for job in jobs if job.jct is not None]
    jcts = [job.jct for job in done if job.jct is not None]
    n = len(jobs)
    return WorkloadMetrics(
        jobs=n,
        completed=len(done),
        avg_jct_h=statistics.fmean(jcts) / HOUR if jcts else float("nan"),
        p99_jct_h=percentile_index(jcts, 0.99) / HOUR,
        makespan_h=_makespan(done) / HOUR,
        gpu_hours_per_job=sum(job.gpu_seconds for job in jobs) / HOUR / n if n else float("nan"),
        restarts_per_job=sum(job.restarts for job in jobs) / n if n else float("nan"),
        contention_mean=statistics.fmean(job.contention for job in jobs) if n else float("nan"),
        contention_max=max(contention, default=0),
        solve_ms_median=statistics.median(solve_ms) if solve_ms else float("nan"),
        solve_ms_p95=percentile_index(solve_ms, 0.95),
        wall_s=wall_s,
        jct_h={job.name: job.jct / HOUR for job in done if job.jct is not None},
    )


def _makespan(done: Sequence[JobOutcome]) -> float:
    if not done:
        return float("nan")
    return max(job.finish_time for job in done if job.finish_time is not None) - min(
        job.submit_time for job in done
    )


def pooled_metrics(
    per_workload: Sequence[WorkloadMetrics],
    jobs: Sequence[Sequence[JobOutcome]],
    solve_ms: Sequence[Sequence[float]],
) -> PooledMetrics:
    """Pool several workloads' metrics; ``jobs`` and ``solve_ms`` are per workload, in order."""
    everyone = [job for workload in jobs for job in workload]
    jcts = [job.jct for job in everyone if job.jct is not None]
    means = [m.avg_jct_h for m in per_workload if m.completed]
    rounds = [ms for workload in solve_ms for ms in workload]
    n = len(everyone)
    return PooledMetrics(
        workloads=len(per_workload),
        jobs=n,
        completed=len(jcts),
        avg_jct_h=statistics.fmean(jcts) / HOUR if jcts else float("nan"),
        avg_jct_std_h=statistics.pstdev(means) if means else float("nan"),
        p99_jct_h=percentile_index(jcts, 0.99) / HOUR,
        makespan_h=statistics.fmean(m.makespan_h for m in per_workload)
        if per_workload
        else float("nan"),
        gpu_hours_per_job=sum(job.gpu_seconds for job in everyone) / HOUR / n
        if n
        else float("nan"),
        restarts_per_job=sum(job.restarts for job in everyone) / n if n else float("nan"),
        contention_mean=statistics.fmean(job.contention for job in everyone) if n else float("nan"),
        contention_max=max((m.contention_max for m in per_workload), default=0),
        solve_ms_median=statistics.median(rounds) if rounds else float("nan"),
        solve_ms_p95=percentile_index(rounds, 0.95),
        wall_s=sum(m.wall_s for m in per_workload),
        wall_max_s=max((m.wall_s for m in per_workload), default=0.0),
    )
