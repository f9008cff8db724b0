"""Sia's allocation policy: one mixed-integer program per round (reference section 4).

Every job gets one binary variable per configuration it may take (:mod:`.configs`), scored by
its goodput normalised to the row's smallest entry, discounted by the restart factor everywhere
but the current configuration, and raised to the fairness power ``p``. The program picks at most
one configuration per job under a GPU capacity per type, trading the score against the
no-allocation penalty ``lambda_n`` (an objective term, not a constraint: there may be more jobs
than GPUs) and, optionally, an allocation-change penalty ``lambda_a``.

The matrices are built directly with numpy/scipy.sparse and solved with HiGHS through
``scipy.optimize.milp``: a modelling layer would cost more than the solve at 2048 GPUs.
"""

from __future__ import annotations

import logging
import math
import time
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sia_slurm.core import Configuration, GoodputRow, JobKind
from sia_slurm.policy.base import (
    Allocation,
    ClusterView,
    JobAllocation,
    JobView,
    PolicyInput,
    SolveInfo,
    allocation_from_row,
    restart_factors,
)
from sia_slurm.policy.configs import configuration_set, shape_for
from sia_slurm.policy.limits import GpuLimit, coupling_rows
from sia_slurm.policy.parameters import SiaPolicyConfig
from sia_slurm.policy.sia_milp import CouplingRows, Program
from sia_slurm.policy.sia_solve import solve

logger = logging.getLogger(__name__)

FIXED_BATCH_KINDS = frozenset({JobKind.STRONG_SCALING, JobKind.RIGID, JobKind.PINNED})


@dataclass(frozen=True)
class JobColumns:
    """One job's candidate configurations, its goodput row and their objective costs."""

    job: JobView
    configs: tuple[Configuration, ...]
    row: GoodputRow
    cost: np.ndarray  # objective coefficient per config; nan where the job may not take it
    forced: bool  # the job must keep configs[current]
    current: int | None  # index of the job's current configuration, if among configs


def gpu_limits(job: JobView, config: SiaPolicyConfig) -> tuple[int, float]:
    """GPU count range an elastic job may take: ``min_gpus`` up to its own limit and the growth
    cap (``first_gpus`` before its first run, then ``growth_factor`` x the most it has run on)."""
    upper = math.inf if job.max_gpus is None else float(job.max_gpus)
    if config.growth_factor is not None:
        seen = job.max_gpus_seen
        cap = config.growth_factor * seen if seen > 0 else float(config.first_gpus)
        upper = min(upper, max(cap, job.min_gpus))
    return job.min_gpus, upper


@dataclass(frozen=True)
class ConfigIndex:
    """The cluster's configuration sets with their GPU counts, built once per round so that
    selecting a job's range is a bisection rather than a scan. Ranges and rigid shapes are
    memoised for the round: jobs with the same limits share one tuple, which lets their goodput
    rows be evaluated together (:func:`evaluate_rows`)."""

    cluster: ClusterView
    sets: dict[str, tuple[Configuration, ...]]
    counts: dict[str, list[int]]
    memo: dict[tuple[object, ...], tuple[Configuration, ...]] = field(default_factory=dict)
    positions: dict[int, dict[Configuration, int]] = field(default_factory=dict)

    @staticmethod
    def of(cluster: ClusterView) -> ConfigIndex:
        sets = configuration_set(cluster)
        counts = {t: [c.gpus for c in configs] for t, configs in sets.items()}
        return ConfigIndex(cluster, sets, counts)

    def between(self, low: float, high: float) -> tuple[Configuration, ...]:
        """Every type's configurations with ``low <= gpus <= high`` (sets are sorted by GPUs)."""
        key = ("range", low, high)
        if key not in self.memo:
            chosen: list[Configuration] = []
            for gpu_type, configs in self.sets.items():
                counts = self.counts[gpu_type]
                chosen.extend(configs[bisect_left(counts, low) : bisect_right(counts, high)])
            self.memo[key] = tuple(chosen)
        return self.memo[key]

    def shapes(self, types: tuple[str, ...], gpus: int) -> tuple[Configuration, ...]:
        """The fewest-nodes shape of ``gpus`` GPUs on each of ``types`` where it fits."""
        key = ("shape", types, gpus)
        if key not in self.memo:
            shapes = [shape_for(self.cluster.types[t], gpus) for t in types]
            self.memo[key] = tuple(shape for shape in shapes if shape is not None)
        return self.memo[key]

    def position(self, configs: tuple[Configuration, ...], config: Configuration) -> int | None:
        """Where ``config`` is in one of this index's tuples, if it is."""
        table = self.positions.get(id(configs))
        if table is None:
            table = self.positions[id(configs)] = {c: i for i, c in enumerate(configs)}
        return table.get(config)


