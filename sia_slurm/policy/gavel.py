"""Gavel: heterogeneity-aware but not elastic (reference section 5).

Jobs run at their requested GPU count and batch size. A linear program over ``X[job, type]``
(fraction of time each job should spend on each type) expresses the objective, and a round-based
mechanism realises it: every ``round_duration`` seconds jobs are ranked by
``priority = X[job, type] / fraction of its time received on that type`` and started greedily,
one type per job, keeping a job on its previous type when priorities tie; a job starts only if
its shape fits on the type's nodes (:class:`~sia_slurm.policy.ledger.NodeLedger`). Between
rounds the previous allocation stands. The time each job received per type is the policy's
explicit state.

Objectives (throughputs are normalised per job by its throughput under an equal time share of
every type it can use, so the job's units and its GPU count cancel):

- ``max_min_fairness``: maximise ``min_m sum_j T_mj X_mj / T_m(X_equal)``;
- ``max_total_throughput``: maximise ``sum_m sum_j T_mj X_mj / T_m(X_equal)``;

subject to ``X >= 0``, ``sum_j X_mj <= 1`` and ``sum_m gpus_m X_mj <= GPUs_j``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from sia_slurm.core import Configuration
from sia_slurm.policy.base import (
    Allocation,
    JobAllocation,
    PolicyInput,
    SolveInfo,
    allocation_from_row,
)
from sia_slurm.policy.configs import shape_for
from sia_slurm.policy.ledger import NodeLedger
from sia_slurm.policy.settings import GavelPolicyConfig

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GavelState:
    """Seconds each job has run on each GPU type, and when the last round started."""

    received: Mapping[str, Mapping[str, float]]
    round_start: float


def updated_received(policy_input: PolicyInput) -> dict[str, dict[str, float]]:
    """Time received per job and type, including the round that just ended."""
    previous = policy_input.previous
    state = previous.state if previous is not None else None
    received: dict[str, dict[str, float]] = {}
    if isinstance(state, GavelState):
        received = {job: dict(types) for job, types in state.received.items()}
    if previous is not None:
        elapsed = max(policy_input.now - previous.time, 0.0)
        for job_id, share in previous.jobs.items():
            per_type = received.setdefault(job_id, {})
            gpu_type = share.config.gpu_type
            per_type[gpu_type] = per_type.get(gpu_type, 0.0) + elapsed
    live = {job.job_id for job in policy_input.jobs}
    return {job: types for job, types in received.items() if job in live}


def requested_shapes(
    policy_input: PolicyInput,
) -> tuple[list[list[Configuration | None]], np.ndarray, list]:
    """Per job its requested shape on each type, throughput matrix T[job, type], and rows."""
    cluster = policy_input.cluster
    shapes, rows = [], []
    throughput = np.zeros((len(policy_input.jobs), len(cluster.gpu_types)))
    for m, job in enumerate(policy_input.jobs):
        per_type = [shape_for(cluster.types[t], job.requested_gpus) for t in cluster.gpu_types]
        if job.requested_gpu_type is not None:
            per_type = [s if s and s.gpu_type == job.requested_gpu_type else None for s in per_type]
        valid = [s for s in per_type if s is not None]
        row = job.estimator.evaluate(valid, fixed_batch=True) if valid else None
        k = 0
        for j, shape in enumerate(per_type):
            if shape is not None:
                throughput[m, j] = max(float(row.throughput[k]), 0.0)  # type: ignore[union-attr]
                k += 1
        shapes.append(per_type)
        rows.append(row)
    return shapes, throughput, rows


def solve_lp(
    throughput: np.ndarray, gpus: np.ndarray, capacity: np.ndarray, objective: str
) -> np.ndarray:
    """The optimal X[job, type] (zeros where the LP fails, logged)."""
    n_jobs, n_types = throughput.shape
    feasible = throughput > 0
    runnable = feasible.any(axis=1)
    share = min(1.0, capacity.sum() / max(gpus[runnable].sum(), 1.0))
    equal = np.where(feasible, share / np.maximum(feasible.sum(axis=1, keepdims=True), 1), 0.0)
    reference = (throughput * equal).sum(axis=1)
    normalised = np.where(
        runnable[:, None], throughput / np.maximum(reference, 1e-12)[:, None], 0.0
    )
    n_x = n_jobs * n_types
    owner = np.repeat(np.arange(n_jobs), n_types)
    column = np.arange(n_x)
    job_rows = sparse.csr_array((np.ones(n_x), (owner, column)), shape=(n_jobs, n_x))
    type_rows = sparse.csr_array(
        (np.repeat(gpus, n_types), (np.tile(np.arange(n_types), n_jobs), column)),
        shape=(n_types, n_x),
    )
    bounds = [(0.0, 1.0 if f else 0.0) for f in feasible.ravel()]
    if objective == "max_total_throughput":
        a_ub = sparse.vstack([job_rows, type_rows])
        b_ub = np.r_[np.ones(n_jobs), capacity]
        cost = -normalised.ravel()
    else:  # max-min: variables X then t; t <= normalised throughput of every runnable job
        fair_rows = sparse.csr_array((-normalised.ravel(), (owner, column)), shape=(n_jobs, n_x))
        a_ub = sparse.vstack(
            [
                sparse.hstack([fair_rows, runnable.astype(float)[:, None]]),
                sparse.hstack([job_rows, sparse.csr_array((n_jobs, 1))]),
                sparse.hstack([type_rows, sparse.csr_array((n_types, 1))]),
            ]
        )
        b_ub = np.r_[np.zeros(n_jobs), np.ones(n_jobs), capacity]
        cost = np.r_[np.zeros(n_x), -1.0]
        bounds.append((0.0, None))
    result = linprog(cost, A_ub=sparse.csr_array(a_ub), b_ub=b_ub, bounds=bounds, method="highs")
    if result.x is None:
        logger.warning("Gavel LP failed (%s); no job gets a target share", result.message)
        return np.zeros((n_jobs, n_types))
    return result.x[:n_x].reshape(n_jobs, n_types)


def priority_order(
    policy_input: PolicyInput, targets: np.ndarray, received: Mapping[str, Mapping[str, float]]
) -> list[tuple[int, int]]:
    """(job, type) pairs by Gavel's priority ``X / fraction of time received``, highest first;
    ties prefer the job's previous type, then larger X."""
    cluster = policy_input.cluster
    pairs = []
    for m, job in enumerate(policy_input.jobs):
        got = received.get(job.job_id, {})
        for j, gpu_type in enumerate(cluster.gpu_types):
            if targets[m, j] <= 1e-9:
                continue
            fraction = got.get(gpu_type, 0.0) / max(job.age, 1e-9)
            priority = math.inf if fraction <= 0 else targets[m, j] / fraction
            was_here = job.current is not None and job.current.gpu_type == gpu_type
            pairs.append(((-priority, not was_here, -targets[m, j], job.job_id), m, j))
    return [(m, j) for _, m, j in sorted(pairs)]


