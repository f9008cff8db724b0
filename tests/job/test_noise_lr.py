"""Gradient noise statistics (formulas, smoothing, the 1-replica case) and LR scaling rules."""

from __future__ import annotations

import math

import pytest
import torch

from sia_slurm.job.elastic.lr import LRScaling
from sia_slurm.job.elastic.noise import GradientNoise, estimate


def direct(gradients: list[torch.Tensor], sample_batch: float, m0: float) -> tuple[float, float]:
    """Reference section 2 written out with plain tensors."""
    c = len(gradients)
    mean = torch.stack(gradients).mean(0)
    sqr_of_mean = float(mean.dot(mean))
    mean_of_sqr = sum(float(g.dot(g)) for g in gradients) / c
    scale = c * sample_batch / m0  # M / M0
    return (c * sqr_of_mean - mean_of_sqr) / (c - 1), (mean_of_sqr - sqr_of_mean) * scale / (c - 1)


def test_estimate_is_the_reference_formula() -> None:
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(10, generator=gen, dtype=torch.float64) + 1.0 for _ in range(6)]
    mean = torch.stack(grads).mean(0)
    got = estimate(float(mean.dot(mean)), sum(float(g.dot(g)) for g in grads) / 6, 6, 4.0, 8.0)
    assert got == pytest.approx(direct(grads, 4.0, 8.0), rel=1e-12)


def test_estimates_are_unbiased_for_known_gradient_noise() -> None:
    """True gradient G, per-sample noise variance s2 per coordinate: grad_sqr -> |G|^2 and
    grad_var -> d * s2 / M0 (the variance of a batch-M0 gradient)."""
    gen = torch.Generator().manual_seed(1)
    d, c, b, m0, s2 = 20, 4, 8, 16, 3.0
    true = torch.linspace(-1, 1, d, dtype=torch.float64)
    sqr, var = [], []
    for _ in range(3000):
        grads = [true + torch.randn(d, generator=gen, dtype=torch.float64) * math.sqrt(s2 / b)]
        grads += [
            true + torch.randn(d, generator=gen, dtype=torch.float64) * math.sqrt(s2 / b)
            for _ in range(c - 1)
        ]
        mean = torch.stack(grads).mean(0)
        a = float(mean.dot(mean))
        e = estimate(a, sum(float(g.dot(g)) for g in grads) / c, c, b, m0)
        sqr.append(e[0])
        var.append(e[1])
    assert sum(sqr) / len(sqr) == pytest.approx(float(true.dot(true)), rel=0.05)
    assert sum(var) / len(var) == pytest.approx(d * s2 / m0, rel=0.05)


# A synthetic problem whose per-example gradients have a known distribution: the loss of example
# z_i is |w - z_i|^2 / 2 with z_i ~ N(0, S2 I) in D dimensions, so at a fixed w the gradient of a
# batch of b is w - mean(z), with mean w (|E g|^2 = |w|^2) and variance S2 / b per coordinate; the
# variance of a batch-M0 gradient, what grad_var estimates, is D * S2 / M0.
D, S2, SAMPLE_BATCH, M0, STEPS = 200, 1.0, 32, 8, 400
TRUE_SQR, TRUE_VAR = 4.0, D * S2 / M0


def batch_gradient(w: torch.nn.Parameter, gen: torch.Generator, size: int) -> torch.Tensor:
    z = torch.randn(size, D, generator=gen, dtype=torch.float64) * math.sqrt(S2)
    w.grad = None
    (0.5 * ((w - z) ** 2).sum(1).mean()).backward()
    assert w.grad is not None
    return w.grad.detach().clone()


@pytest.mark.parametrize("micro_batches", [1, 4])
def test_smoothed_statistics_match_a_problem_with_known_gradient_noise(micro_batches: int) -> None:
    """Real autograd gradients at a fixed w, through the trainer's two paths: one gradient per
    step (consecutive steps differenced) or 4 micro-batch gradients per step.

    Tolerance: over 40 seeds the smoothed estimates (decay 0.95, 400 steps) had relative
    standard deviations of 3.2% (grad_sqr) and 1.8% (grad_var) with one gradient per step, 1.7%
    and 0.9% with four; 12% is over 3.7 of those deviations, and still catches a missing
    c / (c - 1) (x2 or x4/3), a b / M0 mix-up (x4 or x16) or a wrong batch in the 1-gradient
    path."""
    gen = torch.Generator().manual_seed(7)
    w = torch.nn.Parameter(torch.full((D,), math.sqrt(TRUE_SQR / D), dtype=torch.float64))
    noise = GradientNoise(M0, decay=0.95)
    for _ in range(STEPS):
        if micro_batches == 1:
            noise.observe_single(batch_gradient(w, gen, SAMPLE_BATCH), SAMPLE_BATCH)
            continue
        grads = [batch_gradient(w, gen, SAMPLE_BATCH) for _ in range(micro_batches)]
        mean = torch.stack(grads).mean(0)
        mean_of_sqr = sum(float(g.dot(g)) for g in grads) / micro_batches
        noise.observe(float(mean.dot(mean)), mean_of_sqr, micro_batches, SAMPLE_BATCH)
    assert noise.samples == (STEPS - 1 if micro_batches == 1 else STEPS)
    assert noise.grad_sqr == pytest.approx(TRUE_SQR, rel=0.12)
    assert noise.grad_var == pytest.approx(TRUE_VAR, rel=0.12)


