"""Statistical efficiency: how much training progress a sample is worth at batch size M.

Reference section 2 (Pollux, after AdaScale and the gradient noise scale). With ``scale = M/M0``

    gain       = (grad_var + grad_sqr) / (grad_var / scale + grad_sqr)
    efficiency = gain / scale  =  (phi + M0) / (phi + M),   phi = M0 * grad_var / grad_sqr

so a noisy gradient (large ``grad_var`` relative to ``grad_sqr``) makes larger batches nearly as
sample-efficient as M0, and a clean one makes them wasteful. The statistics describe the model
and data, not the hardware, so one :class:`GradientStats` serves every GPU type of a job.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True)
class GradientStats:
    """Gradient statistics of a job, normalised to its initial batch size M0.

    ``grad_sqr`` estimates |E g|^2 and ``grad_var`` the variance of a mini-batch gradient at
    batch M0. Both are estimates and may come out slightly negative from noise; they are clipped at
    zero on construction because a negative square or variance has no meaning.
    """

    grad_sqr: float
    grad_var: float

    def __post_init__(self) -> None:
        for name in ("grad_sqr", "grad_var"):
            value = getattr(self, name)
            if not np.isfinite(value):
                raise ValueError(f"{name}: expected a finite number, got {value!r}")
            object.__setattr__(self, name, max(float(value), 0.0))


# Before a job has measured anything, assume no benefit from larger batches (phi = 0): the
# optimiser then keeps the batch near M0, the conservative choice Pollux also starts from.
NO_STATS = GradientStats(grad_sqr=1.0, grad_var=0.0)


def gain(stats: GradientStats, init_batch_size: float, batch_size: npt.ArrayLike) -> FloatArray:
    """AdaScale gain: progress of one step at batch M relative to one step at M0."""
    scale = np.asarray(batch_size, dtype=np.float64) / float(init_batch_size)
    denom = stats.grad_var / scale + stats.grad_sqr
    numer = stats.grad_var + stats.grad_sqr
    # Both statistics zero: nothing is known, treat a step as worth one M0 step.
    return np.where(denom > 0, numer / np.where(denom > 0, denom, 1.0), 1.0)


def efficiency(
    stats: GradientStats, init_batch_size: float, batch_size: npt.ArrayLike
) -> FloatArray:
    """Progress per sample at batch M relative to M0: ``gain / scale``."""
    return efficiency_of(stats.grad_sqr, stats.grad_var, init_batch_size, batch_size)


def efficiency_of(
    grad_sqr: npt.ArrayLike,
    grad_var: npt.ArrayLike,
    init_batch_size: npt.ArrayLike,
    batch_size: npt.ArrayLike,
) -> FloatArray:
    """:func:`efficiency` on raw (broadcastable) arrays, for evaluating many jobs at once."""
    slope, offset = efficiency_coefficients(grad_sqr, grad_var, init_batch_size)
    return 1.0 / (offset + slope * np.asarray(batch_size, dtype=np.float64))


def efficiency_coefficients(
    grad_sqr: npt.ArrayLike, grad_var: npt.ArrayLike, init_batch_size: npt.ArrayLike
) -> tuple[FloatArray, FloatArray]:
    """(a, b) with ``efficiency(M) = 1 / (b + a * M)``.

    Dividing ``(grad_var + grad_sqr) / (grad_var + grad_sqr * M / M0)`` through by its numerator
    gives ``a = grad_sqr / (M0 * (grad_var + grad_sqr))`` and ``b = grad_var / (grad_var +
    grad_sqr)``: two numbers per job, then one multiply-add and one division per batch candidate,
    which is what the batch optimiser evaluates on every candidate. With both statistics zero
    nothing is known: treated as no noise (efficiency M0/M), like :func:`gain`'s fallback.
    """
    sqr = np.asarray(grad_sqr, dtype=np.float64)
    var = np.asarray(grad_var, dtype=np.float64)
    total = var + sqr
    known = total > 0
    sqr = np.where(known, sqr, 1.0)
    total = np.where(known, total, 1.0)
    return sqr / (np.asarray(init_batch_size, dtype=np.float64) * total), var / total


def estimate_grad_stats(
    sqr_norm_of_mean: float,
    mean_of_sqr_norms: float,
    count: int,
    scale: float,
) -> GradientStats:
    """One-step estimate of the statistics from ``count`` independent gradient samples.

    ``sqr_norm_of_mean`` is |mean_i g_i|^2 and ``mean_of_sqr_norms`` is mean_i |g_i|^2 over
    c = replicas x accumulation steps micro-batch gradients; ``scale`` = M / M0 normalises the
    variance to batch M0 (reference section 2). Callers smooth successive estimates with
    :func:`smooth_grad_stats`.
    """
    if count < 2:
        raise ValueError(f"count: expected at least 2 gradient samples, got {count}")
    c = float(count)
    grad_sqr = (c * sqr_norm_of_mean - mean_of_sqr_norms) / (c - 1.0)
    grad_var = (mean_of_sqr_norms - sqr_norm_of_mean) * scale / (c - 1.0)
    return GradientStats(grad_sqr=grad_sqr, grad_var=grad_var)


def smooth_grad_stats(
    previous: GradientStats | None, current: GradientStats, decay: float = 0.9
) -> GradientStats:
    """Exponential moving average of estimates (``decay`` weight on the previous value)."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"decay: expected a number in [0, 1), got {decay!r}")
    if previous is None:
        return current
    return GradientStats(
        grad_sqr=decay * previous.grad_sqr + (1.0 - decay) * current.grad_sqr,
        grad_var=decay * previous.grad_var + (1.0 - decay) * current.grad_var,
    )