def charged_restarts(job: JobView, config: SiaPolicyConfig) -> int:
    """The restarts Sia's restart factor counts against ``job``: every one (the paper's), or
    only those the controller asked for (``charge_requeues: false``): a job Slurm requeued for
    a node failure or a preemption did not choose that restart, and charging it made the job
    wait or stay put beside GPUs it could use."""
    if config.charge_requeues:
        return job.restarts
    return max(job.restarts - job.requeues, 0)


def job_restart_factors(jobs: Sequence[JobView], config: SiaPolicyConfig) -> np.ndarray:
    """:func:`~sia_slurm.policy.base.restart_factor` of every job, element-wise in one numpy
    pass (thousands of jobs in a large round), with the restarts it is charged."""
    age = np.array([job.age for job in jobs], dtype=np.float64)
    restarts = np.array([charged_restarts(job, config) for job in jobs], dtype=np.float64)
    cost = np.array(
        [
            config.default_restart_cost if job.restart_cost is None else job.restart_cost
            for job in jobs
        ],
        dtype=np.float64,
    )
    return restart_factors(age, restarts, cost)


def candidate_configs(
    job: JobView, cluster: ClusterView, index: ConfigIndex, config: SiaPolicyConfig
) -> tuple[tuple[Configuration, ...], bool, int | None]:
    """The configurations ``job`` may take this round, whether it must keep its current one,
    and the current one's position in the list (``None`` if not running or not a candidate).

    Jobs mid-restore and running pinned jobs are fixed; rigid jobs get one column per type at
    their requested count; adaptive and strong-scaling jobs the type's configuration set within
    their GPU limits. A running job's current configuration is always a candidate (if it still
    fits, and is within the job's ``max_gpus``: the controller lowers that to hold a job whose
    reports it does not believe at its minimum), so staying put is never ruled out by the
    shape of the set. A job limited to some GPU types (``gpu_types``: one still profiling) gets
    only those, its current configuration included.
    """
    current = job.current
    current_ok = current is not None and current.gpu_type in cluster.types
    if current is not None and job.gpu_types is not None:
        current_ok = current_ok and current.gpu_type in job.gpu_types
    if job.restoring or (job.kind is JobKind.PINNED and current is not None):
        return ((current,), True, 0) if current_ok else ((), False, None)  # type: ignore[return-value]
    if job.kind in (JobKind.PINNED, JobKind.RIGID):
        types = cluster.gpu_types
        if job.kind is JobKind.PINNED and job.requested_gpu_type is not None:
            types = tuple(t for t in types if t == job.requested_gpu_type)
        configs = index.shapes(types, job.requested_gpus)
    else:
        low, high = gpu_limits(job, config)
        configs = index.between(low, high)
    if job.gpu_types is not None:
        configs = tuple(c for c in configs if c.gpu_type in job.gpu_types)
    over = current is not None and job.max_gpus is not None and current.gpus > job.max_gpus
    if not current_ok or over:
        return configs, False, None
    position = index.position(configs, current)  # type: ignore[arg-type]
    if position is not None:
        return configs, False, position
    return (*configs, current), False, len(configs)  # type: ignore[return-value]


def evaluate_rows(
    jobs: list[JobView], configs: list[tuple[Configuration, ...]]
) -> list[GoodputRow]:
    """Every job's goodput row. Jobs whose estimator class offers ``evaluate_many(estimators,
    configs, fixed_batch=...)`` and that share a configuration tuple are evaluated in one call
    (one numpy pass instead of one per job: at 12,000 jobs the per-call overhead was the cost);
    the others one by one."""
    rows: list[GoodputRow | None] = [None] * len(jobs)
    groups: dict[tuple[object, int, bool], list[int]] = {}
    for i, (job, row_configs) in enumerate(zip(jobs, configs, strict=True)):
        fixed = job.kind in FIXED_BATCH_KINDS
        many = getattr(type(job.estimator), "evaluate_many", None)
        if many is None:
            rows[i] = job.estimator.evaluate(row_configs, fixed_batch=fixed)
        else:
            groups.setdefault((many, id(row_configs), fixed), []).append(i)
    for (many, _, fixed), members in groups.items():
        estimators = [jobs[i].estimator for i in members]
        batch = many(estimators, configs[members[0]], fixed_batch=fixed)  # type: ignore[operator]
        for i, row in zip(members, batch, strict=True):
            rows[i] = row
    return rows  # type: ignore[return-value]


