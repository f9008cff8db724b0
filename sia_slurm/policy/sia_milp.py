"""Sia's round program as sparse matrices, shrunk exactly before HiGHS sees it.

The program is a multiple-choice knapsack: at most one column per job, a GPU capacity per type.
At 2048 GPUs it has ~50k binaries and HiGHS spends over a second in presolve alone, so before
calling ``scipy.optimize.milp`` we remove columns that provably cannot be in an optimal solution
(*reduced-cost fixing*):

- relaxing the capacity rows with prices ``mu_t >= 0`` gives the Lagrangian bound
  ``L(mu) = sum_i min(0, min_j c_ij + mu_t(j) g_j) - sum_t mu_t cap_t``, a lower bound on the
  optimum for any ``mu`` (its maximum equals the LP relaxation's optimum);
- a column whose Lagrangian cost exceeds its job's best by ``delta_ij`` is in no solution better
  than ``L(mu) + delta_ij``; if that exceeds the objective ``z`` of a feasible (greedy) solution,
  the column is dropped.

The remaining program has the same optimum, usually with one or two columns per job. Prices come
from maximising a smoothed ``L`` (concave) with Newton's method.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp


@dataclass(frozen=True)
class Program:
    """``minimise cost @ x`` s.t. at most one column per job, ``sum gpus <= capacity`` per type.

    Columns are sorted by (job, type); ``job`` indexes rows ``0..n_jobs-1``.
    """

    cost: np.ndarray  # float64, < 0 (a column that does not beat "no allocation" is left out)
    gpus: np.ndarray  # float64
    gpu_type: np.ndarray  # int, index into capacity
    job: np.ndarray  # int, sorted
    capacity: np.ndarray  # float64 per type
    n_jobs: int

    @staticmethod
    def build(
        cost: np.ndarray,
        gpus: np.ndarray,
        gpu_type: np.ndarray,
        job: np.ndarray,
        capacity: np.ndarray,
        n_jobs: int,
    ) -> tuple[Program, np.ndarray]:
        """A program with columns sorted by (job, type), and the permutation applied."""
        order = np.lexsort((gpu_type, job))
        program = Program(cost[order], gpus[order], gpu_type[order], job[order], capacity, n_jobs)
        return program, order

    @property
    def size(self) -> int:
        return int(self.cost.size)

    def subset(self, keep: np.ndarray) -> Program:
        return Program(
            self.cost[keep],
            self.gpus[keep],
            self.gpu_type[keep],
            self.job[keep],
            self.capacity,
            self.n_jobs,
        )

    def matrix(self) -> sparse.csr_array:
        """Job rows (coefficient 1) stacked over type rows (coefficient = GPUs)."""
        n = self.size
        rows = np.concatenate([self.job, self.n_jobs + self.gpu_type])
        cols = np.concatenate([np.arange(n), np.arange(n)])
        data = np.concatenate([np.ones(n), self.gpus])
        shape = (self.n_jobs + self.capacity.size, n)
        return sparse.csr_array((data, (rows, cols)), shape=shape)


def group_min(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Minimum of each contiguous group beginning at ``starts``."""
    return np.minimum.reduceat(values, starts) if values.size else values


def job_minimum(program: Program, adjusted: np.ndarray) -> np.ndarray:
    """Per job, ``min(0, min_j adjusted_j)`` (taking nothing costs 0)."""
    best = np.zeros(program.n_jobs)
    if program.size:
        starts = np.flatnonzero(np.r_[True, program.job[1:] != program.job[:-1]])
        best[program.job[starts]] = np.minimum(group_min(adjusted, starts), 0.0)
    return best


def lagrangian(program: Program, prices: np.ndarray) -> float:
    adjusted = program.cost + prices[program.gpu_type] * program.gpus
    return float(job_minimum(program, adjusted).sum() - prices @ program.capacity)


