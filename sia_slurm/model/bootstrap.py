"""Sia's bootstrap: a type's multi-GPU goodput projected from another type's model.

Reference section 3. Until type A has run the job on more than one GPU, its multi-GPU goodput
is projected from a type B that has::

    goodput(A, n, K) = goodput(B, n, K) * xput1(A) / xput1(B)

This module is that projection over arrays, with no estimator state: given each job's fitted
types as a :class:`TypeTable`, :func:`plan_inputs` says which model evaluates each (job,
configuration) and with what ratio, and :func:`projected_grid` builds the candidate grid with
the ratio applied and the batches re-split for the type that would run. Fitting the tables and
caching the grids is :mod:`sia_slurm.model.estimator`'s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from sia_slurm.core import Configuration
from sia_slurm.model.batch import (
    BatchLimits,
    CandidateGrid,
    RowLimits,
    split_micro_batches,
    throughput_grid,
)
from sia_slurm.model.throughput import StackedParams


@dataclass(frozen=True)
class TypeTable:
    """A job's fitted types as arrays; the last row stands in for types without data."""

    index: dict[str, int]  # profile GPU type -> row
    params: npt.NDArray[np.float64]  # (T + 1, 7), PARAM_NAMES order
    xput1: npt.NDArray[np.float64]  # (T + 1,)
    max_local_bsz: npt.NDArray[np.int64]  # (T + 1,), 0 for the stand-in row
    multi_gpu: npt.NDArray[np.bool_]  # (T + 1,), has own multi-GPU data
    reference: int  # row of the projection source type B, -1 if none


@dataclass(frozen=True)
class PlanInputs:
    """Inputs of the candidate grid, one entry per (job, configuration) row, job-major."""

    params: npt.NDArray[np.float64]  # (R, 7) parameters of the model evaluated
    nodes: npt.NDArray[np.int64]
    gpus: npt.NDArray[np.int64]
    source_limit: npt.NDArray[np.int64]  # max_local_bsz of the type whose model is evaluated
    target_limit: npt.NDArray[np.int64]  # max_local_bsz of the type that would run
    ratio: npt.NDArray[np.float64]  # xput1(A) / xput1(B) where projected, else 1
    projected: npt.NDArray[np.bool_]

    def rows(self, index: slice) -> PlanInputs:
        """The inputs of a range of rows (views)."""
        return PlanInputs(*(getattr(self, f.name)[index] for f in fields(PlanInputs)))


def plan_inputs(
    tables: Sequence[TypeTable],
    aliases: Sequence[Mapping[str, str]],
    configs: tuple[Configuration, ...],
) -> PlanInputs:
    """Which model evaluates each (job, configuration), and the bootstrap ratio applied to it.

    The jobs' type tables are stacked into one table, so every job is resolved in one numpy
    pass; the only Python work per job is a dict lookup per distinct GPU type of ``configs``.
    A job's rows in the stacked table start at ``first``; its last row is the stand-in for
    types it has no data on (max_local_bsz 0: infeasible, never projected).
    """
    columns = {name: i for i, name in enumerate(dict.fromkeys(c.gpu_type for c in configs))}
    type_of, nodes, gpus = np.array(
        [(columns[c.gpu_type], c.nodes, c.gpus) for c in configs], dtype=np.int64
    ).T.reshape(3, len(configs))
    own_rows: list[list[int]] = []  # per job: its table row of each GPU type in ``columns``
    reference_rows: list[int] = []  # per job: its row of type B, -1 if none
    first = 0
    for table, alias in zip(tables, aliases, strict=True):
        stand_in = len(table.index)
        own_rows.append([first + table.index.get(alias.get(n, n), stand_in) for n in columns])
        reference_rows.append(first + table.reference if table.reference >= 0 else -1)
        first += stand_in + 1
    params, xput1, max_local_bsz, multi_gpu = (
        _stack([getattr(t, name) for t in tables])
        for name in ("params", "xput1", "max_local_bsz", "multi_gpu")
    )
    own = np.array(own_rows, dtype=np.intp).reshape(len(tables), len(columns))[:, type_of]
    reference = np.array(reference_rows, dtype=np.intp)[:, None]
    target_limit = max_local_bsz[own]  # (J, C)
    projected = (gpus > 1) & (target_limit > 0) & ~multi_gpu[own] & (reference >= 0)
    source = np.where(projected, reference, own).reshape(-1)
    with np.errstate(divide="ignore", invalid="ignore"):  # only projected entries are kept
        ratio = np.where(projected, xput1[own] / xput1[reference], 1.0).reshape(-1)
    return PlanInputs(
        params=params[source],
        nodes=np.tile(nodes, len(tables)),
        gpus=np.tile(gpus, len(tables)),
        source_limit=max_local_bsz[source],
        target_limit=target_limit.reshape(-1),
        ratio=ratio,
        projected=projected.reshape(-1),
    )


def _stack(arrays: list[npt.NDArray[np.generic]]) -> npt.NDArray[np.generic]:
    """``np.concatenate``, without the copy for one array (the per-job path)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def projected_grid(
    inputs: PlanInputs,
    limits: BatchLimits | RowLimits,
    fixed_batch_size: npt.ArrayLike | None,
    num_candidates: int,
) -> CandidateGrid:
    """The candidate grid of :func:`throughput_grid`, with Sia's projection applied.

    A projected configuration (type A, no multi-GPU data) is evaluated with type B's model and
    memory limit (goodput(B, n, K)), scaled by xput1(A)/xput1(B), and its candidate batches are
    re-split for A's memory, since A is where the job would run. Only the projected rows are
    touched (in place): the ratio is 1 elsewhere.
    """
    grid = throughput_grid(
        StackedParams.from_table(inputs.params, (len(inputs.gpus), 1)),
        inputs.nodes,
        inputs.gpus,
        inputs.source_limit,
        limits,
        fixed_batch_size=fixed_batch_size,
        num_candidates=num_candidates,
    )
    rows = np.flatnonzero(inputs.projected)
    if rows.size:
        _project(grid, rows, inputs.gpus[rows], inputs.target_limit[rows], inputs.ratio[rows])
    return grid


def _project(
    grid: CandidateGrid,
    rows: npt.NDArray[np.intp],
    gpus: npt.NDArray[np.int64],
    target_limit: npt.NDArray[np.int64],
    ratio: npt.NDArray[np.float64],
) -> None:
    """Scale ``rows`` of ``grid`` by the xput1 ratio and re-split their batches for type A."""
    grid.throughput[rows] *= ratio[:, None]
    batch_size = grid.batch_size[rows]
    k = gpus[:, None].astype(np.float64)
    local_a, micro_a = split_micro_batches(batch_size, k, target_limit[:, None])
    realised_a = k * local_a
    realised_a *= micro_a
    accum_a = np.subtract(micro_a, 1.0, out=micro_a)
    use_a = grid.local_bsz[rows] > 0  # infeasible candidates keep their placeholders
    if not use_a.all():
        realised_a = np.where(use_a, realised_a, batch_size)
        local_a = np.where(use_a, local_a, grid.local_bsz[rows])
        accum_a = np.where(use_a, accum_a, grid.accum_steps[rows])
    grid.batch_size[rows] = realised_a
    grid.local_bsz[rows] = local_a
    grid.accum_steps[rows] = accum_a
