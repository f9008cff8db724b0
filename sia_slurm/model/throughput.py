"""Pollux's throughput model: step time of a data-parallel job from its shape.

Reference section 2. A job on ``K`` GPUs over ``n`` nodes, with per-GPU (atomic) batch ``m`` and
``s`` extra gradient-accumulation micro-batches, spends

    T_compute = alpha_c + beta_c * m                       per micro-batch
    T_network = alpha_n + beta_n * max(K-2, 0)             if n > 1
              = alpha_r + beta_r * max(K-2, 0)             if n == 1 and K > 1
              = 0                                          if K == 1
    T_sync    = (T_compute^gamma + T_network^gamma)^(1/gamma)
    T_iter    = s * T_compute + T_sync

per optimizer step, which processes ``M = K * m * (s + 1)`` samples. ``gamma`` in [1, 10] says how
well gradient synchronisation overlaps the backward pass (1: not at all, large: fully).

Every function here is pure numpy and broadcasts: the same code predicts one shape, a job's row of
configurations, or a (configurations x batch-size candidates) grid, which is what the batch-size
optimisation needs to stay loop-free.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
FloatArray = npt.NDArray[np.float64]

PARAM_NAMES: tuple[str, ...] = (
    "alpha_c",
    "beta_c",
    "alpha_n",
    "beta_n",
    "alpha_r",
    "beta_r",
    "gamma",
)
GAMMA_BOUNDS: tuple[float, float] = (1.0, 10.0)
PARAM_LOWER_BOUND = 1e-8  # alpha/beta lower bound, as in the reference (avoids log(0))


@dataclass(frozen=True)
class ThroughputParams:
    """Fitted throughput-model parameters of one job on one GPU type (times in seconds).

    Constructed values are validated, so a model that predicts a negative or infinite step time
    cannot exist.
    """

    alpha_c: float
    beta_c: float
    alpha_n: float
    beta_n: float
    alpha_r: float
    beta_r: float
    gamma: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not np.isfinite(value) or value < 0:
                raise ValueError(f"{f.name}: expected a finite number >= 0, got {value!r}")
        lo, hi = GAMMA_BOUNDS
        if not lo <= self.gamma <= hi:
            raise ValueError(f"gamma: expected a number in [{lo}, {hi}], got {self.gamma!r}")
        if self.alpha_c + self.beta_c <= 0:
            raise ValueError("alpha_c + beta_c: expected a positive compute time, got 0")

    def to_array(self) -> FloatArray:
        """The parameters in ``PARAM_NAMES`` order (the optimiser's vector layout)."""
        return np.array([getattr(self, name) for name in PARAM_NAMES], dtype=np.float64)

    @classmethod
    def from_array(cls, values: ArrayLike) -> ThroughputParams:
        """Inverse of :meth:`to_array`."""
        arr = np.asarray(values, dtype=np.float64).reshape(-1)
        if arr.shape != (len(PARAM_NAMES),):
            raise ValueError(f"expected {len(PARAM_NAMES)} parameters, got shape {arr.shape}")
        return cls(*(float(v) for v in arr))


@dataclass(frozen=True)
class StackedParams:
    """Parameters of several models as arrays, one entry per configuration.

    Lets one broadcast expression evaluate a job's whole row of configurations even though the
    configurations use different GPU types (hence different models). Each field has the shape
    given to :meth:`stack` (``(C,)`` by default, ``(C, 1)`` for a grid over candidates).
    """

    alpha_c: FloatArray
    beta_c: FloatArray
    alpha_n: FloatArray
    beta_n: FloatArray
    alpha_r: FloatArray
    beta_r: FloatArray
    gamma: FloatArray

    @classmethod
    def stack(
        cls, params: Sequence[ThroughputParams], shape: tuple[int, ...] | None = None
    ) -> StackedParams:
        """Stack per-configuration parameters; ``shape`` reshapes every field (e.g. ``(C, 1)``)."""
        table = np.array([p.to_array() for p in params], dtype=np.float64).reshape(
            len(params), len(PARAM_NAMES)
        )
        return cls.from_table(table, shape)

    @classmethod
    def from_table(
        cls, table: npt.ArrayLike, shape: tuple[int, ...] | None = None
    ) -> StackedParams:
        """From a (C, 7) array of parameter rows in ``PARAM_NAMES`` order."""
        rows = np.asarray(table, dtype=np.float64).reshape(-1, len(PARAM_NAMES))
        target = shape if shape is not None else (len(rows),)
        return cls(*(rows[:, i].reshape(target) for i in range(len(PARAM_NAMES))))


Params = ThroughputParams | StackedParams


def compute_time(params: Params, local_bsz: ArrayLike) -> FloatArray:
    """T_compute: forward+backward time of one micro-batch of ``local_bsz`` samples per GPU."""
    return params.alpha_c + params.beta_c * np.asarray(local_bsz, dtype=np.float64)


def network_time(params: Params, nodes: ArrayLike, gpus: ArrayLike) -> FloatArray:
    """T_network: gradient all-reduce time; inter-node terms when the job spans nodes."""
    n = np.asarray(nodes)
    k = np.asarray(gpus)
    extra = np.maximum(k - 2, 0).astype(np.float64)
    inter = params.alpha_n + params.beta_n * extra
    intra = params.alpha_r + params.beta_r * extra
    return np.where(n > 1, inter, np.where(k > 1, intra, 0.0))


def sync_time(
    params: Params, nodes: ArrayLike, gpus: ArrayLike, local_bsz: ArrayLike
) -> FloatArray:
    """T_sync: time of the synchronising micro-batch, compute overlapped with all-reduce.

    Computed as ``T_c * (1 + (T_n/T_c)^gamma)^(1/gamma)``, algebraically the reference formula but
    without overflow for large gamma.
    """
    t_c = compute_time(params, local_bsz)
    t_n = network_time(params, nodes, gpus)
    gamma = params.gamma
    ratio = t_n / t_c
    return t_c * np.power(1.0 + np.power(ratio, gamma), 1.0 / gamma)


def step_time(
    params: Params,
    nodes: ArrayLike,
    gpus: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> FloatArray:
    """T_iter: time of one optimizer step, ``s`` accumulation micro-batches plus the sync one."""
    s = np.asarray(accum_steps, dtype=np.float64)
    return s * compute_time(params, local_bsz) + sync_time(params, nodes, gpus, local_bsz)


def global_batch_size(
    gpus: ArrayLike, local_bsz: ArrayLike, accum_steps: ArrayLike = 0
) -> FloatArray:
    """M = K * m * (s + 1): samples per optimizer step."""
    return (
        np.asarray(gpus, dtype=np.float64)
        * np.asarray(local_bsz, dtype=np.float64)
        * (np.asarray(accum_steps, dtype=np.float64) + 1.0)
    )


def throughput(
    params: Params,
    nodes: ArrayLike,
    gpus: ArrayLike,
    local_bsz: ArrayLike,
    accum_steps: ArrayLike = 0,
) -> FloatArray:
    """Samples per second: M / T_iter."""
    return global_batch_size(gpus, local_bsz, accum_steps) / step_time(
        params, nodes, gpus, local_bsz, accum_steps
    )
