"""Solving Sia's round program fast: price, fix the clear jobs, branch and bound on the rest.

At 16,384 GPUs the program has ~10^5 binaries and 12,000 job rows; HiGHS alone needs seconds.
Its structure makes most of that work unnecessary. With prices ``mu`` on the coupling rows
(:mod:`.sia_dual`), every job has a cheapest option and a margin to its second-best. Jobs whose
margin is wide take their cheapest option in the LP relaxation and, almost always, in the integer
optimum; only the few jobs near a tie (at most one per coupling row is fractional in a basic LP
solution) need a search. So:

1. **Price**: maximise the Lagrangian dual (Newton on a smoothed dual; a few ms). ``L(mu)`` is a
   lower bound on the optimum.
2. **Fix and search** (stage A): the 32 jobs with the smallest margins stay free (then 128 and
   512 while step 3 fails), the others are fixed to their cheapest option (if that overfills a
   coupling row, the row's fixed jobs with the smallest margins are freed until it fits). HiGHS
   solves the small program of the free jobs on the capacity the fixed ones leave: a feasible
   solution ``z``.
3. **Certify**: any solution using an option with ``delta > z - L`` is worse than ``z``
   (reduced-cost fixing). If every option that stage A excluded has ``delta > z - L``, ``z`` is
   optimal (up to HiGHS's gap): status ``optimal``. Else, if ``z - L <= accept_gap * |z|``, the
   solution is within ``accept_gap`` of the LP bound, hence of the optimum: ``near-optimal``.
4. Otherwise (stage B, the exact fallback) every option with ``delta <= z - L`` is let back in
   and HiGHS solves that program: exact (``optimal``), with stage A's solution as the fallback
   if it runs out of time.

HiGHS's gap on a sub-program is set so that its *absolute* gap is ``mip_rel_gap`` times the whole
objective (the sub-program is a small part of it). :func:`.sia_milp.solve_exact` (HiGHS on the
whole program) stays the reference that tests and ``benchmarks/bench_policy.py --check`` compare
against.
"""

from __future__ import annotations

import time

import numpy as np

from sia_slurm.policy.sia_dual import Pricing, lagrangian_prices
from sia_slurm.policy.sia_milp import Program, ProgramResult, solve_subset

TOLERANCE = 1e-9
FREE_JOBS = (32, 128, 512)
"""Stage A's free-job counts, tried in turn (see :func:`solve`)."""