def test_smoothing_is_a_bias_corrected_moving_average_clipped_when_read() -> None:
    noise = GradientNoise(init_batch_size=8, decay=0.5)
    assert not noise.known and noise.grad_sqr == 0.0 and noise.gain(64) == 1.0
    noise.observe(1.0, 2.0, 2, 4)  # sqr = 0, var = (2-1)*2*4/8 = 1
    assert (noise.grad_sqr, noise.grad_var) == pytest.approx((0.0, 1.0))
    noise.observe(3.0, 3.0, 2, 4)  # sqr = 3, var = 0
    # weights 0.5*0.5 and 0.5 over total weight 0.75
    assert noise.grad_sqr == pytest.approx((0.25 * 0 + 0.5 * 3) / 0.75)
    assert noise.grad_var == pytest.approx((0.25 * 1 + 0.5 * 0) / 0.75)
    noise.observe(-10.0, 0.0, 2, 4)  # sqr = -20, var = (0+10)*2*4/8 = 10
    # weights 0.125, 0.25, 0.5 over 0.875: the mean grad_sqr is negative and reads as 0, the
    # variance goes on averaging
    assert noise.grad_sqr == 0.0
    assert noise.grad_var == pytest.approx((0.125 * 1 + 0.25 * 0 + 0.5 * 10) / 0.875)


def test_single_replica_differences_consecutive_gradients() -> None:
    noise = GradientNoise(init_batch_size=4, decay=0.0)
    g1, g2 = torch.tensor([1.0, 2.0]), torch.tensor([3.0, 0.0])
    noise.observe_single(g1, batch_size=8)
    assert not noise.known
    noise.observe_single(g2, batch_size=8)
    expected = direct([g1.double(), g2.double()], sample_batch=8, m0=4)
    assert (noise.grad_sqr, noise.grad_var) == pytest.approx((max(expected[0], 0), expected[1]))
    noise.observe_single(g1, batch_size=16)  # a different batch: not comparable, no estimate
    assert noise.samples == 1


def test_state_round_trip_and_renormalisation_to_another_m0() -> None:
    noise = GradientNoise(init_batch_size=8, decay=0.9)
    noise.observe(1.0, 3.0, 4, 2)
    restored = GradientNoise(init_batch_size=8)
    restored.load_state_dict(noise.state_dict())
    assert (restored.grad_sqr, restored.grad_var) == (noise.grad_sqr, noise.grad_var)
    other = GradientNoise(init_batch_size=16)
    other.load_state_dict(noise.state_dict())
    assert other.grad_var == pytest.approx(noise.grad_var / 2)  # variance of a 2x larger batch
    assert other.grad_sqr == noise.grad_sqr


def test_adascale_gain_matches_the_reference() -> None:
    noise = GradientNoise(init_batch_size=10, decay=0.0)
    noise.observe(5.0, 5.0 + 2.0 / 3.0, 4, 2.5)  # sqr, var chosen through the formula
    sqr, var = noise.grad_sqr, noise.grad_var
    scale = 40 / 10
    assert noise.gain(40) == pytest.approx((var + sqr) / (var / scale + sqr))
    assert 1.0 <= noise.gain(40) <= scale


@pytest.mark.parametrize(("rule", "expected"), [("sqrt", 2.0), ("linear", 4.0), ("none", 1.0)])
def test_lr_rules(rule: str, expected: float) -> None:
    assert LRScaling(rule, 16).factor(64, GradientNoise(16)) == pytest.approx(expected)


def test_adascale_rule_uses_the_gain_and_the_factor_is_undone_after_the_step() -> None:
    noise = GradientNoise(16, decay=0.0)
    noise.observe(1.0, 2.0, 2, 32)
    scaling = LRScaling("adascale", 16)
    assert scaling.factor(64, noise) == pytest.approx(noise.gain(64))
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=0.1)
    param.grad = torch.ones(1)
    with scaling.applied(optimizer, 3.0):
        assert optimizer.param_groups[0]["lr"] == pytest.approx(0.3)
        optimizer.step()
    assert optimizer.param_groups[0]["lr"] == 0.1
    assert float(param.detach()) == pytest.approx(-0.3)
    with pytest.raises(ValueError, match="expected one of adascale"):
        LRScaling("cubic", 16)
