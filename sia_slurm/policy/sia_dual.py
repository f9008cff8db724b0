"""Prices for Sia's coupling rows: the Lagrangian dual of the round program.

Relaxing the coupling rows (GPUs per type, any extra shared limit) with prices ``mu_r >= 0``
splits the program into one tiny problem per job, "take your cheapest column at these prices, or
nothing":

    L(mu) = sum_i min(0, min_j c_ij + mu @ coupling[:, j]) - mu @ capacity

``L(mu)`` is a lower bound on the optimum for every ``mu >= 0``, and its maximum is the LP
relaxation's optimum: the maximising prices are the LP's duals. At those prices every job whose
cheapest option is unique takes it in the LP solution too, and a basic LP solution has at most as
many fractional jobs as coupling rows. :class:`Pricing` holds, per job, its best option and its
*margin* (how much more its second-best option costs), and per column its *delta* over the
job's best: a solution using column ``j`` is worth at least ``L(mu) + delta_j`` (reduced-cost
fixing), which is what lets :mod:`.sia_solve` fix most jobs exactly.

The prices maximise a smoothed ``L`` (each job's ``min`` replaced by a soft-min): smooth and
concave, so Newton's method in the few price variables converges in a handful of steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from sia_slurm.policy.sia_milp import Program


@dataclass(frozen=True)
class Groups:
    """Where each job's columns start, which job each group is, and each column's group."""

    starts: np.ndarray
    jobs: np.ndarray
    segment: np.ndarray

    @staticmethod
    def of(program: Program) -> Groups:
        starts = np.flatnonzero(np.r_[True, program.job[1:] != program.job[:-1]])
        if program.size == 0:
            starts = np.zeros(0, dtype=np.intp)
        segment = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, program.size]))
        return Groups(starts, program.job[starts], segment)


def group_min(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Minimum of each contiguous group beginning at ``starts``."""
    return np.minimum.reduceat(values, starts) if values.size else values


def adjusted_cost(program: Program, prices: np.ndarray) -> np.ndarray:
    """Each column's cost plus the price of the capacity it takes."""
    return program.priced(prices)


def job_minimum(program: Program, adjusted: np.ndarray) -> np.ndarray:
    """Per job, ``min(0, min_j adjusted_j)`` (taking nothing costs 0)."""
    best = np.zeros(program.n_jobs)
    if program.size:
        groups = Groups.of(program)
        best[groups.jobs] = np.minimum(group_min(adjusted, groups.starts), 0.0)
    return best


def lagrangian(program: Program, prices: np.ndarray) -> float:
    """``L(prices)``: a lower bound on the program's optimum for any ``prices >= 0``."""
    adjusted = adjusted_cost(program, prices)
    return float(job_minimum(program, adjusted).sum() - prices @ program.capacity)


def smoothed_dual(
    prices: np.ndarray, program: Program, groups: Groups, tau: float
) -> tuple[float, np.ndarray, np.ndarray]:
    """``L_tau(prices)``, its gradient and Hessian, where ``L_tau`` replaces each job's ``min``
    (over its columns and "nothing") by a soft-min of temperature ``tau``."""
    adjusted = adjusted_cost(program, prices)
    low = np.minimum(group_min(adjusted, groups.starts), 0.0)
    weight = np.exp((low[groups.segment] - adjusted) / tau)
    total = np.add.reduceat(weight, groups.starts) + np.exp(low / tau)
    value = float(np.sum(low - tau * np.log(total)) - prices @ program.capacity)
    share = weight / total[groups.segment]
    weighted = program.coupling * share  # (rows, columns)
    usage = np.add.reduceat(weighted, groups.starts, axis=1)  # (rows, groups): expected use
    gradient = usage.sum(axis=1) - program.capacity
    own = np.einsum("rj,sj->rs", weighted, program.coupling)
    hessian = (np.einsum("rg,sg->rs", usage, usage) - own) / tau
    return value, gradient, hessian


