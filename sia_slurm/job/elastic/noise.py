"""Gradient noise statistics ``grad_sqr`` and ``grad_var`` measured during training.

Reference section 2: from ``c`` independent gradient samples ``g_i`` of a step (one per
replica and micro-batch), each over ``b`` samples,

    grad_sqr = (c * |mean g|^2 - mean |g_i|^2) / (c - 1)                estimates |E g|^2
    grad_var = (mean |g_i|^2 - |mean g|^2) * c / (c - 1) * b / M0       variance at batch M0

For ``c`` micro-batches of the global batch ``M`` (``b = M / c``) the second line is the
reference's ``(mean|g_i|^2 - |mean g|^2) * scale / (c - 1)`` with ``scale = M / M0``. With one
replica and no accumulation a step has a single gradient; then two consecutive steps serve as
the two samples (``c = 2``, ``b = M``), as Pollux does. Per-step estimates are noisy (they may
be negative), so they are smoothed by an exponential moving average with bias correction, and
clipped at zero only when reported. The statistics describe the model and data, not the
hardware, so they survive a move to another GPU type and are kept in the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


def estimate(
    sqr_norm_of_mean: float,
    mean_of_sqr_norms: float,
    count: int,
    sample_batch: float,
    init_batch_size: float,
) -> tuple[float, float]:
    """One step's raw ``(grad_sqr, grad_var)`` from ``count`` gradient samples (see module)."""
    if count < 2:
        raise ValueError(f"count: expected at least 2 gradient samples, got {count}")
    c = float(count)
    grad_sqr = (c * sqr_norm_of_mean - mean_of_sqr_norms) / (c - 1.0)
    grad_var = (mean_of_sqr_norms - sqr_norm_of_mean) * c / (c - 1.0) * sample_batch
    return grad_sqr, grad_var / init_batch_size


@dataclass
class _Ema:
    """Bias-corrected exponential moving average (Adam's correction)."""

    decay: float
    total: float = 0.0
    weight: float = 0.0

    def update(self, value: float) -> None:
        self.total = self.decay * self.total + (1.0 - self.decay) * value
        self.weight = self.decay * self.weight + (1.0 - self.decay)

    @property
    def value(self) -> float:
        return self.total / self.weight if self.weight > 0 else math.nan


class GradientNoise:
    """Smoothed gradient noise statistics of one job, normalised to its M0."""

    def __init__(self, init_batch_size: int, decay: float = 0.95):
        if init_batch_size < 1:
            raise ValueError(f"init_batch_size: expected >= 1, got {init_batch_size}")
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"decay: expected a number in [0, 1), got {decay!r}")
        self.init_batch_size = init_batch_size
        self._sqr = _Ema(decay)
        self._var = _Ema(decay)
        self.samples = 0  # steps that contributed an estimate
        self._previous: torch.Tensor | None = None  # last gradient, for the 1-replica case
        self._previous_batch = 0

    @property
    def known(self) -> bool:
        return self.samples > 0

    @property
    def grad_sqr(self) -> float:
        """Smoothed ``grad_sqr`` clipped at 0 (0 before any estimate)."""
        return max(self._sqr.value, 0.0) if self.known else 0.0

    @property
    def grad_var(self) -> float:
        """Smoothed ``grad_var`` clipped at 0 (0 before any estimate)."""
        return max(self._var.value, 0.0) if self.known else 0.0

    def observe(
        self, sqr_norm_of_mean: float, mean_of_sqr_norms: float, count: int, sample_batch: float
    ) -> None:
        """Add a step with ``count >= 2`` gradient samples of ``sample_batch`` samples each."""
        grad_sqr, grad_var = estimate(
            sqr_norm_of_mean, mean_of_sqr_norms, count, sample_batch, self.init_batch_size
        )
        if math.isfinite(grad_sqr) and math.isfinite(grad_var):
            self._sqr.update(grad_sqr)
            self._var.update(grad_var)
            self.samples += 1

    def observe_single(self, gradient: torch.Tensor, batch_size: int) -> None:
        """Add a step that has one gradient only (1 replica, no accumulation): difference it
        with the previous such step of the same batch size."""
        current = gradient.detach().to(torch.float64)
        previous = self._previous
        if previous is not None and self._previous_batch == batch_size:
            mean = (previous + current) / 2.0
            sqr_norm_of_mean = float(mean.dot(mean))
            mean_of_sqr_norms = (float(previous.dot(previous)) + float(current.dot(current))) / 2
            self.observe(sqr_norm_of_mean, mean_of_sqr_norms, 2, float(batch_size))
        self._previous = current.clone()
        self._previous_batch = batch_size

    def forget_previous(self) -> None:
        """Drop the stored gradient (the model changed under it, e.g. after a restore)."""
        self._previous = None

    def gain(self, batch_size: int) -> float:
        """AdaScale gain of ``batch_size`` relative to M0 (1 while nothing is measured)."""
        scale = batch_size / self.init_batch_size
        sqr, var = self.grad_sqr, self.grad_var
        denom = var / scale + sqr
        return (var + sqr) / denom if self.known and denom > 0 else 1.0

    def state_dict(self) -> dict[str, Any]:
        return {
            "init_batch_size": self.init_batch_size,
            "decay": self._sqr.decay,
            "sqr": [self._sqr.total, self._sqr.weight],
            "var": [self._var.total, self._var.weight],
            "samples": self.samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._sqr = _Ema(float(state["decay"]), *map(float, state["sqr"]))
        self._var = _Ema(float(state["decay"]), *map(float, state["var"]))
        self.samples = int(state["samples"])
        if int(state["init_batch_size"]) != self.init_batch_size:
            # Statistics are normalised to M0: re-express them for this job's M0.
            factor = int(state["init_batch_size"]) / self.init_batch_size
            self._var.total *= factor
        self.forget_previous()
