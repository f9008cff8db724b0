"""Batch-size optimisation: the goodput-maximising global batch for each configuration.

Reference section 2, "Batch-size choice". For a configuration (type, n nodes, K GPUs) the
candidates are ~50 global batch sizes geometrically spaced in ``[max(M0, min_local_bsz*K),
max_batch_size]``; each is split into the fewest accumulation steps whose per-GPU batch fits the
type's ``max_local_bsz``; the candidate with the highest goodput wins. Jobs whose batch size is
fixed (strong-scaling, rigid) evaluate that one batch only.

The work is split in two because the halves change at different rates: the candidate grid and its
throughput (:func:`throughput_grid`) depend only on the throughput models, which change when a job
is refitted, while efficiency (:func:`choose_batch`) depends on the gradient statistics, which
change every report. Both are single numpy expressions over a (configurations x candidates) array,
so a job's whole row is one call with no Python loop per candidate or configuration.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sia_slurm.core import GoodputRow
from sia_slurm.model.efficiency import GradientStats, efficiency_coefficients
from sia_slurm.model.throughput import StackedParams, compute_time, network_time

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

DEFAULT_NUM_CANDIDATES = 50
_EPS = 1e-8  # tolerance for ceil() of ratios that are integers up to rounding
# Grids of at least this many cells skip pow() on the rows that do not need it (see
# _sync_from_compute); below it the bookkeeping costs more than the pow() calls it saves.
_SELECTIVE_POW_CELLS = 4096


@dataclass(frozen=True)
class BatchLimits:
    """A job's batch-size bounds: initial batch M0, largest global batch, smallest per-GPU batch."""

    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int

    def __post_init__(self) -> None:
        if self.min_local_bsz < 1:
            raise ValueError(
                f"min_local_bsz: expected a positive integer, got {self.min_local_bsz}"
            )
        if not 1 <= self.init_batch_size <= self.max_batch_size:
            raise ValueError(
                "expected 1 <= init_batch_size <= max_batch_size, got "
                f"init_batch_size={self.init_batch_size} max_batch_size={self.max_batch_size}"
            )


@dataclass(frozen=True)
class RowLimits:
    """:class:`BatchLimits` with one entry per row, for evaluating many jobs' rows at once."""

    init_batch_size: IntArray
    max_batch_size: IntArray
    min_local_bsz: IntArray

    @classmethod
    def repeat(cls, limits: Sequence[BatchLimits], times: int) -> RowLimits:
        """Each job's limits repeated for its ``times`` configurations."""
        table = np.array(
            [(x.init_batch_size, x.max_batch_size, x.min_local_bsz) for x in limits],
            dtype=np.int64,
        ).reshape(-1, 3)
        return cls(*(np.repeat(table[:, i], times) for i in range(3)))

    def rows(self, index: slice) -> RowLimits:
        """The limits of a range of rows (views)."""
        return RowLimits(
            self.init_batch_size[index], self.max_batch_size[index], self.min_local_bsz[index]
        )


@dataclass(frozen=True)
class CandidateGrid:
    """Batch-size candidates per configuration and their throughput; arrays are (C, N).

    ``batch_size`` is the realised global batch ``K * local_bsz * (accum_steps + 1)`` after
    rounding the per-GPU batch to an integer. Infeasible candidates have throughput 0. All four
    arrays are float64 (integer-valued where they count samples) so building the grid needs no
    conversions; :func:`choose_batch` returns integers.
    """

    batch_size: FloatArray
    local_bsz: FloatArray
    accum_steps: FloatArray
    throughput: FloatArray


def split_batch(
    batch_size: npt.ArrayLike, gpus: npt.ArrayLike, max_local_bsz: npt.ArrayLike
) -> tuple[IntArray, IntArray]:
    """(local_bsz m, accum_steps s) for global batch M on K GPUs: the fewest s with m <= limit.

    ``m = ceil(M / (K * (s + 1)))``, so the realised batch is at least M (by less than one
    sample per micro-batch).
    """
    local_bsz, accum = _split(batch_size, gpus, max_local_bsz)
    return local_bsz.astype(np.int64), accum.astype(np.int64)


