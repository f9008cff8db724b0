"""Gradient statistics over progress and the completion targets."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from sia_slurm.sim.gradstats import AppGradStats, GradStatsError

from .conftest import TRACES_DIR

EPOCHS = {"cifar10": 100, "deepspeech2": 80, "bert": 2, "yolov3": 50, "imagenet": 90, "ncf": 10}
M0 = {"cifar10": 128, "deepspeech2": 20, "bert": 12, "yolov3": 8, "imagenet": 200, "ncf": 256}


def _rows(path: Path) -> list[dict[str, float]]:
    with path.open() as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]


@pytest.mark.parametrize("app", sorted(EPOCHS))
def test_measured_progress_reproduces_file_rows(app: str) -> None:
    stats = AppGradStats.load(TRACES_DIR, app)
    assert stats.init_batch_size == M0[app]
    for bsz in stats.batch_sizes:
        rows = _rows(TRACES_DIR / app / f"validation-{bsz}.csv")
        progress = np.array([r["progress"] for r in rows]) * M0[app]
        grad_sqr, grad_var = stats.at(bsz, progress)
        np.testing.assert_allclose(grad_sqr, [r["grad_sqr"] for r in rows], rtol=1e-12)
        np.testing.assert_allclose(grad_var, [r["grad_var"] for r in rows], rtol=1e-12)


def test_between_rows_is_linear_and_ends_are_held() -> None:
    stats = AppGradStats.load(TRACES_DIR, "cifar10")
    rows = _rows(TRACES_DIR / "cifar10" / "validation-512.csv")
    first, second, last = rows[0], rows[1], rows[-1]
    midway = (first["progress"] + second["progress"]) / 2 * 128
    grad_sqr, grad_var = stats.at(512, midway)
    assert float(grad_sqr) == pytest.approx((first["grad_sqr"] + second["grad_sqr"]) / 2)
    assert float(grad_var) == pytest.approx((first["grad_var"] + second["grad_var"]) / 2)
    assert float(stats.at(512, 0.0)[0]) == first["grad_sqr"]
    assert float(stats.at(512, 1e12)[1]) == last["grad_var"]


@pytest.mark.parametrize(
    ("asked", "chosen"), [(1, 128), (180, 128), (300, 256), (2048, 2048), (3000, 4096), (1e6, 4096)]
)
def test_nearest_validated_batch_on_log_scale(asked: float, chosen: int) -> None:
    assert AppGradStats.load(TRACES_DIR, "cifar10").curve_for(asked).batch_size == chosen


@pytest.mark.parametrize("app", sorted(EPOCHS))
def test_completion_target_is_max_epochs_of_the_dataset(app: str) -> None:
    stats = AppGradStats.load(TRACES_DIR, app)
    rows = _rows(TRACES_DIR / app / f"validation-{M0[app]}.csv")
    per_epoch = rows[-1]["progress"] / len(rows) * M0[app]
    assert stats.max_epochs == EPOCHS[app]
    assert stats.samples_per_epoch == pytest.approx(per_epoch)
    assert stats.completion_samples == pytest.approx(EPOCHS[app] * per_epoch)


def test_dataset_sizes_match_the_known_datasets() -> None:
    assert AppGradStats.load(TRACES_DIR, "cifar10").samples_per_epoch == pytest.approx(50_000, 1e-4)
    imagenet = AppGradStats.load(TRACES_DIR, "imagenet")
    assert imagenet.samples_per_epoch == pytest.approx(1_281_167, rel=1e-5)


def test_gpt_pmp_borrows_bert() -> None:
    gpt = AppGradStats.load(TRACES_DIR, "gpt_pmp")
    bert = AppGradStats.load(TRACES_DIR, "bert")
    assert gpt.stats_app == "bert"
    assert gpt.completion_samples == bert.completion_samples
    assert gpt.stats(96, 10_000.0) == bert.stats(96, 10_000.0)


def test_stats_convert_grad_var_to_the_jobs_m0() -> None:
    stats = AppGradStats.load(TRACES_DIR, "cifar10")
    at_app = stats.stats(1024, 1e6)
    at_job = stats.stats(1024, 1e6, init_batch_size=512)
    assert at_job.grad_sqr == at_app.grad_sqr
    assert at_job.grad_var == pytest.approx(at_app.grad_var * 128 / 512)


def test_decreasing_progress_is_rejected(tmp_path: Path) -> None:
    folder = tmp_path / "toy"
    folder.mkdir()
    path = folder / "validation-8.csv"
    path.write_text("progress,iteration,metric,grad_sqr,grad_var\n5,5,0,1,1\n4,4,0,1,1\n")
    with pytest.raises(GradStatsError) as err:
        AppGradStats.load(tmp_path, "toy", max_epochs=1)
    assert str(err.value) == f"{path}:3: progress: expected more than the previous row's 5, got 4"


def test_app_without_files_or_epochs_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(GradStatsError, match=r"expected validation-<batch size>\.csv files"):
        AppGradStats.load(tmp_path, "toy", max_epochs=1)
    with pytest.raises(GradStatsError, match=r"toy: max_epochs: expected a positive number"):
        AppGradStats.load(tmp_path, "toy")
