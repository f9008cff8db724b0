"""Ground truth: measured points reproduced, interpolation and derivation rules, calibration."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from sia_slurm.sim.groundtruth import GroundTruth, GroundTruthError, default_calibration

from .conftest import TRACES_DIR


def _toy(traces: Path) -> GroundTruth:
    return GroundTruth.load(traces, "toy", "x", calibration=1.0)


def _times(truth: GroundTruth, nodes: int, gpus: int, bsz: float) -> tuple[float, float]:
    step, sync = truth.step_time(nodes, gpus, bsz)
    return float(step), float(sync)


def test_measured_points_are_reproduced(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    assert _times(truth, 1, 1, 10) == pytest.approx((1.0, 0.0))
    assert _times(truth, 1, 2, 20) == pytest.approx((2.5, 0.5))
    assert _times(truth, 4, 16, 30) == pytest.approx((12.0, 7.0))


def test_interpolation_is_linear_between_measured_batches(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    assert _times(truth, 1, 1, 15) == pytest.approx((1.5, 0.0))
    assert _times(truth, 4, 8, 20) == pytest.approx((7.0, 3.0))


def test_below_smallest_batch_is_held(toy_traces: Path) -> None:
    assert _times(_toy(toy_traces), 1, 2, 4) == pytest.approx((1.5, 0.5))


def test_above_largest_batch_extends_compute_and_holds_sync(toy_traces: Path) -> None:
    # compute 1.0 at 10 and 2.0 at 20 -> 4.0 at 40; sync stays 0.5
    assert _times(_toy(toy_traces), 1, 2, 40) == pytest.approx((4.5, 0.5))


def test_splits_of_one_shape_are_averaged_and_placements_win(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    # "22" (3.0, 1.0) and "13" (5.0, 1.0) at 10; scalability's (100, 50) for (2, 4) is ignored
    assert _times(truth, 2, 4, 10) == pytest.approx((4.0, 1.0))
    assert truth.sources[(2, 4)] == "placements"


def test_scalability_only_shape_is_found(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    assert truth.sources[(4, 8)] == "scalability"
    assert truth.derivation(4, 8) == (((4, 8), 1.0),)


def test_unmeasured_gpu_count_interpolates_between_neighbours(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    assert truth.derivation(4, 12) == (((4, 8), 0.5), ((4, 16), 0.5))
    assert _times(truth, 4, 12, 10) == pytest.approx((8.0, 5.0))
    assert _times(truth, 4, 10, 10) == pytest.approx((7.0, 4.0))  # a quarter of the way


def test_unmeasured_node_count_interpolates_with_clamped_gpus(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    # 3 nodes: between 2 nodes (only 4 GPUs measured -> clamped) and 4 nodes (8 GPUs)
    assert truth.derivation(3, 8) == (((2, 4), 0.5), ((4, 8), 0.5))
    assert _times(truth, 3, 8, 10) == pytest.approx((5.0, 2.0))


def test_beyond_all_measurements_takes_the_largest_neighbour(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    assert truth.derivation(8, 40) == (((4, 16), 1.0),)
    assert _times(truth, 8, 40, 30) == _times(truth, 4, 16, 30)


def test_calibration_scales_step_and_sync(toy_traces: Path) -> None:
    doubled = GroundTruth.load(toy_traces, "toy", "x", calibration=2.0)
    assert _times(doubled, 1, 2, 10) == pytest.approx((3.0, 1.0))


def test_default_calibration_per_app() -> None:
    assert default_calibration("cifar10") == 1.8
    assert default_calibration("ncf") == 1.5
    for app in ("bert", "deepspeech2", "imagenet", "yolov3", "gpt_pmp"):
        assert default_calibration(app) == 1.2


def test_default_calibration_is_applied_to_real_data() -> None:
    raw = GroundTruth.load(TRACES_DIR, "cifar10", "aws", calibration=1.0)
    calibrated = GroundTruth.load(TRACES_DIR, "cifar10", "aws")
    assert calibrated.calibration == 1.8
    step_raw, sync_raw = raw.step_time(2, 8, 100)
    step, sync = calibrated.step_time(2, 8, 100)
    assert float(step) == pytest.approx(1.8 * float(step_raw))
    assert float(sync) == pytest.approx(1.8 * float(sync_raw))


def test_iteration_time_and_throughput_with_accumulation(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    # compute 1.0, step 1.5: 3 extra micro-batches -> 3 * 1.0 + 1.5
    assert float(truth.iteration_time(1, 2, 10, 3)) == pytest.approx(4.5)
    assert float(truth.throughput(1, 2, 10, 3)) == pytest.approx(2 * 10 * 4 / 4.5)


def test_vectorised_call_matches_scalar_calls(toy_traces: Path) -> None:
    truth = _toy(toy_traces)
    nodes = np.array([1, 4, 3, 2, 1])
    gpus = np.array([1, 12, 8, 4, 2])
    bsz = np.array([15.0, 10.0, 10.0, 20.0, 40.0])
    step, sync = truth.step_time(nodes, gpus, bsz)
    for i in range(nodes.size):
        assert (step[i], sync[i]) == pytest.approx(_times(truth, nodes[i], gpus[i], bsz[i]))


def test_invalid_shape_is_rejected(toy_traces: Path) -> None:
    with pytest.raises(ValueError, match="expected 1 <= nodes <= gpus, got nodes=3 gpus=2"):
        _toy(toy_traces).step_time(3, 2, 10)


def test_missing_trace_file_names_the_file_and_valid_keys(toy_traces: Path) -> None:
    with pytest.raises(GroundTruthError) as err:
        GroundTruth.load(toy_traces, "toy", "aws")
    assert str(err.value) == (
        f"{toy_traces}/toy/placements-aws.csv: file not found: no ground truth for app 'toy' "
        "on trace key 'aws' (trace keys with data for toy: x)"
    )


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def test_real_single_split_placements_are_reproduced_exactly() -> None:
    truth = GroundTruth.load(TRACES_DIR, "cifar10", "rtx", calibration=1.0)
    rows = [r for r in _rows(TRACES_DIR / "cifar10" / "placements-rtx.csv")]
    checked = 0
    for row in rows:
        if len(row["placement"]) != 1:  # one node: a single split per shape
            continue
        step, sync = _times(truth, 1, int(row["placement"]), float(row["local_bsz"]))
        assert step == pytest.approx(float(row["step_time"]), rel=1e-12)
        assert sync == pytest.approx(float(row["sync_time"]), rel=1e-12)
        checked += 1
    assert checked > 50


def test_real_scalability_only_shape_is_reproduced() -> None:
    truth = GroundTruth.load(TRACES_DIR, "cifar10", "aws", calibration=1.0)
    assert truth.sources[(6, 6)] == "scalability"
    rows = _rows(TRACES_DIR / "cifar10" / "scalability-aws.csv")
    six = [r for r in rows if float(r["num_nodes"]) == 6 and float(r["num_replicas"]) == 6]
    assert six
    for row in six:
        step, sync = _times(truth, 6, 6, float(row["local_bsz"]))
        assert step == pytest.approx(float(row["step_time"]), rel=1e-12)
        assert sync == pytest.approx(float(row["sync_time"]), rel=1e-12)


def test_real_interpolated_batch_lies_between_neighbours() -> None:
    truth = GroundTruth.load(TRACES_DIR, "imagenet", "dgx-ext", calibration=1.0)
    lo, mid, hi = (float(x) for x in truth.step_time(1, 4, [81, 98, 115])[0])
    assert min(lo, hi) <= mid <= max(lo, hi)
    assert mid == pytest.approx(lo + (hi - lo) * (98 - 81) / (115 - 81))


@pytest.mark.parametrize("app", ["cifar10", "bert", "imagenet"])
def test_real_unmeasured_shapes_stay_between_their_measured_neighbours(app: str) -> None:
    aws = GroundTruth.load(TRACES_DIR, app, "aws", calibration=1.0)
    assert (5, 10) not in aws.curves  # placements stop at 4 nodes, scalability starts at 6
    bsz = aws.curves[(1, 1)].local_bsz[2]
    derived = float(aws.step_time(5, 10, bsz)[0])
    neighbours = [float(aws.step_time(n, 10, bsz)[0]) for n in (4, 6)]
    assert min(neighbours) <= derived <= max(neighbours)
    rtx = GroundTruth.load(TRACES_DIR, app, "rtx", calibration=1.0)
    assert (3, 7) not in rtx.curves
    derived = float(rtx.step_time(3, 7, bsz)[0])
    neighbours = [float(rtx.step_time(3, k, bsz)[0]) for k in (6, 8)]
    assert min(neighbours) <= derived <= max(neighbours)