def column_costs(
    jobs: list[JobView],
    currents: list[int | None],
    rows: list[GoodputRow],
    config: SiaPolicyConfig,
) -> list[np.ndarray]:
    """Objective coefficients of every job's columns (nan: no column), computed for all jobs at
    once; ``currents[i]`` indexes job i's current configuration in its row.

    ``cost = sign(p) * (lambda_n - (r * G)^p) + lambda_a * (1 - 2 * [current])`` is the change in
    the objective when the job takes that column instead of no allocation; negative means the
    column beats leaving the job out. ``G`` is goodput over the row's smallest non-zero goodput.
    """
    lengths = np.array([row.goodput.shape[0] for row in rows], dtype=np.int64)
    starts = np.r_[0, np.cumsum(lengths)[:-1]].astype(np.int64)
    goodput = np.concatenate([row.goodput for row in rows]).astype(np.float64, copy=False)
    owner = np.repeat(np.arange(len(rows)), lengths)
    valid = np.isfinite(goodput) & (goodput > 0)
    smallest = np.minimum.reduceat(np.where(valid, goodput, np.inf), starts)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        normalised = goodput / smallest[owner]
    stay = np.zeros(goodput.size, dtype=bool)
    running = [
        (start + c) for start, c in zip(starts.tolist(), currents, strict=True) if c is not None
    ]
    stay[running] = True
    charged = np.array([c is not None for c in currents], dtype=bool) | config.charge_waiting
    # a job without GPUs restarts whichever it takes: not discounted (unless charge_waiting)
    factor = np.where(charged, job_restart_factors(jobs, config), 1.0)
    normalised = np.where(stay, normalised, normalised * factor[owner])
    if config.max_normalised_goodput is not None:
        normalised = np.minimum(normalised, config.max_normalised_goodput)
    valid &= np.isfinite(normalised) & (normalised > 0)
    with np.errstate(divide="ignore", over="ignore"):
        score = np.power(np.where(valid, normalised, 1.0), config.p)
    sign = math.copysign(1.0, config.p)
    cost = sign * (config.lambda_n - score) + config.lambda_a * np.where(stay, -1.0, 1.0)
    cost[~valid] = np.nan
    ends = starts + lengths
    return [cost[a:b] for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def check_row(job: JobView, configs: Sequence[Configuration], row: GoodputRow) -> None:
    if np.shape(row.goodput) != (len(configs),):
        raise ValueError(
            f"job {job.job_id}: estimator returned {np.shape(row.goodput)} goodputs for "
            f"{len(configs)} configurations"
        )


def build_columns(policy_input: PolicyInput, config: SiaPolicyConfig) -> list[JobColumns]:
    """Score every job: its candidate configurations, goodput row and column costs."""
    cluster = policy_input.cluster
    index = ConfigIndex.of(cluster)
    scored: list[tuple[JobView, tuple[Configuration, ...], bool, int | None]] = []
    for job in policy_input.jobs:
        configs, forced, current = candidate_configs(job, cluster, index, config)
        if configs:
            scored.append((job, configs, forced and current is not None, current))
    if not scored:
        return []
    jobs = [item[0] for item in scored]
    rows = evaluate_rows(jobs, [item[1] for item in scored])
    for (job, configs, _, _), row in zip(scored, rows, strict=True):
        check_row(job, configs, row)
    costs = column_costs(jobs, [item[3] for item in scored], rows, config)
    columns = []
    for (job, configs, forced, current), row, cost in zip(scored, rows, costs, strict=True):
        cost *= policy_input.weight(job.job_id)  # the job's fair share (policy/shares.py)
        if forced and np.isnan(cost[current]):
            cost[current] = 0.0  # kept even if the model predicts nothing there
        columns.append(JobColumns(job, configs, row, cost, forced, current))
    return columns


def release_forced(
    columns: list[JobColumns], cluster: ClusterView, round_index: int
) -> list[JobColumns]:
    """Un-force jobs whose fixed configurations no longer fit their type's capacity (a node went
    down under them): the program would be infeasible otherwise."""
    used: dict[str, int] = {}
    released = []
    for cols in columns:
        if cols.forced:
            chosen = cols.configs[cols.current]  # type: ignore[index]
            total = used.get(chosen.gpu_type, 0) + chosen.gpus
            if total > cluster.types[chosen.gpu_type].capacity:
                logger.warning(
                    "[round=%d job=%s] pinned to %s but %s has only %d usable GPUs; unpinning",
                    round_index,
                    cols.job.job_id,
                    chosen,
                    chosen.gpu_type,
                    cluster.types[chosen.gpu_type].capacity,
                )
                cols = JobColumns(cols.job, cols.configs, cols.row, cols.cost, False, cols.current)
            else:
                used[chosen.gpu_type] = total
        released.append(cols)
    return released


@dataclass(frozen=True)
class Assembled:
    """The round's program plus how to map its columns back to jobs' configurations."""

    program: Program
    owner: np.ndarray  # index into the columns list, per program column
    position: np.ndarray  # index into that job's configs, per program column
    fixed: dict[int, int]  # forced jobs: columns-list index -> config index


def limit_rows(columns: list[JobColumns], limits: tuple[GpuLimit, ...]) -> CouplingRows | None:
    """The site's GPU limits (:mod:`.limits`) as :func:`assemble`'s ``extra`` rows: one per
    limit over every job configuration in ``columns`` order, its capacity less the GPUs that
    forced jobs under it keep."""
    if not limits or not columns:
        return None
    owner = np.repeat(np.arange(len(columns)), [len(cols.configs) for cols in columns])
    gpus = np.array([c.gpus for cols in columns for c in cols.configs], dtype=np.float64)
    types = np.array([c.gpu_type for cols in columns for c in cols.configs], dtype=object)
    forced = {
        i: cols.configs[cols.current]  # type: ignore[index]
        for i, cols in enumerate(columns)
        if cols.forced
    }
    fixed = {i: config.gpus for i, config in forced.items()}
    fixed_types = {i: config.gpu_type for i, config in forced.items()}
    job_ids = [cols.job.job_id for cols in columns]
    rows = coupling_rows(limits, job_ids, owner, gpus, fixed, types, fixed_types)
    return None if rows is None else CouplingRows(rows[0].T.copy(), rows[1])


def assemble(
    columns: list[JobColumns], cluster: ClusterView, extra: CouplingRows | None = None
) -> Assembled:
    """Stack every job's useful columns (negative cost) into one program. Forced jobs take no
    variables: their configuration is fixed and their GPUs leave the capacity. Each distinct
    configuration tuple is turned into arrays once; the rest is concatenation.

    ``extra`` adds shared limits beyond the GPUs per type (e.g. an account's GPUs): its
    ``coupling`` has one column per job configuration, jobs in ``columns`` order and each job's
    in its ``configs`` order (forced jobs' GPUs included: subtract them from ``capacity``)."""
    type_index = {name: i for i, name in enumerate(cluster.gpu_types)}
    capacity = np.array([cluster.types[t].capacity for t in cluster.gpu_types], dtype=float)
    fixed: dict[int, int] = {}
    shapes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    gpus, types = [], []
    for i, cols in enumerate(columns):
        if cols.forced:
            config = cols.configs[cols.current]  # type: ignore[index]
            fixed[i] = cols.current  # type: ignore[assignment]
            capacity[type_index[config.gpu_type]] -= config.gpus
        shape = shapes.get(id(cols.configs))
        if shape is None:
            shape = shapes[id(cols.configs)] = (
                np.array([c.gpus for c in cols.configs], dtype=np.float64),
                np.array([type_index[c.gpu_type] for c in cols.configs], dtype=np.intp),
            )
        gpus.append(shape[0])
        types.append(shape[1])
    if not columns:
        program, _ = Program.build(
            np.zeros(0),
            np.zeros(0),
            np.zeros(0, dtype=np.intp),
            np.zeros(0, dtype=np.intp),
            capacity,
            0,
        )
        return Assembled(program, np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.intp), fixed)
    lengths = np.array([len(cols.configs) for cols in columns])
    owner = np.repeat(np.arange(len(columns)), lengths)
    position = np.arange(owner.size) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    cost = np.concatenate([cols.cost for cols in columns])
    forced = np.array([cols.forced for cols in columns])
    keep = np.flatnonzero((cost < 0) & ~forced[owner])
    program, order = Program.build(
        cost=cost[keep],
        gpus=np.concatenate(gpus)[keep],
        gpu_type=np.concatenate(types)[keep],
        job=owner[keep],
        capacity=capacity,
        n_jobs=len(columns),
        extra=None if extra is None else CouplingRows(extra.coupling[:, keep], extra.capacity),
    )
    return Assembled(program, owner[keep][order], position[keep][order], fixed)