def _split(
    batch_size: npt.ArrayLike, gpus: npt.ArrayLike, max_local_bsz: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """:func:`split_batch` with integer-valued floats (no int conversions on the big grid)."""
    local_bsz, micro_batches = split_micro_batches(batch_size, gpus, max_local_bsz)
    return local_bsz, micro_batches - 1.0


def split_micro_batches(
    batch_size: npt.ArrayLike, gpus: npt.ArrayLike, max_local_bsz: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """(local_bsz m, micro-batches s + 1) as new float arrays: :func:`split_batch` for grids.

    Works in place on two buffers: on a (configurations x candidates) grid every temporary
    costs as much as the arithmetic. The operations, and so the rounding, are those of the
    formula in :func:`split_batch`.
    """
    per_gpu = np.asarray(np.divide(batch_size, gpus, dtype=np.float64))
    limit = np.maximum(np.asarray(max_local_bsz, dtype=np.float64), 1.0)
    micro_batches = np.asarray(np.divide(per_gpu, limit))
    micro_batches -= _EPS
    np.ceil(micro_batches, out=micro_batches)
    np.maximum(micro_batches, 1.0, out=micro_batches)
    local_bsz = np.divide(per_gpu, micro_batches, out=per_gpu)
    local_bsz -= _EPS
    np.ceil(local_bsz, out=local_bsz)
    return local_bsz, micro_batches


def _column(values: npt.ArrayLike) -> FloatArray:
    """A scalar or per-row array as a (R, 1) (or (1, 1)) column that broadcasts over candidates."""
    return np.asarray(values, dtype=np.float64).reshape(-1, 1)


def _steps(num_candidates: int) -> FloatArray:
    return np.linspace(0.0, 1.0, num_candidates).reshape(1, -1)


def candidate_batch_sizes(
    gpus: npt.ArrayLike,
    limits: BatchLimits | RowLimits,
    num_candidates: int = DEFAULT_NUM_CANDIDATES,
) -> tuple[FloatArray, npt.NDArray[np.bool_]]:
    """(C, N) geometric candidates per configuration, and which configurations have any.

    A configuration whose smallest batch ``min_local_bsz * K`` exceeds ``max_batch_size`` has no
    valid batch size (too many GPUs for the job).
    """
    k = _column(gpus)
    high = _column(limits.max_batch_size)
    low = np.maximum(_column(limits.init_batch_size), _column(limits.min_local_bsz) * k)
    feasible = (low <= high).reshape(-1)
    low = np.minimum(low, high)
    return np.exp(np.log(low) + _steps(num_candidates) * np.log(high / low)), feasible


def throughput_grid(
    params: StackedParams,
    nodes: npt.ArrayLike,
    gpus: npt.ArrayLike,
    max_local_bsz: npt.ArrayLike,
    limits: BatchLimits | RowLimits,
    *,
    fixed_batch_size: npt.ArrayLike | None = None,
    num_candidates: int = DEFAULT_NUM_CANDIDATES,
) -> CandidateGrid:
    """Candidates and their throughput for C configurations (``params`` fields shaped (C, 1)).

    With ``fixed_batch_size`` (a scalar or one per configuration) there is one candidate per
    configuration: that batch, split over the configuration's GPUs. ``max_local_bsz`` <= 0 marks
    a type the job cannot use. The returned arrays are new (callers may update them in place).
    """
    k = _column(gpus)
    limit = _column(max_local_bsz)
    if fixed_batch_size is None:
        candidates, feasible = candidate_batch_sizes(k, limits, num_candidates)
        cap = _column(limits.max_batch_size)
    else:
        candidates = np.broadcast_to(_column(fixed_batch_size), k.shape)
        feasible = (k <= candidates).reshape(-1)
        cap = None  # a fixed batch is realised as given: no cap to round down for
    local_bsz, micro_batches = split_micro_batches(candidates, k, limit)
    realised = k * local_bsz
    realised *= micro_batches
    if cap is not None:
        # Rounding m up may overshoot max_batch_size by a few samples; round down instead there.
        over = realised > cap
        if over.any():
            local_bsz -= over
            np.multiply(k, local_bsz, out=realised)
            realised *= micro_batches
    accum = np.subtract(micro_batches, 1.0, out=micro_batches)
    ok = (feasible & (limit >= 1).reshape(-1))[:, None] & (local_bsz >= 1)
    all_ok = bool(ok.all())
    if not all_ok:
        local_bsz[~ok] = 1.0  # keep the model's inputs valid; the throughput is masked below
    t_compute = compute_time(params, local_bsz)
    t_iter = accum * t_compute
    t_iter += _sync_from_compute(params, _column(nodes), k, t_compute)
    throughput = np.divide(realised, t_iter, out=t_iter)
    if all_ok:
        return CandidateGrid(realised, local_bsz, accum, throughput)
    return CandidateGrid(
        batch_size=np.where(ok, realised, candidates),
        local_bsz=np.where(ok, local_bsz, 0.0),
        accum_steps=np.where(ok, accum, 0.0),
        throughput=np.where(ok, throughput, 0.0),
    )


def _sync_from_compute(
    params: StackedParams, nodes: FloatArray, gpus: FloatArray, t_compute: FloatArray
) -> FloatArray:
    """T_sync given T_compute (reusing it); only the (C, 1) network term is per configuration.

    ``T_c * (1 + (T_n/T_c)^gamma)^(1/gamma)`` costs two ``pow`` per grid cell, the most
    expensive step of a large grid. Two common kinds of row need none, with the same result:
    without network time (one GPU) the factor is ``(1 + 0^gamma)^(1/gamma) = 1``, and with
    ``gamma = 1`` (the fit's lower bound, where every type seen on one GPU only sits) it is
    ``1 + T_n/T_c``; ``pow(x, 1) = x`` and ``pow(1, y) = 1`` exactly. On a large grid only the
    other rows take the general formula; on a small one, picking them out costs more than it
    saves.
    """
    t_network = network_time(params, nodes, gpus)
    gamma = params.gamma
    factor = np.divide(t_network, t_compute)
    if t_compute.ndim != 2 or t_compute.size < _SELECTIVE_POW_CELLS:
        return t_compute * _overlap(factor, gamma)
    rows_shape = (t_compute.shape[0], 1)
    t_network = np.broadcast_to(t_network, rows_shape)
    gamma = np.broadcast_to(gamma, rows_shape)
    general = ((gamma != 1.0) & (t_network != 0.0)).reshape(-1)
    if general.all():
        return t_compute * _overlap(factor, gamma)
    factor += 1.0
    if general.any():
        rows = np.flatnonzero(general)
        factor[rows] = _overlap(t_network[rows] / t_compute[rows], gamma[rows])
    factor *= t_compute
    return factor


def _overlap(ratio: FloatArray, gamma: FloatArray) -> FloatArray:
    """``(1 + ratio^gamma)^(1/gamma)``, in place on ``ratio``."""
    np.power(ratio, gamma, out=ratio)
    ratio += 1.0
    np.power(ratio, 1.0 / gamma, out=ratio)
    return ratio


def choose_batch(grid: CandidateGrid, stats: GradientStats, init_batch_size: int) -> GoodputRow:
    """Per configuration, the candidate with the highest goodput (all zeros if none is feasible)."""
    return choose_batch_rows(grid, stats.grad_sqr, stats.grad_var, init_batch_size)


def choose_batch_rows(
    grid: CandidateGrid,
    grad_sqr: npt.ArrayLike,
    grad_var: npt.ArrayLike,
    init_batch_size: npt.ArrayLike,
) -> GoodputRow:
    """:func:`choose_batch` with statistics and M0 given per row ((R, 1) columns or scalars).

    Lets the rows of many jobs, each with its own statistics, be chosen in one pass.
    """
    slope, offset = efficiency_coefficients(grad_sqr, grad_var, init_batch_size)
    inverse_efficiency = offset + slope * grid.batch_size
    goodput = grid.throughput / inverse_efficiency
    rows = np.arange(len(goodput))
    best = np.argmax(goodput, axis=1)
    chosen_goodput = goodput[rows, best]
    ok = chosen_goodput > 0
    return GoodputRow(
        goodput=np.where(ok, chosen_goodput, 0.0),
        throughput=np.where(ok, grid.throughput[rows, best], 0.0),
        efficiency=np.where(ok, 1.0 / inverse_efficiency[rows, best], 0.0),
        batch_size=np.where(ok, grid.batch_size[rows, best], 0.0).astype(np.int64),
        local_bsz=grid.local_bsz[rows, best].astype(np.int64),
        accum_steps=grid.accum_steps[rows, best].astype(np.int64),
    )


def optimize_batch_size(
    params: StackedParams,
    nodes: npt.ArrayLike,
    gpus: npt.ArrayLike,
    max_local_bsz: npt.ArrayLike,
    limits: BatchLimits,
    stats: GradientStats,
    *,
    fixed_batch_size: int | None = None,
    num_candidates: int = DEFAULT_NUM_CANDIDATES,
) -> GoodputRow:
    """Best batch size and its goodput for each of C configurations, in one vectorised pass."""
    grid = throughput_grid(
        params,
        nodes,
        gpus,
        max_local_bsz,
        limits,
        fixed_batch_size=fixed_batch_size,
        num_candidates=num_candidates,
    )
    return choose_batch(grid, stats, limits.init_batch_size)