@dataclass(frozen=True)
class Groups:
    """Where each job's columns start, and each column's job position among those groups."""

    starts: np.ndarray
    segment: np.ndarray

    @staticmethod
    def of(program: Program) -> Groups:
        starts = np.flatnonzero(np.r_[True, program.job[1:] != program.job[:-1]])
        segment = np.repeat(np.arange(starts.size), np.diff(np.r_[starts, program.size]))
        return Groups(starts, segment)


def smoothed_dual(
    prices: np.ndarray, program: Program, groups: Groups, tau: float
) -> tuple[float, np.ndarray, np.ndarray]:
    """``L_tau(prices)``, its gradient and Hessian, where ``L_tau`` replaces each job's ``min``
    (over its columns and "nothing") by a soft-min of temperature ``tau``: smooth and concave,
    so Newton's method handles the strong coupling between the types' prices."""
    n_types = prices.size
    adjusted = program.cost + prices[program.gpu_type] * program.gpus
    low = np.minimum(group_min(adjusted, groups.starts), 0.0)
    weight = np.exp((low[groups.segment] - adjusted) / tau)
    total = np.add.reduceat(weight, groups.starts) + np.exp(low / tau)
    value = float(np.sum(low - tau * np.log(total)) - prices @ program.capacity)
    share = weight / total[groups.segment]
    usage = np.bincount(
        groups.segment * n_types + program.gpu_type,
        weights=share * program.gpus,
        minlength=groups.starts.size * n_types,
    ).reshape(-1, n_types)
    gradient = usage.sum(axis=0) - program.capacity
    second = np.bincount(program.gpu_type, weights=share * program.gpus**2, minlength=n_types)
    hessian = (np.einsum("it,is->ts", usage, usage) - np.diag(second)) / tau
    return value, gradient, hessian


def newton_ascent(
    program: Program, groups: Groups, prices: np.ndarray, tau: float, iterations: int = 30
) -> np.ndarray:
    """Maximise ``L_tau`` over ``prices >= 0``: projected Newton steps with backtracking.

    Written out rather than calling L-BFGS-B: with only a handful of types the Newton system is
    tiny, and L-BFGS-B's BLAS calls were slowed down tenfold on a loaded machine.
    """
    value, gradient, hessian = smoothed_dual(prices, program, groups, tau)
    tolerance = 1e-7 * max(float(program.capacity.sum()), 1.0)
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
    program: Program, temperatures: tuple[float, ...] = (0.02, 0.004)
) -> np.ndarray:
    """Near-optimal prices per type: maximise the smoothed ``L`` at decreasing temperatures
    (relative to the mean column cost). Any prices give a valid bound; better ones fix more
    columns."""
    prices = np.zeros(program.capacity.size)
    if program.size == 0:
        return prices
    groups = Groups.of(program)
    scale = float(np.mean(np.abs(program.cost)))
    for temperature in temperatures:
        prices = newton_ascent(program, groups, prices, temperature * scale)
    return prices


def greedy_incumbent(program: Program, prices: np.ndarray) -> np.ndarray:
    """A feasible 0/1 solution: each job's best column at ``prices``, most valuable jobs first,
    falling back to its best column that still fits (or nothing)."""
    adjusted = program.cost + prices[program.gpu_type] * program.gpus
    order = np.lexsort((adjusted, program.job))  # per job, best column first
    free = program.capacity.astype(np.float64).copy()
    chosen = np.zeros(program.size, dtype=bool)
    starts = np.flatnonzero(np.r_[True, program.job[order][1:] != program.job[order][:-1]])
    ends = np.r_[starts[1:], order.size]
    first = order[starts]
    job_rank = np.argsort(adjusted[first], kind="stable")
    for g in job_rank.tolist():
        for k in order[starts[g] : ends[g]].tolist():
            t = program.gpu_type[k]
            if program.gpus[k] <= free[t]:
                free[t] -= program.gpus[k]
                chosen[k] = True
                break
    return chosen


