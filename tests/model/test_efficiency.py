"""Statistical efficiency (reference section 2) against hand-computed values."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sia_slurm.model.efficiency import (
    NO_STATS,
    GradientStats,
    efficiency,
    estimate_grad_stats,
    gain,
    smooth_grad_stats,
)


def test_hand_computed_gain_and_efficiency() -> None:
    # M0 = 100, M = 400: scale 4, gain = (6+2)/(6/4+2) = 8/3.5; efficiency = gain/4 = 4/7.
    stats = GradientStats(grad_sqr=2.0, grad_var=6.0)
    assert gain(stats, 100, 400) == pytest.approx(8 / 3.5)
    assert efficiency(stats, 100, 400) == pytest.approx(4 / 7)
    # phi = M0 * var / sqr = 300: (phi + M0) / (phi + M) = 400 / 700.
    assert efficiency(stats, 100, 400) == pytest.approx(400 / 700)


def test_efficiency_is_one_at_the_initial_batch() -> None:
    assert efficiency(GradientStats(3.0, 7.0), 128, 128) == pytest.approx(1.0)


@given(
    grad_sqr=st.floats(1e-6, 1e3),
    grad_var=st.floats(0.0, 1e3),
    init=st.integers(1, 4096),
    factor=st.floats(1.0, 64.0),
)
def test_identity_gain_over_scale_equals_phi_form(
    grad_sqr: float, grad_var: float, init: int, factor: float
) -> None:
    stats = GradientStats(grad_sqr, grad_var)
    batch = init * factor
    phi = init * grad_var / grad_sqr
    expected = (phi + init) / (phi + batch)
    assert gain(stats, init, batch) / (batch / init) == pytest.approx(expected, rel=1e-9)
    assert efficiency(stats, init, batch) == pytest.approx(expected, rel=1e-9)
    assert 0 < efficiency(stats, init, batch) <= 1 + 1e-12


def test_limits_pure_noise_and_no_noise() -> None:
    # No signal at all (grad_sqr = 0): every sample counts, efficiency 1 at any batch.
    assert efficiency(GradientStats(0.0, 5.0), 100, 1600) == pytest.approx(1.0)
    # No noise: a larger batch is wasted, efficiency M0/M.
    assert efficiency(NO_STATS, 100, 1600) == pytest.approx(1 / 16)


def test_efficiency_vectorises() -> None:
    stats = GradientStats(1.0, 10.0)
    batches = np.array([100, 200, 400])
    np.testing.assert_allclose(
        efficiency(stats, 100, batches), [(1000 + 100) / (1000 + b) for b in batches]
    )


def test_negative_estimates_are_clipped_and_nan_rejected() -> None:
    assert GradientStats(-0.1, 2.0).grad_sqr == 0.0
    with pytest.raises(ValueError, match="grad_var"):
        GradientStats(1.0, float("nan"))


def test_estimate_from_replica_gradients() -> None:
    # Two replicas with gradients g1 = (1, 0), g2 = (3, 0): |mean|^2 = 4, mean|g|^2 = 5.
    stats = estimate_grad_stats(sqr_norm_of_mean=4.0, mean_of_sqr_norms=5.0, count=2, scale=1.0)
    assert stats.grad_sqr == pytest.approx((2 * 4 - 5) / 1)
    assert stats.grad_var == pytest.approx(5 - 4)
    with pytest.raises(ValueError, match="count"):
        estimate_grad_stats(1.0, 1.0, 1, 1.0)


def test_smoothing() -> None:
    first = GradientStats(1.0, 1.0)
    assert smooth_grad_stats(None, first) == first
    smoothed = smooth_grad_stats(first, GradientStats(3.0, 5.0), decay=0.5)
    assert (smoothed.grad_sqr, smoothed.grad_var) == (2.0, 3.0)