def fallback_choice(columns: list[JobColumns], cluster: ClusterView) -> dict[int, int]:
    """Previous allocation for running jobs (in input order, while capacity lasts)."""
    free = {name: view.capacity for name, view in cluster.types.items()}
    chosen = {}
    for i, cols in enumerate(columns):
        if cols.current is None:
            continue
        config = cols.configs[cols.current]
        if config.gpus <= free[config.gpu_type]:
            free[config.gpu_type] -= config.gpus
            chosen[i] = cols.current
    return chosen


FALLBACKS_PER_JOB = 4


class Fallbacks(Mapping[str, tuple[JobAllocation, ...]]):
    """Per allocated job, the other columns placement may give it when it cannot place the
    chosen one (``repair_placement``), best first: the job's current configuration where it
    runs (no restart), then its GPU type's columns of fewer GPUs that beat no allocation, by
    cost; at most :data:`FALLBACKS_PER_JOB`. Smaller columns of the same type never break a GPU
    limit the chosen one kept. Built per job when asked: placement asks only for the jobs it
    could not place."""

    def __init__(self, chosen: dict[str, tuple[JobColumns, int]]) -> None:
        self._chosen = chosen

    def __getitem__(self, job_id: str) -> tuple[JobAllocation, ...]:
        cols, k = self._chosen[job_id]
        config, cost = cols.configs[k], cols.cost
        order = []
        if cols.current is not None and cols.current != k and np.isfinite(cost[cols.current]):
            order.append(cols.current)
        smaller = [
            i
            for i, other in enumerate(cols.configs)
            if i not in (k, cols.current)
            and other.gpu_type == config.gpu_type
            and other.gpus < config.gpus
            and np.isfinite(cost[i])
            and cost[i] < 0
        ]
        order += sorted(smaller, key=lambda i: (float(cost[i]), i))
        return tuple(
            allocation_from_row(cols.configs[i], cols.row, i) for i in order[:FALLBACKS_PER_JOB]
        )

    def __iter__(self) -> Iterator[str]:
        return iter(self._chosen)

    def __len__(self) -> int:
        return len(self._chosen)


