"""Throughput-model formulas against values computed by hand from reference section 2."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sia_slurm.model.throughput import (
    StackedParams,
    ThroughputParams,
    compute_time,
    global_batch_size,
    network_time,
    step_time,
    sync_time,
    throughput,
)

# alpha_c, beta_c, alpha_n, beta_n, alpha_r, beta_r, gamma
P = ThroughputParams(0.1, 0.01, 0.2, 0.05, 0.1, 0.02, 2.0)


def test_single_gpu_has_no_network_time() -> None:
    # T_c = 0.1 + 0.01*10 = 0.2; K = 1: T_n = 0, T_sync = T_c; M = 10 -> 50 samples/s.
    assert compute_time(P, 10) == pytest.approx(0.2)
    assert network_time(P, 1, 1) == 0.0
    assert sync_time(P, 1, 1, 10) == pytest.approx(0.2)
    assert throughput(P, 1, 1, 10) == pytest.approx(50.0)


def test_two_gpus_one_node_uses_intra_node_latency_only() -> None:
    # K = 2: max(K-2, 0) = 0, T_n = alpha_r = 0.1; T_sync = sqrt(0.2^2 + 0.1^2).
    assert network_time(P, 1, 2) == pytest.approx(0.1)
    assert sync_time(P, 1, 2, 10) == pytest.approx(math.sqrt(0.05))


def test_two_gpus_on_two_nodes_uses_inter_node_latency() -> None:
    assert network_time(P, 2, 2) == pytest.approx(0.2)
    assert sync_time(P, 2, 2, 10) == pytest.approx(math.sqrt(0.08))


def test_single_node_four_gpus() -> None:
    # T_n = 0.1 + 0.02 * 2 = 0.14; T_sync = sqrt(0.04 + 0.0196); M = 40.
    t_sync = math.sqrt(0.0596)
    assert sync_time(P, 1, 4, 10) == pytest.approx(t_sync)
    assert throughput(P, 1, 4, 10) == pytest.approx(40 / t_sync)


def test_multi_node_with_accumulation() -> None:
    # K = 8 over 2 nodes, m = 10, s = 2: T_n = 0.2 + 0.05*6 = 0.5, T_sync = sqrt(0.04 + 0.25),
    # T_iter = 2*0.2 + T_sync, M = 8*10*3 = 240.
    t_iter = 0.4 + math.sqrt(0.29)
    assert step_time(P, 2, 8, 10, 2) == pytest.approx(t_iter)
    assert global_batch_size(8, 10, 2) == 240
    assert throughput(P, 2, 8, 10, 2) == pytest.approx(240 / t_iter)


def test_gamma_one_adds_compute_and_network() -> None:
    p = ThroughputParams(0.1, 0.01, 0.2, 0.05, 0.1, 0.02, 1.0)
    assert sync_time(p, 2, 8, 10) == pytest.approx(0.2 + 0.5)


def test_large_gamma_approaches_the_max_of_compute_and_network() -> None:
    p = ThroughputParams(0.1, 0.01, 0.2, 0.05, 0.1, 0.02, 10.0)
    value = float(sync_time(p, 2, 8, 10))
    assert 0.5 < value < 0.5 * 1.001


def test_broadcasting_over_a_grid_matches_scalar_calls() -> None:
    nodes = np.array([1, 1, 2, 3])[:, None]
    gpus = np.array([1, 4, 8, 12])[:, None]
    local = np.array([8, 32, 128])[None, :]
    grid = throughput(P, nodes, gpus, local, 1)
    for i in range(4):
        for j in range(3):
            scalar = throughput(P, int(nodes[i, 0]), int(gpus[i, 0]), int(local[0, j]), 1)
            assert grid[i, j] == pytest.approx(float(scalar))


def test_stacked_params_evaluate_one_model_per_row() -> None:
    q = ThroughputParams(0.05, 0.002, 0.3, 0.01, 0.05, 0.01, 1.5)
    stacked = StackedParams.stack([P, q], (2, 1))
    got = step_time(stacked, np.array([[2], [2]]), np.array([[8], [8]]), np.array([[16, 64]]))
    np.testing.assert_allclose(got[0], step_time(P, 2, 8, np.array([16, 64])))
    np.testing.assert_allclose(got[1], step_time(q, 2, 8, np.array([16, 64])))


def test_params_round_trip_and_validation() -> None:
    assert ThroughputParams.from_array(P.to_array()) == P
    with pytest.raises(ValueError, match="gamma"):
        ThroughputParams(0.1, 0.01, 0.2, 0.05, 0.1, 0.02, 0.5)
    with pytest.raises(ValueError, match="beta_n"):
        ThroughputParams(0.1, 0.01, 0.2, -0.05, 0.1, 0.02, 2.0)
