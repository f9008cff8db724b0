"""Fitting: recovery of known parameters, pinning, and the real Sia/Pollux traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sia_slurm.model.fit import Observation, fit_observations, fit_throughput_params
from sia_slurm.model.throughput import (
    PARAM_LOWER_BOUND,
    ThroughputParams,
    compute_time,
    sync_time,
)
from sia_slurm.protocol.profile import read_trace_points

from .conftest import TRACES_DIR

TRUE_PARAMS = [
    ThroughputParams(0.02, 0.0006, 0.08, 0.01, 0.02, 0.004, 2.0),  # T4-like, slow network
    ThroughputParams(0.03, 0.0001, 0.05, 0.002, 0.008, 0.001, 3.0),  # A100-like
    ThroughputParams(0.2, 0.01, 0.3, 0.05, 0.1, 0.01, 1.2),  # large model, little overlap
]
# Training shapes (nodes, GPUs) up to 3 nodes x 4 GPUs; held-out: other shapes and batches.
TRAIN_SHAPES = [(1, 1), (1, 2), (1, 4), (2, 2), (2, 8), (3, 12)]
TRAIN_BSZ = [16, 64, 256]
TEST_SHAPES = [(1, 3), (2, 4), (2, 6), (3, 9), (3, 6)]
TEST_BSZ = [32, 128, 200]
NOISE = 0.02  # 2 % multiplicative noise on every measured time
# Stated tolerance: mean relative error of predicted step time on held-out shapes.
RECOVERY_TOLERANCE = 0.05


def synthetic(
    params: ThroughputParams,
    shapes: list[tuple[int, int]],
    batches: list[int],
    rng: np.random.Generator,
    noise: float,
) -> list[Observation]:
    points = []
    for nodes, gpus in shapes:
        for m in batches:
            compute = float(compute_time(params, m)) * (1 + noise * rng.standard_normal())
            step = float(sync_time(params, nodes, gpus, m)) * (1 + noise * rng.standard_normal())
            step = max(step, compute * 1.0001)
            points.append(Observation(nodes, gpus, m, step, step - compute))
    return points


def mean_relative_step_error(params: ThroughputParams, points: list[Observation]) -> float:
    nodes = np.array([p.nodes for p in points])
    gpus = np.array([p.gpus for p in points])
    local = np.array([p.local_bsz for p in points])
    observed = np.array([p.step_time for p in points])
    return float(np.mean(np.abs(sync_time(params, nodes, gpus, local) - observed) / observed))


@pytest.mark.parametrize("index", range(len(TRUE_PARAMS)))
def test_recovers_known_parameters_from_noisy_points(index: int) -> None:
    rng = np.random.default_rng(index)
    truth = TRUE_PARAMS[index]
    fitted = fit_observations(synthetic(truth, TRAIN_SHAPES, TRAIN_BSZ, rng, NOISE))
    held_out = synthetic(truth, TEST_SHAPES, TEST_BSZ, rng, 0.0)
    assert mean_relative_step_error(fitted, held_out) < RECOVERY_TOLERANCE


def test_exact_points_are_fitted_almost_exactly() -> None:
    truth = TRUE_PARAMS[0]
    points = synthetic(truth, TRAIN_SHAPES, TRAIN_BSZ, np.random.default_rng(0), 0.0)
    fitted = fit_observations(points)
    assert mean_relative_step_error(fitted, points) < 1e-3
    assert fitted.beta_c == pytest.approx(truth.beta_c, rel=0.01)


def test_one_gpu_data_pins_the_network_and_predicts_linear_scaling() -> None:
    points = synthetic(TRUE_PARAMS[0], [(1, 1)], [16, 32, 64, 128], np.random.default_rng(1), 0.0)
    fitted = fit_observations(points)
    for name in ("alpha_n", "beta_n", "alpha_r", "beta_r"):
        assert getattr(fitted, name) == pytest.approx(PARAM_LOWER_BOUND)
    one = float(sync_time(fitted, 1, 1, 64))
    assert float(sync_time(fitted, 4, 16, 64)) == pytest.approx(one, rel=1e-5)


def test_without_multi_node_data_inter_node_costs_at_least_intra_node() -> None:
    truth = TRUE_PARAMS[0]
    shapes = [(1, 1), (1, 2), (1, 4)]
    fitted = fit_observations(synthetic(truth, shapes, TRAIN_BSZ, np.random.default_rng(2), 0.01))
    assert fitted.alpha_r > 1e-4
    assert (fitted.alpha_n, fitted.beta_n) == (fitted.alpha_r, fitted.beta_r)


def test_without_more_than_two_gpus_the_betas_are_pinned() -> None:
    shapes = [(1, 1), (1, 2), (2, 2)]
    points = synthetic(TRUE_PARAMS[1], shapes, TRAIN_BSZ, np.random.default_rng(3), 0.01)
    fitted = fit_observations(points)
    assert fitted.beta_n == pytest.approx(PARAM_LOWER_BOUND)
    assert fitted.beta_r == pytest.approx(PARAM_LOWER_BOUND)
    assert fitted.alpha_n > 1e-4 and fitted.alpha_r > 1e-4


def test_a_single_batch_size_pins_alpha_c_at_half_the_compute_time() -> None:
    fitted = fit_throughput_params([1, 1], [1, 1], [64, 64], [0.11, 0.09], [0.0, 0.0])
    assert fitted.alpha_c == pytest.approx(0.05)
    # RMSLE puts the compute line through the geometric mean of the measurements.
    assert float(compute_time(fitted, 64)) == pytest.approx((0.11 * 0.09) ** 0.5, rel=1e-4)


def test_fit_is_deterministic() -> None:
    points = synthetic(TRUE_PARAMS[2], TRAIN_SHAPES, TRAIN_BSZ, np.random.default_rng(4), 0.02)
    assert fit_observations(points) == fit_observations(points)


def test_bad_input_is_rejected() -> None:
    with pytest.raises(ValueError, match="at least one observation"):
        fit_observations([])
    with pytest.raises(ValueError, match="step_time"):
        Observation(1, 1, 32, -0.3, 0.0)
    with pytest.raises(ValueError, match="sync_time"):
        Observation(1, 1, 32, 0.3, 0.3)
    with pytest.raises(ValueError, match="nodes"):
        Observation(2, 1, 32, 0.3, 0.0)


# The six data-parallel reference models; gpt_pmp is pipeline-parallel, which this model does
# not describe (see benchmarks/trace_fit_error.py for its error).
TRACE_APPS = ["bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3"]
# Sane bounds for the in-sample mean relative step-time error (measured worst: ~0.25, yolov3 on
# A100, whose compute time is far from linear in the batch; typical 0.02-0.10).
PER_FILE_BOUND = 0.30
OVERALL_BOUND = 0.12


def trace_files() -> list[Path]:
    return sorted(f for app in TRACE_APPS for f in (TRACES_DIR / app).glob("placements-*.csv"))


@pytest.mark.heavy
def test_real_traces_fit_within_a_sane_error() -> None:
    files = trace_files()
    assert len(files) == 36
    errors = {}
    for path in files:
        points = read_trace_points(path)
        errors[f"{path.parent.name}/{path.stem}"] = mean_relative_step_error(
            fit_observations(points), points
        )
    worst = max(errors, key=errors.__getitem__)
    assert errors[worst] < PER_FILE_BOUND, (worst, errors[worst])
    assert float(np.mean(list(errors.values()))) < OVERALL_BOUND


def test_trace_model_predicts_unseen_scalability_shapes() -> None:
    """Fitted on placements (<= 4 nodes of T4), cifar10 still predicts runs on 6+ nodes."""
    fitted = fit_observations(read_trace_points(TRACES_DIR / "cifar10" / "placements-aws.csv"))
    far = read_trace_points(TRACES_DIR / "cifar10" / "scalability-aws.csv")
    assert mean_relative_step_error(fitted, far) < 0.15  # measured: 0.083
