"""How simulated jobs progress: true statistical efficiency, integrated over time for all jobs.

A job running with global batch ``M`` and iteration time ``T`` (seconds per optimizer step, from
the ground truth) advances in *M0-equivalent samples* (the unit of
:mod:`sia_slurm.sim.gradstats`) at

    rate(p) = throughput x efficiency = (M / T) x gain(p) / scale = gain(p) x M0 / T / c

where ``scale = M / M0``, ``gain = (var + sqr) / (var / scale + sqr)`` with the true gradient
statistics at the job's progress ``p`` (from the validation file of the batch nearest ``M``),
and ``c`` the app's calibration factor (:mod:`sia_slurm.sim.apptruth`). The statistics change
with progress, so the rate does too, within a round. :func:`integrate` solves
``dp/dt = rate(p)`` with the explicit midpoint rule on sub-steps of at most ``max_substep``
seconds, which is exact for a constant rate and, on the artifact's traces, within 0.1% of a
100x finer integration for a whole job (``tests/sim/test_sim_cluster.py``). A job that reaches
its completion target inside a sub-step finishes at the time the sub-step's rate gets it there.

The statistics of every (app, validated batch) curve are concatenated into one table, each curve
shifted to its own range of the progress axis, so one ``np.interp`` serves every running job of
every app (:class:`StatsTable`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from sia_slurm.sim.gradstats import AppGradStats

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

DEFAULT_MAX_SUBSTEP = 10.0  # seconds


@dataclass(frozen=True, eq=False)
class StatsTable:
    """Every validation curve of every app, side by side on one progress axis.

    Curve ``i`` occupies ``[offset[i] + low[i], offset[i] + high[i]]`` of :attr:`x`; a query is
    clamped to its curve's range first, which reproduces the curves' hold-at-the-ends rule.
    """

    x: FloatArray
    grad_sqr: FloatArray
    grad_var: FloatArray
    offset: FloatArray  # per curve
    low: FloatArray  # per curve: first progress (M0-equivalent samples)
    high: FloatArray  # per curve: last progress
    curves: Mapping[tuple[str, int], int]  # (app, validated batch) -> curve index
    stats: Mapping[str, AppGradStats]

    @classmethod
    def build(cls, stats: Mapping[str, AppGradStats]) -> StatsTable:
        xs, sqrs, vars_, offsets, lows, highs = [], [], [], [], [], []
        curves: dict[tuple[str, int], int] = {}
        start = 0.0
        for app in sorted(stats):
            for batch, curve in stats[app].curves.items():
                offset = start - float(curve.progress[0])
                curves[(app, batch)] = len(offsets)
                xs.append(curve.progress + offset)
                sqrs.append(curve.grad_sqr)
                vars_.append(curve.grad_var)
                offsets.append(offset)
                lows.append(float(curve.progress[0]))
                highs.append(float(curve.progress[-1]))
                # Leave a gap so that neighbouring curves never share an abscissa.
                start = float(xs[-1][-1]) + 1.0 + 1e-6 * abs(float(xs[-1][-1]))
        if not offsets:  # no apps (no jobs): an empty table, never queried
            xs = sqrs = vars_ = [np.zeros(0)]
        return cls(
            x=np.concatenate(xs),
            grad_sqr=np.concatenate(sqrs),
            grad_var=np.concatenate(vars_),
            offset=np.array(offsets),
            low=np.array(lows),
            high=np.array(highs),
            curves=curves,
            stats=dict(stats),
        )

    def curve_index(self, app: str, batch_size: float) -> int:
        """The curve a job of ``app`` at ``batch_size`` follows (nearest validated batch)."""
        nearest = self.stats[app].curve_for(batch_size).batch_size
        return self.curves[(app, nearest)]

    def at(self, curve: IntArray, progress: FloatArray) -> tuple[FloatArray, FloatArray]:
        """(grad_sqr, grad_var at the app's M0) of each job on its curve at its progress."""
        query = np.clip(progress, self.low[curve], self.high[curve]) + self.offset[curve]
        return np.interp(query, self.x, self.grad_sqr), np.interp(query, self.x, self.grad_var)


def true_gain(grad_sqr: FloatArray, grad_var: FloatArray, scale: FloatArray) -> FloatArray:
    """AdaScale's gain ``(var + sqr) / (var / scale + sqr)`` (reference section 2)."""
    return (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)


@dataclass(frozen=True)
class Stepped:
    """The outcome of :func:`integrate` for each job."""

    progress: FloatArray  # at the end of the interval (or at completion)
    finish: FloatArray  # seconds into the interval at which the job completed; nan if not


def integrate(
    table: StatsTable,
    *,
    progress: FloatArray,
    base_rate: FloatArray,
    scale: FloatArray,
    curve: IntArray,
    target: FloatArray,
    duration: FloatArray,
    max_substep: float = DEFAULT_MAX_SUBSTEP,
) -> Stepped:
    """Advance every job for ``duration[j]`` seconds at ``rate = gain(p) * base_rate``.

    ``base_rate`` is ``M0 / (T_iter * calibration)``; ``target`` the completion progress. Jobs
    with ``duration`` 0 do not move. The midpoint rule on ``n`` equal sub-steps per job, ``n``
    the smallest count that keeps every sub-step within ``max_substep`` seconds.
    """
    p = np.array(progress, dtype=np.float64)
    finish = np.full(p.shape, np.nan)
    if p.size == 0:
        return Stepped(p, finish)
    longest = float(np.max(duration))
    steps = max(1, math.ceil(longest / max_substep - 1e-9))
    h = np.asarray(duration, dtype=np.float64) / steps
    done = np.zeros(p.shape, dtype=bool)
    elapsed = np.zeros(p.shape)
    for _ in range(steps):
        k1 = base_rate * true_gain(*table.at(curve, p), scale)
        k2 = base_rate * true_gain(*table.at(curve, p + 0.5 * h * k1), scale)
        reach = np.where(done, np.inf, (target - p) / k2)
        ends = ~done & (reach <= h)
        finish = np.where(ends, elapsed + reach, finish)
        p = np.where(done, p, np.where(ends, target, p + h * k2))
        done |= ends
        elapsed += h
        if done.all():
            break
    return Stepped(p, finish)
