"""Batch-size optimisation: candidates, splitting into accumulation steps, argmax of goodput."""

from __future__ import annotations

import numpy as np
import pytest

from sia_slurm.model.batch import (
    BatchLimits,
    candidate_batch_sizes,
    optimize_batch_size,
    split_batch,
    throughput_grid,
)
from sia_slurm.model.efficiency import NO_STATS, GradientStats, efficiency
from sia_slurm.model.throughput import StackedParams, ThroughputParams, throughput

T4 = ThroughputParams(0.02, 0.0006, 0.05, 0.004, 0.01, 0.002, 2.0)
A100 = ThroughputParams(0.03, 0.0001, 0.04, 0.002, 0.008, 0.001, 1.5)
LIMITS = BatchLimits(init_batch_size=128, max_batch_size=4096, min_local_bsz=32)
STATS = GradientStats(grad_sqr=1.0, grad_var=20.0)


def stacked(*params: ThroughputParams) -> StackedParams:
    return StackedParams.stack(list(params), (len(params), 1))


def test_candidates_are_geometric_between_the_bounds() -> None:
    grid, feasible = candidate_batch_sizes(np.array([1, 8]), LIMITS, 50)
    assert grid.shape == (2, 50) and feasible.all()
    # K = 1: from M0 = 128; K = 8: from min_local_bsz * K = 256; both up to max_batch_size.
    assert grid[0, 0] == pytest.approx(128) and grid[1, 0] == pytest.approx(256)
    np.testing.assert_allclose(grid[:, -1], 4096)
    ratios = grid[:, 1:] / grid[:, :-1]
    np.testing.assert_allclose(ratios, ratios[:, :1] * np.ones_like(ratios))


def test_too_many_gpus_for_the_batch_range_is_infeasible() -> None:
    # 256 GPUs x 32 samples = 8192 > max_batch_size.
    _, feasible = candidate_batch_sizes(np.array([128, 256]), LIMITS)
    assert feasible.tolist() == [True, False]


@pytest.mark.parametrize(
    ("batch", "gpus", "limit", "expected"),
    [
        (2048, 2, 1024, (1024, 0)),  # fits exactly: no accumulation
        (3000, 2, 1024, (750, 1)),  # 1500 per GPU -> two micro-batches of 750
        (1000, 3, 1000, (334, 0)),  # rounds the per-GPU batch up
        (4096, 1, 1000, (820, 4)),  # five micro-batches of 820 on one GPU
    ],
)
def test_split_uses_fewest_accumulation_steps(
    batch: int, gpus: int, limit: int, expected: tuple[int, int]
) -> None:
    local, accum = split_batch(batch, gpus, limit)
    assert (int(local), int(accum)) == expected
    assert local <= limit


def brute_force(params: ThroughputParams, nodes: int, gpus: int, limit: int) -> tuple[float, int]:
    """Scalar loop over the same candidates: the reference the vectorised code must match."""
    grid, _ = candidate_batch_sizes(np.array([gpus]), LIMITS)
    best = (0.0, 0)
    for batch in grid[0]:
        per_gpu = batch / gpus
        micro = max(int(np.ceil(per_gpu / limit - 1e-8)), 1)
        local = int(np.ceil(per_gpu / micro - 1e-8))
        if gpus * local * micro > LIMITS.max_batch_size:
            local -= 1
        realised = gpus * local * micro
        goodput = float(throughput(params, nodes, gpus, local, micro - 1)) * float(
            efficiency(STATS, LIMITS.init_batch_size, realised)
        )
        if goodput > best[0]:
            best = (goodput, realised)
    return best


def test_vectorised_optimum_matches_a_scalar_search_over_mixed_types() -> None:
    shapes = [(T4, 1, 1, 1024), (T4, 1, 4, 1024), (T4, 3, 12, 1024), (A100, 2, 16, 4096)]
    row = optimize_batch_size(
        stacked(*(s[0] for s in shapes)),
        [s[1] for s in shapes],
        [s[2] for s in shapes],
        [s[3] for s in shapes],
        LIMITS,
        STATS,
    )
    for i, (params, nodes, gpus, limit) in enumerate(shapes):
        goodput, batch = brute_force(params, nodes, gpus, limit)
        assert row.goodput[i] == pytest.approx(goodput)
        assert row.batch_size[i] == batch
        assert row.batch_size[i] == gpus * row.local_bsz[i] * (row.accum_steps[i] + 1)
        assert row.local_bsz[i] <= limit
        assert row.goodput[i] == pytest.approx(row.throughput[i] * row.efficiency[i])


def test_without_gradient_noise_the_smallest_batch_wins() -> None:
    row = optimize_batch_size(stacked(T4, T4), [1, 2], [1, 8], [1024, 1024], LIMITS, NO_STATS)
    assert row.batch_size.tolist() == [128, 256]  # M0, and min_local_bsz * K


def test_with_pure_noise_the_largest_batch_wins() -> None:
    # Efficiency 1 everywhere and throughput rising with the batch: take max_batch_size.
    row = optimize_batch_size(stacked(T4), [1], [4], [1024], LIMITS, GradientStats(0.0, 1.0))
    assert row.batch_size[0] == 4096
    assert row.efficiency[0] == pytest.approx(1.0)
    assert (row.local_bsz[0], row.accum_steps[0]) == (1024, 0)


def test_accumulation_is_used_when_the_batch_does_not_fit() -> None:
    row = optimize_batch_size(stacked(T4), [1], [1], [256], LIMITS, GradientStats(0.0, 1.0))
    assert row.batch_size[0] == 4096
    assert (row.local_bsz[0], row.accum_steps[0]) == (256, 15)


def test_infeasible_configurations_get_zero_goodput() -> None:
    # Second: too many GPUs for max_batch_size; third: the type has no memory limit (unusable).
    row = optimize_batch_size(
        stacked(T4, T4, T4), [1, 64, 1], [1, 256, 1], [1024, 1024, 0], LIMITS, STATS
    )
    assert row.goodput[0] > 0
    assert row.goodput[1:].tolist() == [0.0, 0.0]
    assert row.batch_size[1:].tolist() == [0, 0]


def test_fixed_batch_evaluates_only_that_batch() -> None:
    row = optimize_batch_size(
        stacked(T4, T4, T4),
        [1, 1, 2],
        [1, 2, 8],
        [1024, 1024, 1024],
        LIMITS,
        STATS,
        fixed_batch_size=4096,
    )
    assert row.batch_size.tolist() == [4096, 4096, 4096]
    assert row.local_bsz.tolist() == [1024, 1024, 512]
    assert row.accum_steps.tolist() == [3, 1, 0]
    expected = throughput(T4, 2, 8, 512, 0) * efficiency(STATS, 128, 4096)
    assert row.goodput[2] == pytest.approx(float(expected))


def test_fixed_batch_smaller_than_gpu_count_is_infeasible() -> None:
    row = optimize_batch_size(stacked(T4), [1], [4], [1024], LIMITS, STATS, fixed_batch_size=2)
    assert row.goodput[0] == 0


def test_realised_batch_never_exceeds_max_batch_size() -> None:
    limits = BatchLimits(init_batch_size=100, max_batch_size=1000, min_local_bsz=10)
    grid = throughput_grid(stacked(T4, T4), [1, 1], [3, 7], [1000, 1000], limits)
    assert grid.batch_size.max() <= 1000
    assert grid.local_bsz.min() >= 1