@dataclass(frozen=True)
class GavelPolicy:
    config: GavelPolicyConfig = field(default_factory=GavelPolicyConfig)

    def solve(self, policy_input: PolicyInput) -> Allocation:
        started = time.perf_counter()
        received = updated_received(policy_input)
        previous = policy_input.previous
        state = previous.state if previous is not None else None
        if isinstance(state, GavelState) and (
            policy_input.now - state.round_start < self.config.round_duration
        ):
            return self.keep(policy_input, received, state.round_start, started)
        cluster = policy_input.cluster
        shapes, throughput, rows = requested_shapes(policy_input)
        gpus = np.array([job.requested_gpus for job in policy_input.jobs], dtype=float)
        capacity = np.array([cluster.types[t].capacity for t in cluster.gpu_types], dtype=float)
        targets = (
            solve_lp(throughput, gpus, capacity, self.config.objective)
            if policy_input.jobs
            else np.zeros((0, len(capacity)))
        )
        ledger = NodeLedger(cluster)
        jobs: dict[str, JobAllocation] = {}
        for m, j in priority_order(policy_input, targets, received):
            job = policy_input.jobs[m]
            shape = shapes[m][j]
            if job.job_id in jobs or shape is None or ledger.take(shape, job.placement) is None:
                continue
            index = sum(s is not None for s in shapes[m][:j])
            jobs[job.job_id] = allocation_from_row(shape, rows[m], index)
        return self.allocation(policy_input, jobs, received, policy_input.now, started)

    def keep(
        self,
        policy_input: PolicyInput,
        received: dict[str, dict[str, float]],
        round_start: float,
        started: float,
    ) -> Allocation:
        """Mid-round: the previous allocation stands for the jobs still present."""
        live = {job.job_id for job in policy_input.jobs}
        previous = policy_input.previous
        assert previous is not None
        jobs = {job_id: share for job_id, share in previous.jobs.items() if job_id in live}
        return self.allocation(policy_input, jobs, received, round_start, started, "kept")

    def allocation(
        self,
        policy_input: PolicyInput,
        jobs: dict[str, JobAllocation],
        received: dict[str, dict[str, float]],
        round_start: float,
        started: float,
        status: str = "optimal",
    ) -> Allocation:
        frozen = {job: MappingProxyType(types) for job, types in received.items()}
        return Allocation(
            jobs=jobs,
            time=policy_input.now,
            round_index=policy_input.round_index,
            state=GavelState(MappingProxyType(frozen), round_start),
            info=SolveInfo(status, time.perf_counter() - started),
        )
