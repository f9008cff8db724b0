"""Sia's round program as arrays, and HiGHS's exact branch and bound on it.

The program is a multiple-choice knapsack: at most one column (configuration) per job, and a few
*coupling rows* shared by all jobs: the GPUs of each type, plus any other shared limit a caller
adds (:class:`CouplingRows`, e.g. a per-account GPU cap). ``coupling[r, j]`` is how much of
row ``r``'s capacity column ``j`` takes. Everything else (prices, bounds, the decomposition that
keeps HiGHS's problems small) lives in :mod:`.sia_dual` and :mod:`.sia_solve`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import numpy as np
from scipy import sparse
from scipy.optimize import Bounds, LinearConstraint, milp

from sia_slurm.policy.fd_capture import captured_fds

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CouplingRows:
    """Extra coupling rows: ``coupling[r, j]`` of row ``r`` taken by column ``j`` (in the
    caller's column order); row ``r``'s total may not exceed ``capacity[r]``."""

    coupling: np.ndarray  # (rows, columns) float64
    capacity: np.ndarray  # (rows,) float64


@dataclass(frozen=True)
class Program:
    """``minimise cost @ x`` over binary ``x``: at most one column per job and
    ``coupling @ x <= capacity`` (one coupling row per GPU type first, then any extra rows).

    Columns are sorted by (job, type); ``job`` indexes jobs ``0..n_jobs-1``. ``coupling`` is
    dense, one contiguous array per row: the rows are a handful (GPU types plus a few shared
    limits), the columns many, and products with it are written as per-row loops (no BLAS call,
    whose threads slowed down tenfold on a loaded 2-core machine).
    """

    cost: np.ndarray  # float64, < 0 (a column that does not beat "no allocation" is left out)
    job: np.ndarray  # int, sorted
    coupling: np.ndarray  # (rows, size) float64
    capacity: np.ndarray  # (rows,) float64
    n_jobs: int

    @staticmethod
    def build(
        cost: np.ndarray,
        gpus: np.ndarray,
        gpu_type: np.ndarray,
        job: np.ndarray,
        capacity: np.ndarray,
        n_jobs: int,
        extra: CouplingRows | None = None,
    ) -> tuple[Program, np.ndarray]:
        """A program with one GPU row per entry of ``capacity`` (``gpus`` on row ``gpu_type``)
        and the ``extra`` rows after them, columns sorted by (job, type); and that permutation."""
        order = np.lexsort((gpu_type, job))
        coupling = np.zeros((capacity.size, cost.size))
        coupling[gpu_type[order], np.arange(cost.size)] = gpus[order]
        limits = np.asarray(capacity, dtype=np.float64)
        if extra is not None:
            coupling = np.vstack([coupling, extra.coupling[:, order]])
            limits = np.r_[limits, extra.capacity]
        program = Program(cost[order], job[order], coupling, limits, n_jobs)
        return program, order

    @property
    def size(self) -> int:
        return int(self.cost.size)

    def subset(self, keep: np.ndarray) -> Program:
        return Program(
            self.cost[keep], self.job[keep], self.coupling[:, keep], self.capacity, self.n_jobs
        )

    def used(self, chosen: np.ndarray) -> np.ndarray:
        """Each coupling row's total over the ``chosen`` columns (a mask or indices)."""
        return np.array([row[chosen].sum() for row in self.coupling])

    def priced(self, prices: np.ndarray) -> np.ndarray:
        """Each column's cost plus the price of the capacity it takes."""
        adjusted = self.cost.copy()
        for row, price in zip(self.coupling, prices.tolist(), strict=True):
            if price:
                adjusted += price * row
        return adjusted

    def objective(self, chosen: np.ndarray) -> float:
        return float(self.cost[chosen].sum())

    def feasible(self, chosen: np.ndarray, tolerance: float = 1e-9) -> bool:
        """At most one column per job and every coupling row within its capacity."""
        once = np.bincount(self.job[chosen], minlength=self.n_jobs).max(initial=0) <= 1
        return bool(once and (self.used(chosen) <= self.capacity + tolerance).all())

    def matrix(self) -> sparse.csr_array:
        """Job rows (coefficient 1) stacked over the coupling rows."""
        n = self.size
        row, column = np.nonzero(self.coupling)
        rows = np.concatenate([self.job, self.n_jobs + row])
        cols = np.concatenate([np.arange(n), column])
        data = np.concatenate([np.ones(n), self.coupling[row, column]])
        shape = (self.n_jobs + self.capacity.size, n)
        return sparse.csr_array((data, (rows, cols)), shape=shape)


@dataclass(frozen=True)
class ProgramResult:
    """Chosen columns (a mask) and how they were found."""

    chosen: np.ndarray | None
    status: str  # "optimal", "near-optimal", "time-limit", "fallback"
    message: str


def highs(program: Program, time_limit_s: float, mip_rel_gap: float) -> ProgramResult:
    """HiGHS's branch and bound on ``program`` as it stands, quietly.

    A job row is only added where the job has two or more columns (a single column's row
    repeats its bound). HiGHS' presolve is off: on this structure it costs ten times the solve.
    Whatever HiGHS prints from C (it ignores ``disp`` for some diagnostics) is captured and
    logged at debug level instead of reaching the terminal.
    """
    if program.size == 0:
        return ProgramResult(np.zeros(0, dtype=bool), "optimal", "no useful columns")
    counts = np.bincount(program.job, minlength=program.n_jobs)
    job_row = np.cumsum(counts > 1) - 1
    multi = counts[program.job] > 1
    n_rows = int((counts > 1).sum())
    row, column = np.nonzero(program.coupling)
    matrix = sparse.csr_array(
        (
            np.r_[np.ones(int(multi.sum())), program.coupling[row, column]],
            (
                np.r_[job_row[program.job[multi]], n_rows + row],
                np.r_[np.flatnonzero(multi), column],
            ),
        ),
        shape=(n_rows + program.capacity.size, program.size),
    )
    with captured_fds() as printed:
        result = milp(
            program.cost,
            integrality=np.ones(program.size),
            bounds=Bounds(0.0, 1.0),
            constraints=LinearConstraint(
                matrix, -np.inf, np.r_[np.ones(n_rows), np.maximum(program.capacity, 0.0)]
            ),
            options={
                "time_limit": max(time_limit_s, 1e-3),
                "mip_rel_gap": mip_rel_gap,
                "presolve": False,
                "disp": False,
            },
        )
    if printed[0].strip():
        logger.debug("HiGHS printed: %s", printed[0].strip())
    detail = f"{program.size} columns; {result.message}"
    if result.x is None:
        return ProgramResult(None, "time-limit" if result.status == 1 else "fallback", detail)
    chosen = result.x > 0.5
    return ProgramResult(chosen, "optimal" if result.status == 0 else "time-limit", detail)


def solve_subset(
    program: Program,
    keep: np.ndarray,
    time_limit_s: float,
    mip_rel_gap: float,
    capacity: np.ndarray | None = None,
) -> ProgramResult:
    """:func:`highs` on the columns in ``keep`` (and ``capacity`` instead of the program's,
    where given); the mask it returns covers all of ``program``'s columns."""
    small = program.subset(keep)
    if capacity is not None:
        small = dataclasses.replace(small, capacity=capacity)
    result = highs(small, time_limit_s, mip_rel_gap)
    if result.chosen is None:
        return result
    chosen = np.zeros(program.size, dtype=bool)
    chosen[np.flatnonzero(keep)[result.chosen]] = True
    return ProgramResult(chosen, result.status, f"{small.size}/{program.size} {result.message}")


def solve_exact(program: Program, time_limit_s: float, mip_rel_gap: float = 0.0) -> ProgramResult:
    """HiGHS on the whole program, nothing removed: the reference the decomposition is
    checked against (tests, ``benchmarks/bench_policy.py --check``)."""
    return highs(program, time_limit_s, mip_rel_gap)