@dataclass(frozen=True)
class SiaPolicy:
    """The Sia policy; see the module docstring."""

    config: SiaPolicyConfig = field(default_factory=SiaPolicyConfig)
    # The objective weighs each job (:func:`sia_slurm.policy.entitlement.weighs_jobs`).
    weighs_jobs = True

    def solve(self, policy_input: PolicyInput) -> Allocation:
        started = time.perf_counter()
        cluster = policy_input.cluster
        columns = release_forced(
            build_columns(policy_input, self.config), cluster, policy_input.round_index
        )
        assembled = assemble(columns, cluster, limit_rows(columns, policy_input.limits))
        result = solve(
            assembled.program,
            self.config.time_limit_s,
            self.config.mip_rel_gap,
            self.config.accept_gap,
        )
        status, message = result.status, result.message
        if result.chosen is None:
            logger.warning(
                "[round=%d] Sia MILP failed (%s); keeping running jobs' allocations",
                policy_input.round_index,
                message,
            )
            choice = fallback_choice(columns, cluster)
        else:
            if status == "time-limit":
                logger.warning(
                    "[round=%d] Sia MILP hit its %.1f s limit; using the incumbent (%s)",
                    policy_input.round_index,
                    self.config.time_limit_s,
                    message,
                )
            chosen = np.flatnonzero(result.chosen)
            choice = dict(assembled.fixed)
            owners = assembled.owner[chosen].tolist()
            choice.update(zip(owners, assembled.position[chosen].tolist(), strict=True))
        jobs: dict[str, JobAllocation] = {}
        for i, k in choice.items():
            cols = columns[i]
            jobs[cols.job.job_id] = allocation_from_row(cols.configs[k], cols.row, k)
        elapsed = time.perf_counter() - started
        logger.debug(
            "[round=%d] Sia: %d jobs, %d variables, %d allocated, %s in %.3f s",
            policy_input.round_index,
            len(columns),
            assembled.program.size,
            len(jobs),
            status,
            elapsed,
        )
        fallbacks: Mapping[str, tuple[JobAllocation, ...]] = {}
        if self.config.repair_placement:
            chosen_columns = {columns[i].job.job_id: (columns[i], k) for i, k in choice.items()}
            fallbacks = Fallbacks(chosen_columns)
        return Allocation(
            jobs=jobs,
            time=policy_input.now,
            round_index=policy_input.round_index,
            info=SolveInfo(status, elapsed, message),
            fallbacks=fallbacks,
        )
