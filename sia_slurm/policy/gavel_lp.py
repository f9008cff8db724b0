"""Gavel's linear programs: the time share ``X[job, type]`` each job should get on each type.

``T[job, type]`` is a job's throughput at its requested size and batch in optimizer steps per
second (0 where it cannot run). Every objective shares the constraints ``X >= 0``,
``sum_type X <= 1`` per job and ``sum_job gpus_job X <= GPUs_type`` per type:

- ``max_sum_throughput``: maximise ``sum T X``, the raw throughputs with no per-job
  normalisation. This is the objective the Sia artifact runs Gavel with for Sia's evaluation
  (its ``max_sum_throughput_perf``, whose throughput is ``1 / iteration time``), so it is our
  ``gavel`` baseline's default;
- ``max_min_fairness``: maximise ``min_job sum_type T X / (w T_ref)``, Gavel's paper default,
  with ``T_ref`` the job's throughput under an equal time share of every type it can run on, so
  each job's units and GPU count cancel, and ``w`` the job's weight: Gavel's hierarchical
  policy (fairness across accounts, then users, then jobs; weights from
  :mod:`sia_slurm.policy.shares`, 1 for everyone without shares). Gavel's own hierarchical
  policy water-fills (re-solves for the jobs the first LP did not bottleneck); this is its
  first LP, the weighted max-min;
- ``max_total_throughput``: maximise ``sum T X / T_ref``, the normalised sum.

Equal optima: jobs with the same GPU count and throughputs are interchangeable, so the optimal
``X`` is not unique. HiGHS's simplex returns a vertex (some of them get 1, others 0); the artifact's
ECOS, an interior-point solver, returns the centre of the optimal face, where interchangeable jobs
get equal shares, and its mechanism then rotates them. :func:`solve_lp` gives the centre's shares
for such jobs by averaging the vertex's ``X`` over each group (still optimal and feasible: the
average of permuted optima). On Helios workload-1 a vertex makes Gavel's average JCT 7% lower
than these shares (docs/simulator.md).

The artifact rounds the solver's ``X`` to 5 decimals; so does :func:`solve_lp`, so that the
solver's round-off never gives a job a priority on a type it should not use.
"""

from __future__ import annotations

import logging

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

logger = logging.getLogger(__name__)

DECIMALS = 5


def normalised(throughput: np.ndarray, gpus: np.ndarray, capacity: np.ndarray) -> np.ndarray:
    """``T / T_ref``: each job's throughput relative to an equal time share of its types."""
    feasible = throughput > 0
    runnable = feasible.any(axis=1)
    share = min(1.0, capacity.sum() / max(gpus[runnable].sum(), 1.0))
    equal = np.where(feasible, share / np.maximum(feasible.sum(axis=1, keepdims=True), 1), 0.0)
    reference = (throughput * equal).sum(axis=1)
    return np.where(runnable[:, None], throughput / np.maximum(reference, 1e-12)[:, None], 0.0)


def solve_lp(
    throughput: np.ndarray,
    gpus: np.ndarray,
    capacity: np.ndarray,
    objective: str,
    weights: np.ndarray | None = None,
) -> np.ndarray:
    """The optimal ``X[job, type]`` for ``objective`` (zeros where the LP fails, logged).
    ``weights`` (per job, > 0; default all 1) weigh ``max_min_fairness`` only: the other two
    objectives have no hierarchy in Gavel."""
    n_jobs, n_types = throughput.shape
    if n_jobs == 0:
        return np.zeros((0, n_types))
    if weights is None or objective != "max_min_fairness":
        weights = np.ones(n_jobs)
    feasible = throughput > 0
    runnable = feasible.any(axis=1)
    n_x = n_jobs * n_types
    owner = np.repeat(np.arange(n_jobs), n_types)
    column = np.arange(n_x)
    job_rows = sparse.csr_array((np.ones(n_x), (owner, column)), shape=(n_jobs, n_x))
    type_rows = sparse.csr_array(
        (np.repeat(gpus, n_types), (np.tile(np.arange(n_types), n_jobs), column)),
        shape=(n_types, n_x),
    )
    bounds = [(0.0, 1.0 if f else 0.0) for f in feasible.ravel()]
    if objective == "max_sum_throughput":
        a_ub = sparse.vstack([job_rows, type_rows])
        b_ub = np.r_[np.ones(n_jobs), capacity]
        cost = -throughput.ravel()
    elif objective == "max_total_throughput":
        a_ub = sparse.vstack([job_rows, type_rows])
        b_ub = np.r_[np.ones(n_jobs), capacity]
        cost = -normalised(throughput, gpus, capacity).ravel()
    else:  # max-min: variables X then t; t <= normalised throughput of every runnable job
        scaled = (normalised(throughput, gpus, capacity) / weights[:, None]).ravel()
        fair_rows = sparse.csr_array((-scaled, (owner, column)), shape=(n_jobs, n_x))
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
    x = share_ties(result.x[:n_x].reshape(n_jobs, n_types), throughput, gpus, weights)
    return np.clip(np.round(x, DECIMALS), 0.0, 1.0)


def share_ties(
    x: np.ndarray, throughput: np.ndarray, gpus: np.ndarray, weights: np.ndarray | None = None
) -> np.ndarray:
    """``x`` averaged over each group of jobs with the same GPU count, throughputs and weight
    (equal to a relative 1e-9), as an interior-point solution would share them."""
    weights = np.ones(len(gpus)) if weights is None else weights
    values = np.column_stack([gpus, weights, throughput])
    keys = np.where(values > 0, np.round(np.log(np.maximum(values, 1e-300)), 9), -np.inf)
    _, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.reshape(-1)
    sums = np.zeros((group.max() + 1, x.shape[1]))
    np.add.at(sums, group, x)
    counts = np.bincount(group)[:, None]
    return sums[group] / counts[group]
