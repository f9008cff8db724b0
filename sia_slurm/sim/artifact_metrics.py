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

Not the artifact's, measured for issue 38 (:mod:`sia_slurm.controller.idle_waits`; ``None`` where
the rounds were not recorded):

* ``active_job_rounds``: active jobs summed over rounds (the sum of the contention);
* ``job_rounds_waiting_beside_free_gpus``: job-rounds in which an active job held no GPUs
  while GPUs of a type it may use, enough for its smallest run, were free after the round's
  actions; ``rounds_with_jobs_waiting_beside_free_gpus``: rounds with at least one;
  ``waits_beside_free_gpus_by_cause``: the former by where the round left the job out;
* ``unplaced_allocations``: allocations the policy decided and placement could not honour,
  summed over rounds.

Finish-time fairness (Themis; :mod:`sia_slurm.sim.finish_time_fairness`), over the completed
jobs with a ``T_independent`` (each job's JCT alone on a ``1/N`` share of the cluster, ``N`` its
``contention``), ``rho = JCT / T_independent``: ``ftf_mean``, ``ftf_p99`` (the index rule),
``ftf_max``, ``ftf_unfair_fraction`` (the fraction with ``rho > 1``) and ``ftf``, every job's
``rho`` by name; nan (and ``{}``) where no job has one. Pooled: over all jobs.

Pooled over workloads (:func:`pooled_metrics`): the average JCT is the mean over *all* jobs, with
``avg_jct_std_h`` the (population) standard deviation of the per-workload means; the p99 is over
all jobs; the makespan is averaged over workloads; GPU-hours and restarts per job are totals over
total jobs; contention is a mean over all jobs and a max over workloads; solve times pool every
round; ``wall_s`` is the sum (CPU time across workloads), ``wall_max_s`` the longest; the
finish-time fairness figures are over all jobs; the counts of issue 38 are sums (``None`` if any
workload's is).
"""

from __future__ import annotations

import math
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
    # Its JCT alone on an equal share of the cluster (sia_slurm/sim/finish_time_fairness.py);
    # None where not computed.
    independent_s: float | None = None

    @property
    def jct(self) -> float | None:
        return None if self.finish_time is None else self.finish_time - self.submit_time

    @property
    def ftf(self) -> float | None:
        """Finish-time fairness ``rho = JCT / T_independent`` (``None``: unfinished, or no
        finite ``T_independent``)."""
        jct = self.jct
        if jct is None or self.independent_s is None or not 0 < self.independent_s < math.inf:
            return None
        return jct / self.independent_s


@dataclass(frozen=True)
class WaitTotals:
    """Idle waits and unplaced allocations summed over a workload's rounds (module doc)."""

    job_rounds: int = 0  # job-rounds waiting beside free GPUs
    rounds: int = 0  # rounds with at least one such job
    by_cause: Mapping[str, int] = field(default_factory=dict)
    unplaced_allocations: int = 0

    def __add__(self, other: WaitTotals) -> WaitTotals:
        causes = dict(self.by_cause)
        for cause, count in other.by_cause.items():
            causes[cause] = causes.get(cause, 0) + count
        return WaitTotals(
            self.job_rounds + other.job_rounds,
            self.rounds + other.rounds,
            dict(sorted(causes.items())),
            self.unplaced_allocations + other.unplaced_allocations,
        )


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
    ftf_mean: float = math.nan
    ftf_p99: float = math.nan
    ftf_max: float = math.nan
    ftf_unfair_fraction: float = math.nan
    ftf: Mapping[str, float] = field(default_factory=dict)
    active_job_rounds: int = 0
    job_rounds_waiting_beside_free_gpus: int | None = None
    rounds_with_jobs_waiting_beside_free_gpus: int | None = None
    waits_beside_free_gpus_by_cause: Mapping[str, int] | None = None
    unplaced_allocations: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def wait_totals(self) -> WaitTotals | None:
        """The counts of issue 38 as one value (``None`` if not recorded)."""
        return _totals_of(self)


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
    ftf_mean: float = math.nan
    ftf_p99: float = math.nan
    ftf_max: float = math.nan
    ftf_unfair_fraction: float = math.nan
    active_job_rounds: int = 0
    job_rounds_waiting_beside_free_gpus: int | None = None
    rounds_with_jobs_waiting_beside_free_gpus: int | None = None
    waits_beside_free_gpus_by_cause: Mapping[str, int] | None = None
    unplaced_allocations: int | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _totals_of(metrics: WorkloadMetrics) -> WaitTotals | None:
    if (
        metrics.job_rounds_waiting_beside_free_gpus is None
        or metrics.rounds_with_jobs_waiting_beside_free_gpus is None
        or metrics.unplaced_allocations is None
    ):
        return None
    return WaitTotals(
        metrics.job_rounds_waiting_beside_free_gpus,
        metrics.rounds_with_jobs_waiting_beside_free_gpus,
        dict(metrics.waits_beside_free_gpus_by_cause or {}),
        metrics.unplaced_allocations,
    )


def _wait_fields(totals: WaitTotals | None) -> dict[str, Any]:
    """The metrics' fields of issue 38 from ``totals`` (all ``None`` if not recorded)."""
    if totals is None:
        return {}
    return {
        "job_rounds_waiting_beside_free_gpus": totals.job_rounds,
        "rounds_with_jobs_waiting_beside_free_gpus": totals.rounds,
        "waits_beside_free_gpus_by_cause": dict(totals.by_cause),
        "unplaced_allocations": totals.unplaced_allocations,
    }


def _ftf_fields(jobs: Sequence[JobOutcome]) -> dict[str, float]:
    """Mean, p99 (the index rule), max of ``rho`` and the fraction with ``rho > 1``, over the
    jobs that have one (nan for none)."""
    rhos = [rho for rho in (job.ftf for job in jobs) if rho is not None]
    if not rhos:
        return {}
    return {
        "ftf_mean": statistics.fmean(rhos),
        "ftf_p99": percentile_index(rhos, 0.99),
        "ftf_max": max(rhos),
        "ftf_unfair_fraction": sum(rho > 1.0 for rho in rhos) / len(rhos),
    }


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
    waits: WaitTotals | None = None,
) -> WorkloadMetrics:
    """Metrics of one workload from its jobs, the active jobs per round and the solve times,
    and its idle waits and unplaced allocations where its rounds recorded them."""
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
        ftf={job.name: rho for job in done if (rho := job.ftf) is not None},
        **_ftf_fields(jobs),
        active_job_rounds=sum(contention),
        **_wait_fields(waits),
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
    totals = [m.wait_totals for m in per_workload]
    waits = None
    if per_workload and all(t is not None for t in totals):
        waits = sum((t for t in totals if t is not None), WaitTotals())
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
        **_ftf_fields(everyone),
        active_job_rounds=sum(m.active_job_rounds for m in per_workload),
        **_wait_fields(waits),
    )
