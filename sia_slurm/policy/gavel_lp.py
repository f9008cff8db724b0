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
  :mod:`sia_slurm.policy.shares`, 1 for everyone without shares). By default it water-fills
  as Gavel's hierarchical policy does (:mod:`.gavel_fill`): the jobs the max-min LP
  bottlenecks are frozen at their level and the LP is solved again to raise the others, until
  every job is frozen. ``water_filling=False`` keeps only the first LP (the weighted max-min),
  for comparison;
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
from collections.abc import Sequence

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from sia_slurm.policy.gavel_fill import FillProgram, first_lp, water_fill

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
    water_filling: bool = True,
    groups: Sequence[np.ndarray] = (),
) -> np.ndarray:
    """The optimal ``X[job, type]`` for ``objective`` (zeros where the LP fails, logged).
    ``weights`` (per job, > 0; default all 1) weigh ``max_min_fairness`` only: the other two
    objectives have no hierarchy in Gavel. ``water_filling`` (``max_min_fairness`` only):
    Gavel's water-filled hierarchy (default) or its first LP alone; ``groups`` (labels per
    job, outermost first) are the hierarchy the water-filling passes frozen jobs' weights in."""
    n_jobs, n_types = throughput.shape
    if n_jobs == 0:
        return np.zeros((0, n_types))
    if weights is None or objective != "max_min_fairness":
        weights = np.ones(n_jobs)
    runnable = (throughput > 0).any(axis=1)
    if objective == "max_min_fairness":
        program = fill_program(throughput, gpus, capacity)
        if water_filling:
            filled = water_fill(program, weights, runnable, groups)
            x = None if filled is None else filled.x
        else:
            x = first_lp(program, weights, runnable)
    else:
        x = throughput_lp(throughput, gpus, capacity, objective)
    if x is None:
        logger.warning("Gavel LP failed; no job gets a target share")
        return np.zeros((n_jobs, n_types))
    x = x[: n_jobs * n_types].reshape(n_jobs, n_types)
    x = share_ties(x, throughput, gpus, weights, groups if water_filling else ())
    return np.clip(np.round(x, DECIMALS), 0.0, 1.0)


def shared_rows(
    throughput: np.ndarray, gpus: np.ndarray, capacity: np.ndarray
) -> tuple[sparse.csr_array, np.ndarray, list[tuple[float, float]]]:
    """Every objective's constraints over the flattened ``X``: rows ``sum_type X <= 1`` per job,
    then ``sum_job gpus X <= GPUs`` per type, their right-hand sides, and the bounds (0 where a
    job cannot run on a type)."""
    n_jobs, n_types = throughput.shape
    n_x = n_jobs * n_types
    owner = np.repeat(np.arange(n_jobs), n_types)
    column = np.arange(n_x)
    job_rows = sparse.csr_array((np.ones(n_x), (owner, column)), shape=(n_jobs, n_x))
    type_rows = sparse.csr_array(
        (np.repeat(gpus, n_types), (np.tile(np.arange(n_types), n_jobs), column)),
        shape=(n_types, n_x),
    )
    bounds = [(0.0, 1.0 if f else 0.0) for f in (throughput > 0).ravel()]
    a_ub = sparse.csr_array(sparse.vstack([job_rows, type_rows]))
    return a_ub, np.r_[np.ones(n_jobs), capacity], bounds


def fill_program(throughput: np.ndarray, gpus: np.ndarray, capacity: np.ndarray) -> FillProgram:
    """The max-min programs' common part: the shared rows and ``N = sum_type T X / T_ref``."""
    n_jobs, n_types = throughput.shape
    a_ub, b_ub, bounds = shared_rows(throughput, gpus, capacity)
    owner = np.repeat(np.arange(n_jobs), n_types)
    rows = sparse.csr_array(
        (normalised(throughput, gpus, capacity).ravel(), (owner, np.arange(n_jobs * n_types))),
        shape=(n_jobs, n_jobs * n_types),
    )
    return FillProgram(rows, a_ub, b_ub, bounds)


def throughput_lp(
    throughput: np.ndarray, gpus: np.ndarray, capacity: np.ndarray, objective: str
) -> np.ndarray | None:
    """``max_sum_throughput`` (raw ``T``) or ``max_total_throughput`` (``T / T_ref``)."""
    a_ub, b_ub, bounds = shared_rows(throughput, gpus, capacity)
    if objective == "max_sum_throughput":
        cost = -throughput.ravel()
    else:
        cost = -normalised(throughput, gpus, capacity).ravel()
    result = linprog(cost, A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    if result.x is None:
        logger.warning("Gavel %s LP failed (%s)", objective, result.message)
    return result.x


def share_ties(
    x: np.ndarray,
    throughput: np.ndarray,
    gpus: np.ndarray,
    weights: np.ndarray | None = None,
    groups: Sequence[np.ndarray] = (),
) -> np.ndarray:
    """``x`` averaged over each group of jobs with the same GPU count, throughputs and weight
    (equal to a relative 1e-9) and the same place in ``groups`` (the water-filling passes
    weights down within them, so jobs of different users are not interchangeable), as an
    interior-point solution would share them."""
    weights = np.ones(len(gpus)) if weights is None else weights
    values = np.column_stack([gpus, weights, throughput])
    keys = np.where(values > 0, np.round(np.log(np.maximum(values, 1e-300)), 9), -np.inf)
    for labels in groups:
        codes = np.unique(np.asarray(labels), return_inverse=True)[1].reshape(-1)
        keys = np.column_stack([keys, codes.astype(float)])
    _, group = np.unique(keys, axis=0, return_inverse=True)
    group = group.reshape(-1)
    sums = np.zeros((group.max() + 1, x.shape[1]))
    np.add.at(sums, group, x)
    counts = np.bincount(group)[:, None]
    return sums[group] / counts[group]
