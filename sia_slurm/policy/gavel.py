"""Gavel: heterogeneity-aware but not elastic (reference section 5), as the Sia artifact runs it.

Jobs run at their requested GPU count and batch size. A linear program over ``X[job, type]``
(the fraction of time each job should spend on each type; :mod:`.gavel_lp`) expresses the
objective (hierarchical max-min fairness water-fills: a sequence of them, :mod:`.gavel_fill`),
and a round-based mechanism realises it. Every ``round_duration`` seconds:

1. **Priority.** Each (job, type) pair gets ``X / fraction``, where ``fraction`` is the job's
   credited time on the type over the time credited to every job on that type so far (the
   artifact's rule). A new job is credited half a round on every type, so it starts with a high
   but finite priority; a pair with ``X = 0`` has priority 0.
2. **Work-conserving ranking.** Every pair the job can run on is ranked, highest priority first
   (then larger ``X``, then the cluster's type order and the jobs' order): pairs with ``X = 0``
   come last but still get the GPUs the others leave, so no GPU sits idle while a job that fits
   it waits. A job is scheduled on its first pair whose type still has as many free GPUs as it
   asks for, and each scheduled job is credited a round on that type.
3. **Workers.** With ``workers: any`` (the artifact's, the simulator's default) the scheduled
   jobs get GPUs of their type by count, over any of its nodes (:mod:`.workers`): previous
   GPUs kept when all still free, the rest node by node. With ``workers: even`` (the default:
   what one Slurm job can ask for) a job is scheduled only where its GPUs split evenly over
   free nodes. The node shares travel to placement as binding node hints, the configuration
   is (type, nodes used, GPUs).

Between decisions the previous allocation stands (a job that arrives waits for the next one).
What the mechanism remembers (credited time per job and type, and per type over every job
ever seen) travels in :class:`GavelState`.

Where it departs from the artifact: throughputs are the goodput model's predictions (the
artifact's Gavel reads its simulator's ground truth, slowed by the app's calibration factor),
and the LP is solved by HiGHS's simplex, which picks a vertex among equal optima where the
artifact's ECOS returns an interior (fractional) point (docs/deviations.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np

from sia_slurm.core import Configuration
from sia_slurm.policy.base import (
    Allocation,
    GpuTypeView,
    JobAllocation,
    JobView,
    NodeShare,
    PolicyInput,
    SolveInfo,
    allocation_from_row,
)
from sia_slurm.policy.configs import nodes_needed
from sia_slurm.policy.gavel_lp import solve_lp
from sia_slurm.policy.parameters import GavelPolicyConfig
from sia_slurm.policy.workers import WorkerRequest, assign_workers, even_shares

logger = logging.getLogger(__name__)

NEW_JOB_PRIORITY = 1e9
"""Priority multiplier for a pair whose type has no credited time yet (the artifact's)."""

__all__ = ["GavelPolicy", "GavelPolicyConfig", "GavelState", "requested_shapes", "solve_lp"]


@dataclass(frozen=True)
class GavelState:
    """Seconds credited per live job and type, per type over every job ever seen (finished
    ones included), and when the last decision was made."""

    received: Mapping[str, Mapping[str, float]]
    round_start: float
    type_time: Mapping[str, float] = field(default_factory=dict)


def packed_shape(view: GpuTypeView, gpus: int) -> Configuration | None:
    """Whole nodes first (the shape Gavel prices a job at), or ``None`` when the type has fewer
    usable GPUs than asked: Gavel places by GPU count, so free GPUs anywhere on the type do."""
    if gpus > view.capacity:
        return None
    return Configuration(view.gpu_type, nodes_needed(gpus, view.gpus_per_node), gpus)


def requested_shapes(
    policy_input: PolicyInput,
) -> tuple[list[list[Configuration | None]], np.ndarray]:
    """Per job its packed shape on each type (``None`` where it cannot run) and the throughput
    matrix ``T[job, type]`` in optimizer steps per second at the requested batch."""
    cluster = policy_input.cluster
    shapes = []
    throughput = np.zeros((len(policy_input.jobs), len(cluster.gpu_types)))
    for m, job in enumerate(policy_input.jobs):
        per_type = [packed_shape(cluster.types[t], job.requested_gpus) for t in cluster.gpu_types]
        if job.requested_gpu_type is not None:
            per_type = [s if s and s.gpu_type == job.requested_gpu_type else None for s in per_type]
        if job.gpu_types is not None:
            per_type = [s if s and s.gpu_type in job.gpu_types else None for s in per_type]
        valid = [s for s in per_type if s is not None]
        if valid:
            row = job.estimator.evaluate(valid, fixed_batch=True)
            steps = row.throughput / np.maximum(row.batch_size, 1)
            k = 0
            for j, shape in enumerate(per_type):
                if shape is not None:
                    throughput[m, j] = max(float(steps[k]), 0.0)
                    k += 1
        shapes.append(per_type)
    return shapes, throughput


def credited(
    policy_input: PolicyInput, round_duration: float
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """Credited seconds per live job and type, and per type, with new jobs credited half a
    round on every type (the artifact's start)."""
    previous = policy_input.previous
    state = previous.state if previous is not None else None
    received: dict[str, dict[str, float]] = {}
    type_time = {t: 0.0 for t in policy_input.cluster.gpu_types}
    if isinstance(state, GavelState):
        received = {job: dict(types) for job, types in state.received.items()}
        type_time.update(state.type_time)
    for job in policy_input.jobs:
        if job.job_id not in received:
            received[job.job_id] = {t: round_duration / 2 for t in type_time}
            for t in type_time:
                type_time[t] += round_duration / 2
    live = {job.job_id for job in policy_input.jobs}
    return {job: types for job, types in received.items() if job in live}, type_time


def ranked_pairs(
    policy_input: PolicyInput,
    shapes: list[list[Configuration | None]],
    targets: np.ndarray,
    received: Mapping[str, Mapping[str, float]],
    type_time: Mapping[str, float],
) -> list[tuple[int, int]]:
    """Every (job, type) pair the job can run on, by the artifact's priority, highest first;
    ties by larger ``X``, then type order, then job order."""
    keys = []
    for j, gpu_type in enumerate(policy_input.cluster.gpu_types):
        for m, job in enumerate(policy_input.jobs):
            if shapes[m][j] is None:
                continue
            x = float(targets[m, j])
            total = type_time.get(gpu_type, 0.0)
            fraction = received[job.job_id].get(gpu_type, 0.0) / total if total > 0 else 0.0
            if x <= 0.0:
                priority = 0.0
            elif fraction <= 0.0:
                priority = x * NEW_JOB_PRIORITY
            else:
                priority = x / fraction
            keys.append(((-priority, -x, j, m), m, j))
    return [(m, j) for _, m, j in sorted(keys)]


def schedule(policy_input: PolicyInput, pairs: list[tuple[int, int]]) -> list[WorkerRequest]:
    """Walk the ranked pairs: a job goes on its first type with as many free GPUs as it asks."""
    cluster = policy_input.cluster
    free = {t: cluster.types[t].capacity for t in cluster.gpu_types}
    requests: list[WorkerRequest] = []
    scheduled: set[str] = set()
    for m, j in pairs:
        job, gpu_type = policy_input.jobs[m], cluster.gpu_types[j]
        if job.job_id in scheduled or job.requested_gpus > free[gpu_type]:
            continue
        free[gpu_type] -= job.requested_gpus
        scheduled.add(job.job_id)
        requests.append(
            WorkerRequest(job.job_id, gpu_type, job.requested_gpus, previous(job, gpu_type))
        )
    return requests


def schedule_even(
    policy_input: PolicyInput, pairs: list[tuple[int, int]]
) -> tuple[list[WorkerRequest], dict[str, tuple[NodeShare, ...]]]:
    """The ``even`` rule: a job goes on its first type whose free GPUs split evenly over
    nodes for it (:func:`~.workers.even_shares`), given out as jobs are scheduled."""
    cluster = policy_input.cluster
    free = {node.name: node.usable_gpus for node in cluster.nodes}
    nodes = {t: [n.name for n in cluster.nodes if n.gpu_type == t] for t in cluster.gpu_types}
    requests: list[WorkerRequest] = []
    hints: dict[str, tuple[NodeShare, ...]] = {}
    for m, j in pairs:
        job, gpu_type = policy_input.jobs[m], cluster.gpu_types[j]
        if job.job_id in hints:
            continue
        shares = even_shares(free, nodes[gpu_type], job.requested_gpus, previous(job, gpu_type))
        if shares is None:
            continue
        for share in shares:
            free[share.node] -= share.gpus
        hints[job.job_id] = shares
        requests.append(WorkerRequest(job.job_id, gpu_type, job.requested_gpus))
    return requests, hints


def job_groups(policy_input: PolicyInput) -> list[np.ndarray]:
    """The hierarchy's labels per depth (account, then user) for the round's jobs; a job the
    input gives no groups is a group of its own at every depth."""
    jobs = policy_input.jobs
    depth = max((len(policy_input.groups.get(job.job_id, ())) for job in jobs), default=0)
    labels = []
    for k in range(depth):
        row = []
        for job in jobs:
            path = policy_input.groups.get(job.job_id, ())
            row.append(f"{k}:{path[k]}" if k < len(path) else f"job:{job.job_id}")
        labels.append(np.array(row, dtype=object))
    return labels


def previous(job: JobView, gpu_type: str) -> tuple[NodeShare, ...]:
    """The job's current node shares if they are on ``gpu_type``."""
    return job.placement if job.current is not None and job.current.gpu_type == gpu_type else ()


@dataclass(frozen=True)
class GavelPolicy:
    config: GavelPolicyConfig = field(default_factory=GavelPolicyConfig)

    @property
    def weighs_jobs(self) -> bool:
        """Only the hierarchical ``max_min_fairness`` reads the weights (:mod:`.gavel_lp`)."""
        return self.config.objective == "max_min_fairness"

    def solve(self, policy_input: PolicyInput) -> Allocation:
        started = time.perf_counter()
        received, type_time = credited(policy_input, self.config.round_duration)
        previous = policy_input.previous
        state = previous.state if previous is not None else None
        if isinstance(state, GavelState) and (
            policy_input.now - state.round_start < self.config.round_duration
        ):
            return self.keep(policy_input, GavelState(received, state.round_start, type_time))
        cluster = policy_input.cluster
        shapes, throughput = requested_shapes(policy_input)
        gpus = np.array([job.requested_gpus for job in policy_input.jobs], dtype=float)
        capacity = np.array([cluster.types[t].capacity for t in cluster.gpu_types], dtype=float)
        weights = np.array([policy_input.weight(job.job_id) for job in policy_input.jobs])
        targets = solve_lp(
            throughput,
            gpus,
            capacity,
            self.config.objective,
            weights,
            self.config.water_filling,
            job_groups(policy_input),
        )
        pairs = ranked_pairs(policy_input, shapes, targets, received, type_time)
        if self.config.workers == "any":
            requests = schedule(policy_input, pairs)
            hints = assign_workers(cluster, requests)
        else:
            requests, hints = schedule_even(policy_input, pairs)
        for request in requests:
            received[request.job_id][request.gpu_type] += self.config.round_duration
            type_time[request.gpu_type] += self.config.round_duration
        views = {job.job_id: job for job in policy_input.jobs}
        jobs: dict[str, JobAllocation] = {}
        for request in requests:
            shares = hints[request.job_id]
            config = Configuration(request.gpu_type, len(shares), request.gpus)
            row = views[request.job_id].estimator.evaluate([config], fixed_batch=True)
            jobs[request.job_id] = allocation_from_row(config, row, 0)
        return self.allocation(
            policy_input,
            jobs,
            GavelState(received, policy_input.now, type_time),
            started,
            hints=hints,
        )

    def keep(self, policy_input: PolicyInput, state: GavelState) -> Allocation:
        """Mid-round: the previous allocation (and its nodes) stands for the jobs still present."""
        started = time.perf_counter()
        live = {job.job_id for job in policy_input.jobs}
        previous = policy_input.previous
        assert previous is not None
        jobs = {job_id: share for job_id, share in previous.jobs.items() if job_id in live}
        hints = {job_id: h for job_id, h in previous.node_hints.items() if job_id in live}
        return self.allocation(policy_input, jobs, state, started, "kept", hints)

    def allocation(
        self,
        policy_input: PolicyInput,
        jobs: dict[str, JobAllocation],
        state: GavelState,
        started: float,
        status: str = "optimal",
        hints: Mapping[str, tuple[NodeShare, ...]] | None = None,
    ) -> Allocation:
        frozen = GavelState(
            MappingProxyType({job: MappingProxyType(t) for job, t in state.received.items()}),
            state.round_start,
            MappingProxyType(dict(state.type_time)),
        )
        return Allocation(
            jobs=jobs,
            time=policy_input.now,
            round_index=policy_input.round_index,
            state=frozen,
            info=SolveInfo(status, time.perf_counter() - started),
            node_hints=hints or {},
            hints_move_jobs=True,
        )
