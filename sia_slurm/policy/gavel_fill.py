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
3. hand each frozen job's weight to the active jobs of its group (its user's, else its
   account's: Gavel's hierarchical reweighting, :func:`passed_down`), so an account keeps its
   share of what is left while any of its jobs can use more; repeat with the active jobs
   until every job is frozen.

Without groups the result is the weighted max-min fair (leximin) allocation: no job's weighted
level can rise without lowering one at or below it or pushing one above it below it. Every
round freezes at least one job, so there are at most as many rounds as jobs, in practice as
many as distinct levels.

Finding the bottlenecked jobs: Gavel solves a MILP that maximises the number of jobs that can
rise. Here LPs do. First the max-min LP's own duals: a job whose level row has a nonzero dual
is tight in every optimum (complementary slackness), so it is bottlenecked, for free; the
duals of the active rows sum to 1, so at least one job is proved each round. The duals may
miss some (a degenerate optimum: of two identical jobs, one is proved); such a job cannot
rise in the next round either, which then stalls, and only then (or when the duals prove
nothing) the bottleneck LP decides: over the candidate jobs ``U`` (the active jobs the
max-min ``X`` left at their level and the duals did not prove), maximise ``sum_u s_u`` with
``N_u >= level_u + s_u``, ``0 <= s_u <= cap``, every other job at its level. A job with
``s_u`` clearly above 0 can rise and leaves ``U``; when the LP finds no such job, none of
``U`` can rise on its own either (an LP optimum of 0 proves it), so ``U`` is bottlenecked.
The small cap spreads the rise over many jobs, so one or two such LPs settle a round.
Convexity makes this the MILP's answer: jobs that can each rise alone can all rise together
(average the solutions). Mostly one LP per round: on random 20-job instances the duals alone
found every bottleneck, and running the bottleneck LP every round doubled the LPs.

Levels are kept in normalised throughput (``N_m >= base_m + w_m * delta``), the form of
Gavel's own implementation: ``base_m`` is what the job was guaranteed so far, ``delta`` the
round's rise of the common weighted level, ``w_m`` the job's weight in that round (which the
reweighting changes from round to round).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
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


def water_fill(
    program: FillProgram,
    weights: np.ndarray,
    runnable: np.ndarray,
    groups: Sequence[np.ndarray] = (),
) -> WaterFill | None:
    """Water-fill ``program`` with per-job ``weights`` (> 0) over the ``runnable`` jobs.
    ``groups``: the hierarchy above the jobs, outermost first (e.g. each job's account, then
    its user), whose frozen jobs' weight passes to their group's active jobs
    (:func:`passed_down`). ``None`` when the first LP fails (logged); when a later one does,
    the last ``X``, which keeps every level frozen so far, so the result is never worse than
    the first LP's."""
    n_jobs = len(weights)
    base = np.zeros(n_jobs)  # guaranteed normalised throughput so far
    active = runnable.copy()
    x: np.ndarray | None = None
    rounds = solves = 0
    while active.any() and rounds < n_jobs:
        rounds += 1
        rates = passed_down(weights, groups, active) if rounds > 1 else weights
        raised = _raise_minimum(program, rates, base, active, runnable)
        solves += 1
        if raised is None:
            break
        x = raised.x
        base = np.where(active, base + rates * raised.delta, base)
        stalled = bool(np.all((rates * raised.delta <= RISE * (1.0 + base))[active]))
        if stalled or not raised.proven.any():
            bottlenecked, used = _bottlenecked(program, base, active, runnable, raised)
            solves += used
        else:  # the duals' proof alone: a job they missed stalls the next round, which the
            # bottleneck LP then settles (running it every round doubled the LPs)
            bottlenecked = raised.proven
        if bottlenecked is None:
            break
        if not bottlenecked.any():  # only numerical noise can say no job is stuck: stop here
            logger.debug("water-filling: no bottlenecked job in round %d; stopping", rounds)
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


def passed_down(
    weights: np.ndarray, groups: Sequence[np.ndarray], active: np.ndarray
) -> np.ndarray:
    """Each active job's weight for the next rise (0 for the others): Gavel's hierarchical
    reweighting. ``groups`` are labels per job, outermost first (account, then user). A group
    keeps its weight, the sum of its jobs', while any of its jobs is active, and shares it
    among its active members (subgroups, then jobs) in proportion to theirs: a frozen job's
    part goes to its siblings, a user whose jobs are all frozen leaves its part to the other
    users of the account. An outermost group with no active job drops out; the others rise at
    the same ratios as before. With every job active each keeps its own weight."""
    n_jobs = len(weights)
    depth = len(groups)
    # nodes[k][m]: job m's group at depth k (a tuple of k labels); the last level: the job
    nodes = [
        [tuple(level[m] for level in groups[:k]) for m in range(n_jobs)] for k in range(depth + 1)
    ]
    nodes.append([(*nodes[depth][m], m) for m in range(n_jobs)])
    weight_of: dict[tuple, float] = {}
    for level in nodes[1:]:
        for m, node in enumerate(level):
            weight_of[node] = weight_of.get(node, 0.0) + float(weights[m])
    live_children: dict[tuple, set[tuple]] = {}
    for k in range(1, depth + 2):
        for m in np.flatnonzero(active):
            live_children.setdefault(nodes[k - 1][m], set()).add(nodes[k][m])
    rates = np.zeros(n_jobs)
    for m in np.flatnonzero(active):
        rate = weight_of[nodes[1][m]]
        for k in range(2, depth + 2):
            live = sum(weight_of[child] for child in live_children[nodes[k - 1][m]])
            rate *= weight_of[nodes[k][m]] / live
        rates[m] = rate
    return rates


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
