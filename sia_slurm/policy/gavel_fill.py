"""Gavel's hierarchical max-min fairness by water-filling (Gavel, OSDI'20, section 4.3).

Why more than one LP: the weighted max-min LP (:func:`sia_slurm.policy.gavel_lp.solve_lp`'s
first program) only fixes the *lowest* weighted level ``min_m N_m / w_m``, where ``N_m`` is job
``m``'s throughput share normalised by its equal-share throughput (``sum_j T X / T_ref``). Every
job above that minimum gets whatever vertex the solver stops at: a job bottlenecked on a type
only it can use holds the whole cluster's level down, and the capacity the others could still
use is left out of ``X`` (the round-based mechanism then hands it out by priority order, not by
share). Gavel's hierarchical policy water-fills instead:

1. solve the max-min LP over the jobs not yet frozen, the frozen ones held at their levels;
2. find the *bottlenecked* jobs: those whose level cannot rise above the new minimum unless
   another job's falls below its own; freeze them there;
3. repeat with the others until every job is frozen.

The result is the weighted max-min fair (leximin) allocation: no job's weighted level can rise
without lowering that of a job at or below it. Every round freezes at least one job, so there
are at most as many rounds as jobs, in practice as many as distinct levels.

Finding the bottlenecked jobs: Gavel solves a MILP that maximises the number of jobs that can
rise. Here a plain LP does: over the candidate jobs ``U`` (those at the minimum), maximise
``sum_u s_u`` with ``N_u >= level_u + s_u``, ``0 <= s_u <= cap``, every other job at its level.
A job with ``s_u`` clearly above 0 can rise and leaves ``U``; when the LP finds no such job,
none of ``U`` can rise on its own either (an LP optimum of 0 proves it), so ``U`` is the
bottlenecked set. The small cap spreads the rise over many jobs (the optimum puts as many at
the cap as the capacity allows), so one or two such LPs usually settle a round. Convexity makes
this the MILP's answer: jobs that can each rise alone can all rise together (average the
solutions).

Levels are kept in normalised throughput (``N_m >= base_m + w_m * delta``), the form of
Gavel's own implementation: ``base_m`` is what the job was guaranteed so far, ``delta`` the
round's rise of the common weighted level.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

logger = logging.getLogger(__name__)

MARGIN = 1e-9
"""Each round's rise of the common level is taken this much (relative to ``1 + delta``) below
the LP's optimum, so the ``X`` it found keeps every level with room to spare and the next LPs
can hold levels exactly. Why not a slack on the rows instead: the bottleneck LP pools every
job's slack into the one candidate that can take it (a 1-GPU job takes what a hundred 8-GPU
jobs each give up), and with a slack of 1e-6 every job of a 120-job cluster "rose" by 0.1%."""

SLACK = 1e-7
"""Only when an LP with exact levels fails (round-off): the levels it is retried with, lowered
by this much (relative to ``1 + level``; HiGHS's feasibility tolerance)."""

RISE = 1e-5
"""A job has shown it can rise when the bottleneck LP raises it by this much (relative to
``1 + level``), well above what :data:`MARGIN` pooled over every job gives. The LP maximises
the *sum* of rises and may spread it thinly, so the test is per job against this floor: the
search stops when no candidate rises by it, so a frozen job could have risen by at most
``RISE`` times the number of candidates."""

DUAL = 1e-6
"""A max-min row's dual (times the job's weight; they sum to 1) above this proves the job
bottlenecked; below it the bottleneck LP decides."""

CAP = 1e-2
"""The most each candidate may rise in the bottleneck LP (relative to ``1 + level``)."""


@dataclass(frozen=True)
class WaterFill:
    """The water-filled ``X[job, type]``, each job's final normalised throughput ``N`` (0 for
    jobs that cannot run), and how many rounds and LPs it took."""

    x: np.ndarray
    levels: np.ndarray
    rounds: int
    solves: int


@dataclass(frozen=True)
class FillProgram:
    """What every LP of the water-filling shares: ``X``'s bounds, the rows ``sum_type X <= 1``
    per job and ``sum_job gpus X <= GPUs`` per type (``a_base``, ``b_base``), and
    ``normalised_rows`` whose row ``m`` is ``N_m`` as a function of ``X``."""

    normalised_rows: sparse.csr_array
    a_base: sparse.csr_array
    b_base: np.ndarray
    bounds: list[tuple[float, float]]

    @property
    def n_x(self) -> int:
        return self.normalised_rows.shape[1]


def water_fill(program: FillProgram, weights: np.ndarray, runnable: np.ndarray) -> WaterFill | None:
    """Water-fill ``program`` with per-job ``weights`` (> 0) over the ``runnable`` jobs.
    ``None`` when the first LP fails (logged); when a later one does, the last ``X``, which
    keeps every level frozen so far, so the result is never worse than the first LP's."""
    n_jobs = len(weights)
    base = np.zeros(n_jobs)  # guaranteed normalised throughput so far
    active = runnable.copy()
    x: np.ndarray | None = None
    rounds = solves = 0
    while active.any() and rounds < n_jobs:
        rounds += 1
        raised = _raise_minimum(program, weights, base, active, runnable)
        solves += 1
        if raised is None:
            break
        x = raised.x
        base = np.where(active, base + weights * raised.delta, base)
        bottlenecked, used = _bottlenecked(program, base, active, runnable, raised)
        solves += used
        if bottlenecked is None:
            break
        if not bottlenecked.any():  # only numerical noise can say no job is stuck: stop here
            logger.debug("water-filling: no bottlenecked job in round %d; all frozen", rounds)
            break
        active = active & ~bottlenecked
    if x is None:
        return None
    if active.any():  # an LP failed (logged) or noise: x keeps every level reached so far
        logger.debug(
            "water-filling stopped after %d rounds, %d jobs unfrozen", rounds, active.sum()
        )
    levels = np.where(runnable, program.normalised_rows @ x, 0.0)
    logger.debug("water-filling: %d rounds, %d LPs", rounds, solves)
    return WaterFill(x, levels, rounds, solves)


def first_lp(program: FillProgram, weights: np.ndarray, runnable: np.ndarray) -> np.ndarray | None:
    """Gavel's first LP alone (the weighted max-min, no freezing): ``X``, or ``None``."""
    raised = _raise_minimum(program, weights, np.zeros(len(weights)), runnable, runnable)
    return None if raised is None else raised.x


@dataclass(frozen=True)
class _Raised:
    """One max-min LP: ``X``, the rise ``delta`` of the common weighted level, and the jobs
    its dual proves bottlenecked."""

    x: np.ndarray
    delta: float
    proven: np.ndarray


def _solve(
    program: FillProgram,
    extra: sparse.csr_array,
    lower: np.ndarray,
    rows: np.ndarray,
    extra_bounds: list[tuple[float | None, float | None]],
    extra_cost: np.ndarray,
) -> tuple[np.ndarray, np.ndarray] | None:
    """Minimise ``extra_cost . e`` over ``(X, e)`` with ``N_m - extra[m] . e >= lower_m`` for
    the jobs in ``rows`` and the shared constraints: the solution and the duals of those level
    rows (<= 0), or ``None`` (logged). An infeasible LP (round-off on a level the last LP
    reached) is retried with :data:`SLACK`."""
    k = extra.shape[1]
    level_rows = sparse.hstack([-program.normalised_rows[rows], extra[rows]])
    base_rows = sparse.hstack([program.a_base, sparse.csr_array((program.a_base.shape[0], k))])
    a_ub = sparse.csr_array(sparse.vstack([level_rows, base_rows]))
    for attempt in (lower, lower - SLACK * (1.0 + np.abs(lower))):
        result = linprog(
            np.r_[np.zeros(program.n_x), extra_cost],
            A_ub=a_ub,
            b_ub=np.r_[-attempt[rows], program.b_base],
            bounds=[*program.bounds, *extra_bounds],
            method="highs",
        )
        if result.x is not None:
            duals = np.zeros(len(lower))
            duals[rows] = result.ineqlin.marginals[: int(rows.sum())]
            return result.x, duals
    logger.warning("water-filling LP failed (%s)", result.message)
    return None


def _raise_minimum(
    program: FillProgram,
    weights: np.ndarray,
    base: np.ndarray,
    active: np.ndarray,
    runnable: np.ndarray,
) -> _Raised | None:
    """Step 1: the largest ``delta`` with ``N_m >= base_m + w_m delta`` for the active jobs and
    ``N_m >= base_m`` for the frozen ones (``delta`` is free, so the LP is feasible whenever
    the frozen levels are). An active job whose row has a nonzero dual is bottlenecked: by
    complementary slackness its row is tight in *every* optimum, so it cannot rise while the
    others keep the new level."""
    extra = sparse.csr_array(np.where(active, weights, 0.0)[:, None])
    solved = _solve(program, extra, base, runnable, [(None, None)], np.array([-1.0]))
    if solved is None:
        return None
    solution, duals = solved
    delta = float(solution[-1])
    # the duals of the active rows sum to 1 over w: one at 1e-6 is no round-off
    proven = active & (duals * weights < -DUAL)
    return _Raised(solution[: program.n_x], max(delta - MARGIN * (1.0 + abs(delta)), 0.0), proven)


def _bottlenecked(
    program: FillProgram,
    base: np.ndarray,
    active: np.ndarray,
    runnable: np.ndarray,
    raised: _Raised,
) -> tuple[np.ndarray | None, int]:
    """Step 2: the active jobs that cannot rise above ``base`` while every other job keeps its
    level, and the number of LPs it took. The dual's proven jobs are in; the others the
    max-min ``X`` left at their level are candidates (one above it has shown it can rise)."""
    scale = 1.0 + base
    at_level = program.normalised_rows @ raised.x <= base + RISE * scale
    candidates = active & at_level & ~raised.proven
    used = 0
    while candidates.any():
        index = np.flatnonzero(candidates)
        extra = sparse.csr_array(
            (np.ones(len(index)), (index, np.arange(len(index)))), shape=(len(base), len(index))
        )
        caps = [(0.0, CAP * scale[m]) for m in index]
        solved = _solve(program, extra, base, runnable, caps, -np.ones(len(index)))
        used += 1
        if solved is None:
            return None, used
        rises = solved[0][program.n_x :] > RISE * scale[index]
        if not rises.any():
            break
        candidates[index[rises]] = False
    return candidates | raised.proven, used