def newton_ascent(
    program: Program, groups: Groups, prices: np.ndarray, tau: float, iterations: int = 30
) -> np.ndarray:
    """Maximise ``L_tau`` over ``prices >= 0``: projected Newton steps with backtracking.

    Written out rather than calling L-BFGS-B: with only a handful of rows the Newton system is
    tiny, and L-BFGS-B's BLAS calls were slowed down tenfold on a loaded machine.
    """
    value, gradient, hessian = smoothed_dual(prices, program, groups, tau)
    tolerance = 1e-7 * max(float(np.abs(program.capacity).sum()), 1.0)
    for _ in range(iterations):
        free = (prices > 0) | (gradient > 0)
        if not free.any() or np.abs(gradient[free]).max() <= tolerance:
            break
        sub = -hessian[np.ix_(free, free)]
        sub += np.eye(sub.shape[0]) * 1e-9 * (np.abs(np.diag(sub)).max() + 1.0)
        step = np.zeros_like(prices)
        step[free] = np.linalg.solve(sub, gradient[free])
        for _ in range(30):
            trial = np.maximum(prices + step, 0.0)
            trial_value, trial_gradient, trial_hessian = smoothed_dual(trial, program, groups, tau)
            if trial_value >= value + 1e-4 * float(gradient @ (trial - prices)):
                break
            step /= 2.0
        else:
            break
        prices, value, gradient, hessian = trial, trial_value, trial_gradient, trial_hessian
    return prices


def lagrangian_prices(
    program: Program, temperatures: tuple[float, ...] = (0.02, 0.004, 0.001)
) -> np.ndarray:
    """Near-optimal prices per coupling row: maximise the smoothed ``L`` at decreasing
    temperatures (relative to the mean column cost). Any prices give a valid bound; better ones
    give a tighter bound and fix more jobs."""
    prices = np.zeros(program.capacity.size)
    if program.size == 0:
        return prices
    groups = Groups.of(program)
    scale = float(np.mean(np.abs(program.cost)))
    for temperature in temperatures:
        prices = newton_ascent(program, groups, prices, temperature * scale)
    return prices


@dataclass(frozen=True)
class Pricing:
    """Each job's cheapest option at ``prices`` and how far the others are behind.

    ``best[i]`` is job i's best column, -1 for "nothing"; ``margin[i]`` the extra cost of its
    second-best option ("nothing" included; ``inf`` for a job whose only option is nothing);
    ``delta[j]`` column j's extra cost over its job's best, ``idle[i]`` that of "nothing".
    """

    prices: np.ndarray
    bound: float  # L(prices)
    best: np.ndarray
    margin: np.ndarray
    delta: np.ndarray
    idle: np.ndarray

    @staticmethod
    def at(program: Program, prices: np.ndarray) -> Pricing:
        adjusted = adjusted_cost(program, prices)
        groups = Groups.of(program)
        best = np.full(program.n_jobs, -1, dtype=np.intp)
        low = np.zeros(program.n_jobs)
        second = np.full(program.n_jobs, np.inf)
        if program.size:
            order = np.lexsort((adjusted, program.job))  # per job, cheapest column first
            first = order[groups.starts]
            ends = np.r_[groups.starts[1:], program.size]
            has_two = ends - groups.starts > 1
            runner = np.full(groups.starts.size, np.inf)
            runner[has_two] = adjusted[order[groups.starts[has_two] + 1]]
            top = adjusted[first]
            takes = top < 0.0
            jobs = groups.jobs
            best[jobs[takes]] = first[takes]
            low[jobs] = np.minimum(top, 0.0)
            second[jobs] = np.where(takes, np.minimum(runner, 0.0), top)
        bound = float(low.sum() - prices @ program.capacity)
        delta = adjusted - low[program.job]
        return Pricing(prices, bound, best, second - low, delta, -low)