def fix_choice(
    program: Program, pricing: Pricing, free: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Fix every job outside ``free`` to its cheapest option; where that overfills a coupling
    row, free that row's fixed jobs (smallest margin first) until it fits. Returns the fixed
    columns (a mask) and the final free jobs."""
    free = free.copy()
    for _ in range(program.capacity.size + 1):
        fixed_jobs = np.flatnonzero(~free & (pricing.best >= 0))
        columns = pricing.best[fixed_jobs]
        used = program.used(columns)
        over = np.flatnonzero(used > program.capacity + TOLERANCE)
        if over.size == 0:
            break
        for row in over.tolist():
            take = program.coupling[row, columns]
            on_row = take > 0
            jobs, take = fixed_jobs[on_row], take[on_row]
            order = np.argsort(pricing.margin[jobs], kind="stable")
            # free the fewest jobs whose usage brings the row back within its capacity
            excess = used[row] - program.capacity[row]
            count = int(np.searchsorted(np.cumsum(take[order]), excess - TOLERANCE)) + 1
            free[jobs[order[:count]]] = True
    chosen = np.zeros(program.size, dtype=bool)
    chosen[pricing.best[~free & (pricing.best >= 0)]] = True
    return chosen, free


def sub_gap(program: Program, keep: np.ndarray, mip_rel_gap: float, whole: float) -> float:
    """HiGHS's relative gap on the sub-program ``keep`` so that its absolute gap is
    ``mip_rel_gap * |whole|``: the sub-program's objective is only a part of the whole."""
    if not keep.any():
        return mip_rel_gap
    groups = np.flatnonzero(np.r_[True, program.job[keep][1:] != program.job[keep][:-1]])
    part = float(np.abs(np.minimum.reduceat(program.cost[keep], groups)).sum())
    return float(min(1.0, mip_rel_gap * abs(whole) / max(part, TOLERANCE)))


def search(
    program: Program,
    pricing: Pricing,
    free: np.ndarray,
    columns: np.ndarray,
    time_limit_s: float,
    mip_rel_gap: float,
) -> tuple[ProgramResult, np.ndarray, np.ndarray]:
    """Fix the jobs outside ``free``, run HiGHS on the free jobs' ``columns`` (plus each one's
    cheapest column) with the capacity left. Returns the result over all columns, the mask of
    columns that were allowed, and the final free jobs."""
    fixed, free = fix_choice(program, pricing, free)
    cheapest = np.zeros(program.size, dtype=bool)
    cheapest[pricing.best[free & (pricing.best >= 0)]] = True
    allowed = (columns | cheapest) & free[program.job]
    left = program.capacity - program.used(fixed)
    gap = sub_gap(program, allowed, mip_rel_gap, pricing.bound)
    result = solve_subset(program, allowed, time_limit_s, gap, capacity=left)
    if result.chosen is None:
        return (
            ProgramResult(fixed, result.status, result.message + "; free jobs left out"),
            (allowed | fixed),
            free,
        )
    return (
        ProgramResult(fixed | result.chosen, result.status, result.message),
        (allowed | fixed),
        free,
    )


def excluded_delta(
    program: Program, pricing: Pricing, allowed: np.ndarray, free: np.ndarray
) -> float:
    """The smallest ``delta`` of an option the search could not take: the fixed jobs' other
    options (their margins) and the free jobs' columns left out ("nothing" is always open)."""
    fixed_margin = pricing.margin[~free]
    out = pricing.delta[~allowed & free[program.job]]
    return min(
        float(fixed_margin.min()) if fixed_margin.size else np.inf,
        float(out.min()) if out.size else np.inf,
    )


def solve(
    program: Program,
    time_limit_s: float,
    mip_rel_gap: float,
    accept_gap: float = 1e-3,
    free_jobs: tuple[int, ...] = FREE_JOBS,
) -> ProgramResult:
    """Price, fix, search, certify (module docstring); the message gives the certified gap.

    Stage A is tried with ``free_jobs[0]`` free jobs, then with each larger count while it
    neither proves nor reaches ``accept_gap``: when the prices are slightly off, more jobs
    near a tie must move, and a few hundred free jobs still solve in milliseconds, where stage
    B (every option that could matter) took up to a second at 2,048 GPUs.
    """
    if program.size == 0:
        return ProgramResult(np.zeros(0, dtype=bool), "optimal", "no columns")
    started = time.perf_counter()
    pricing = Pricing.at(program, lagrangian_prices(program))
    bound = pricing.bound
    finite = np.sort(pricing.margin[np.isfinite(pricing.margin)])
    best: tuple[float, np.ndarray] | None = None
    free = np.zeros(program.n_jobs, dtype=bool)
    details = []
    for count in free_jobs:
        width = float(finite[min(count, finite.size) - 1]) if finite.size else 0.0
        remaining = time_limit_s - (time.perf_counter() - started)
        result, allowed, free = search(
            program,
            pricing,
            pricing.margin <= width,
            pricing.delta <= 2.0 * width,
            remaining,
            mip_rel_gap,
        )
        assert result.chosen is not None  # the fixed part alone is feasible
        value = program.objective(result.chosen)
        if best is None or value < best[0]:
            best = (value, result.chosen)
        value, chosen = best
        gap = value - bound
        slack = TOLERANCE * max(1.0, abs(value))
        details.append(f"stage A {int(free.sum())} free jobs, {result.message}")
        detail = "; ".join(details)
        if excluded_delta(program, pricing, allowed, free) > gap + slack:
            return ProgramResult(chosen, result.status, certified(detail, value, bound))
        if gap <= accept_gap * abs(value) + slack:
            return ProgramResult(chosen, "near-optimal", certified(detail, value, bound))
        if count >= finite.size:
            break
    assert best is not None
    value, chosen = best
    gap = value - bound
    slack = TOLERANCE * max(1.0, abs(value))
    remaining = time_limit_s - (time.perf_counter() - started)
    second, _, free_b = search(
        program,
        pricing,
        free | (pricing.margin <= gap + slack),
        pricing.delta <= gap + slack,
        remaining,
        mip_rel_gap,
    )
    detail = "; ".join([*details, f"stage B {int(free_b.sum())} free jobs, {second.message}"])
    if second.chosen is None:  # stage B found nothing in the time left
        return ProgramResult(chosen, "time-limit", certified(detail, value, bound))
    if program.objective(second.chosen) > value:
        # Stage B searched every column that could beat stage A's best (delta <= gap) and its
        # answer is no better: stage A's is as proven as stage B's search (HiGHS's own gap
        # lets B stop slightly above it). It was labelled "time-limit" before, in no hurry.
        return ProgramResult(chosen, second.status, certified(detail, value, bound))
    return ProgramResult(
        second.chosen, second.status, certified(detail, program.objective(second.chosen), bound)
    )


def certified(detail: str, value: float, bound: float) -> str:
    """The message with the objective, the LP bound and their relative gap."""
    gap = (value - bound) / max(abs(value), TOLERANCE)
    return f"{detail}; objective {value:.6g}, bound {bound:.6g}, gap {gap:.2e}"
