"""Fitting a job's throughput-model parameters on one GPU type from measured steps.

Reference section 2, "Fitting". The objective is Pollux's: root-mean-square log error of the
predicted compute time and of the predicted synchronising-step time, plus two small regularisers,
minimised with L-BFGS-B under bounds. Parameters the observations cannot identify are pinned
(bounds collapsed) so the optimiser cannot invent them:

- no multi-node point               -> alpha_n, beta_n pinned at the lower bound
- no single-node multi-GPU point    -> alpha_r, beta_r pinned at the lower bound
- no point with K > 2               -> beta_n, beta_r pinned at the lower bound
- a single distinct local batch     -> alpha_c pinned at half the mean compute time (Pollux's
                                       choice: it makes the model optimistic about larger batches)

With only 1-GPU data every network term is pinned at ~0, so the model predicts linear scaling,
which is what Sia's bootstrap starts from.

The optimiser works on log(alpha), log(beta) (same bounds, mapped) and gamma: the alphas and betas
differ by orders of magnitude, and the log map makes one step size fit all of them. The gradient
is analytic (numpy), so no autograd dependency is needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from scipy.optimize import minimize

from sia_slurm.model.throughput import (
    GAMMA_BOUNDS,
    PARAM_LOWER_BOUND,
    FloatArray,
    ThroughputParams,
)
from sia_slurm.protocol.observation import Observation

# Regulariser weights (reference section 2).
GAMMA_REG = 1e-3
NETWORK_RATIO_REG = 1e-2
# Upper bound for alphas and betas (seconds). Not in the reference: the log parameterisation needs
# a finite box so a line search cannot overflow exp(); no real step takes 10^4 s per sample.
PARAM_UPPER_BOUND = 1e4
_RMS_EPS = 1e-12  # keeps the RMS differentiable when a fit is exact
_LOG_LO = float(np.log(PARAM_LOWER_BOUND))
_LOG_HI = float(np.log(PARAM_UPPER_BOUND))


@dataclass(frozen=True)
class _FitData:
    """Observations as arrays, with the masks the objective needs."""

    local_bsz: FloatArray
    extra_gpus: FloatArray  # max(K - 2, 0)
    multi_node: npt.NDArray[np.bool_]
    single_node_multi_gpu: npt.NDArray[np.bool_]
    log_compute: FloatArray
    log_step: FloatArray


def _prepare(
    nodes: npt.ArrayLike,
    gpus: npt.ArrayLike,
    local_bsz: npt.ArrayLike,
    step_time: npt.ArrayLike,
    sync_time: npt.ArrayLike,
) -> _FitData:
    n = np.asarray(nodes, dtype=np.int64).reshape(-1)
    k = np.asarray(gpus, dtype=np.int64).reshape(-1)
    m = np.asarray(local_bsz, dtype=np.float64).reshape(-1)
    step = np.asarray(step_time, dtype=np.float64).reshape(-1)
    sync = np.asarray(sync_time, dtype=np.float64).reshape(-1)
    if not (len(n) == len(k) == len(m) == len(step) == len(sync)) or len(n) == 0:
        raise ValueError("fit needs at least one observation and equally long arrays")
    if np.any(step <= 0) or np.any(m <= 0) or np.any(n < 1) or np.any(k < n):
        raise ValueError("fit needs positive step times and batch sizes and 1 <= nodes <= gpus")
    # A measured sync time at (or, from timer noise, above) the step time would leave no compute;
    # keep a sliver so the log stays finite rather than discarding the point.
    compute = np.maximum(step - sync, 1e-3 * step)
    return _FitData(
        local_bsz=m,
        extra_gpus=np.maximum(k - 2, 0).astype(np.float64),
        multi_node=n > 1,
        single_node_multi_gpu=(n == 1) & (k > 1),
        log_compute=np.log(compute),
        log_step=np.log(step),
    )


def _objective(z: FloatArray, data: _FitData) -> tuple[float, FloatArray]:
    """Loss and its gradient with respect to z = (log alpha/beta..., gamma)."""
    theta = np.exp(z[:6])
    a_c, b_c, a_n, b_n, a_r, b_r = theta
    g = z[6]
    m, x = data.local_bsz, data.extra_gpus
    t_c = a_c + b_c * m
    t_n = np.where(
        data.multi_node, a_n + b_n * x, np.where(data.single_node_multi_gpu, a_r + b_r * x, 0.0)
    )
    has_net = t_n > 0
    r = t_n / t_c
    r_g = np.power(r, g)
    log1p_rg = np.log1p(r_g)
    w = r_g / (1.0 + r_g)  # share of the network term in T_sync^gamma
    log_t_c = np.log(t_c)
    e_c = log_t_c - data.log_compute
    e_s = log_t_c + log1p_rg / g - data.log_step
    count = float(len(m))
    rms_c = np.sqrt(np.dot(e_c, e_c) / count + _RMS_EPS)
    rms_s = np.sqrt(np.dot(e_s, e_s) / count + _RMS_EPS)
    ratio_n = b_n / a_n
    ratio_r = b_r / a_r
    loss = (
        rms_c + rms_s + GAMMA_REG * (g - 1.0) ** 2 + NETWORK_RATIO_REG * (ratio_n**2 + ratio_r**2)
    )

    d_c = e_c / (count * rms_c)  # dL/d log T_c (first term)
    d_s = e_s / (count * rms_s)  # dL/d log T_sync
    grad_t_c = (d_c + d_s * (1.0 - w)) / t_c
    grad_t_n = np.where(has_net, d_s * w / np.where(has_net, t_n, 1.0), 0.0)
    log_r = np.log(np.where(has_net, r, 1.0))
    dlogts_dg = -log1p_rg / g**2 + np.where(has_net, w * log_r / g, 0.0)

    grad_n = grad_t_n * data.multi_node
    grad_r = grad_t_n * data.single_node_multi_gpu
    grad_theta = np.array(
        [
            grad_t_c.sum(),
            np.dot(grad_t_c, m),
            grad_n.sum() - 2 * NETWORK_RATIO_REG * ratio_n**2 / a_n,
            np.dot(grad_n, x) + 2 * NETWORK_RATIO_REG * ratio_n / a_n,
            grad_r.sum() - 2 * NETWORK_RATIO_REG * ratio_r**2 / a_r,
            np.dot(grad_r, x) + 2 * NETWORK_RATIO_REG * ratio_r / a_r,
        ]
    )
    grad = np.empty(7)
    grad[:6] = grad_theta * theta
    grad[6] = np.dot(d_s, dlogts_dg) + 2 * GAMMA_REG * (g - 1.0)
    return float(loss), grad


def _initial_guess(data: _FitData, compute: FloatArray, sync: FloatArray) -> FloatArray:
    """Data-driven start: least-squares compute line, mean measured sync times, gamma 1.5."""
    m = data.local_bsz
    floor = PARAM_LOWER_BOUND * 10
    if np.ptp(m) > 0:
        b_c, a_c = np.polyfit(m, compute, 1)
    else:
        a_c, b_c = compute.mean() / 2, compute.mean() / (2 * m.mean())
    mean_compute = float(compute.mean())
    a_c = max(float(a_c), 1e-2 * mean_compute)
    b_c = max(float(b_c), 1e-2 * mean_compute / float(m.mean()))

    def network_start(mask: npt.NDArray[np.bool_]) -> tuple[float, float]:
        if not mask.any():
            return floor, floor
        alpha = max(float(np.mean(sync[mask])), 1e-3 * mean_compute)
        return alpha, alpha / 10

    a_n, b_n = network_start(data.multi_node)
    a_r, b_r = network_start(data.single_node_multi_gpu)
    theta = np.maximum([a_c, b_c, a_n, b_n, a_r, b_r], floor)
    return np.concatenate([np.log(theta), [1.5]])


def _pinned(data: _FitData) -> set[int]:
    """Indices (into PARAM_NAMES) of the network parameters the data cannot identify."""
    pinned: set[int] = set()
    if not data.multi_node.any():
        pinned |= {2, 3}
    if not data.single_node_multi_gpu.any():
        pinned |= {4, 5}
    if not np.any(data.extra_gpus > 0):
        pinned |= {3, 5}
    return pinned


def fit_throughput_params(
    nodes: npt.ArrayLike,
    gpus: npt.ArrayLike,
    local_bsz: npt.ArrayLike,
    step_time: npt.ArrayLike,
    sync_time: npt.ArrayLike,
) -> ThroughputParams:
    """Fit one GPU type's model to measured (nodes, GPUs, local batch) -> (step, sync) points.

    Arrays are parallel, one entry per observation (see :class:`Observation` for what the times
    mean). Deterministic: the same points always give the same parameters.
    """
    data = _prepare(nodes, gpus, local_bsz, step_time, sync_time)
    step = np.exp(data.log_step)
    compute = np.exp(data.log_compute)
    sync = step - compute
    z0 = _initial_guess(data, compute, sync)
    pinned = _pinned(data)
    bounds = [(_LOG_LO, _LOG_HI)] * 6 + [GAMMA_BOUNDS]
    for i in pinned:
        bounds[i] = (_LOG_LO, _LOG_LO)
    if np.ptp(data.local_bsz) == 0:
        pinned_alpha_c = float(np.log(max(compute.mean() / 2, PARAM_LOWER_BOUND)))
        bounds[0] = (pinned_alpha_c, pinned_alpha_c)
    z0 = np.clip(z0, [b[0] for b in bounds], [b[1] for b in bounds])
    result = minimize(
        _objective,
        z0,
        args=(data,),
        jac=True,
        method="L-BFGS-B",
        bounds=bounds,
        options={"maxiter": 500, "ftol": 1e-10, "gtol": 1e-8},
    )
    theta = np.exp(np.clip(result.x[:6], _LOG_LO, _LOG_HI))
    gamma = float(np.clip(result.x[6], *GAMMA_BOUNDS))
    a_c, b_c, a_n, b_n, a_r, b_r = (float(v) for v in theta)
    if 2 in pinned:
        # No multi-node data: assume spreading over nodes costs at least what intra-node
        # synchronisation costs, instead of the pinned ~0 that would make it look free.
        a_n, b_n = max(a_n, a_r), max(b_n, b_r)
    return ThroughputParams(a_c, b_c, a_n, b_n, a_r, b_r, gamma)


def fit_observations(observations: Sequence[Observation]) -> ThroughputParams:
    """:func:`fit_throughput_params` over :class:`Observation` objects (one GPU type)."""
    if not observations:
        raise ValueError("fit needs at least one observation")
    return fit_throughput_params(
        [o.nodes for o in observations],
        [o.gpus for o in observations],
        [o.local_bsz for o in observations],
        [o.step_time for o in observations],
        [o.sync_time for o in observations],
    )