@dataclass(frozen=True)
class ProgramResult:
    """Chosen columns (a mask) and how they were found."""

    chosen: np.ndarray | None
    status: str  # "optimal", "time-limit", "fallback"
    message: str


def solve_subset(
    program: Program, keep: np.ndarray, time_limit_s: float, mip_rel_gap: float
) -> ProgramResult:
    """HiGHS on the columns in ``keep``; a job row is only added where the job has two or more
    columns (a single column's row repeats its bound). HiGHS' presolve is off: on this
    structure it costs ten times the solve."""
    if not keep.any():
        return ProgramResult(np.zeros(program.size, dtype=bool), "optimal", "no useful columns")
    small = program.subset(keep)
    counts = np.bincount(small.job, minlength=program.n_jobs)
    job_row = np.cumsum(counts > 1) - 1
    multi = counts[small.job] > 1
    n_rows = int((counts > 1).sum())
    columns = np.arange(small.size)
    matrix = sparse.csr_array(
        (
            np.r_[np.ones(int(multi.sum())), small.gpus],
            (
                np.r_[job_row[small.job[multi]], n_rows + small.gpu_type],
                np.r_[columns[multi], columns],
            ),
        ),
        shape=(n_rows + small.capacity.size, small.size),
    )
    result = milp(
        small.cost,
        integrality=np.ones(small.size),
        bounds=Bounds(0.0, 1.0),
        constraints=LinearConstraint(matrix, -np.inf, np.r_[np.ones(n_rows), small.capacity]),
        options={
            "time_limit": max(time_limit_s, 1e-3),
            "mip_rel_gap": mip_rel_gap,
            "presolve": False,
            "disp": False,
        },
    )
    detail = f"{small.size}/{program.size} columns; {result.message}"
    if result.x is None:
        return ProgramResult(None, "time-limit" if result.status == 1 else "fallback", detail)
    chosen = np.zeros(program.size, dtype=bool)
    chosen[np.flatnonzero(keep)[result.x > 0.5]] = True
    return ProgramResult(chosen, "optimal" if result.status == 0 else "time-limit", detail)


def solve(
    program: Program, time_limit_s: float, mip_rel_gap: float, threshold: float = 0.02
) -> ProgramResult:
    """Exact solve in two small steps instead of one big one.

    1. HiGHS on the columns within ``threshold`` (relative to the mean column cost) of their
       job's best at the Lagrangian prices, plus a greedy solution: a good solution ``z``, fast.
    2. Every column with ``L + delta <= z`` could still be in an optimal solution; if all of them
       were already in step 1, step 1 was optimal. Otherwise HiGHS runs again on those columns.
    """
    if program.size == 0:
        return ProgramResult(np.zeros(0, dtype=bool), "optimal", "no columns")
    started = time.perf_counter()
    prices = lagrangian_prices(program)
    adjusted = program.cost + prices[program.gpu_type] * program.gpus
    delta = adjusted - job_minimum(program, adjusted)[program.job]
    bound = lagrangian(program, prices)
    incumbent = greedy_incumbent(program, prices)
    candidate = (delta <= threshold * float(np.mean(np.abs(program.cost)))) | incumbent
    first = solve_subset(program, candidate, time_limit_s, mip_rel_gap)
    if first.chosen is None:
        if first.status == "time-limit":  # no solution in time: the greedy one is feasible
            return ProgramResult(incumbent, "time-limit", first.message + "; greedy incumbent")
        return first
    best = float(program.cost[first.chosen].sum())
    needed = bound + delta <= best + 1e-9 * max(1.0, abs(best))
    if first.status != "optimal" or not (needed & ~candidate).any():
        return first
    remaining = time_limit_s - (time.perf_counter() - started)
    second = solve_subset(program, needed | first.chosen, remaining, mip_rel_gap)
    return second if second.chosen is not None else first
