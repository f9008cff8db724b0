"""The example trainers run by hand (``--local``): they learn, and a second start resumes the
first one's checkpoint exactly where it stopped."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import zygote

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]


def run_example(module: str, *args: str) -> None:
    """``python -m sia_slurm.job.examples.MODULE ARGS``, forked from a zygote that has
    imported PyTorch (tests/zygote.py)."""
    zygote.run(
        [sys.executable, "-m", f"sia_slurm.job.examples.{module}", *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=120,
    )


def losses(log: Path) -> list[tuple[int, float]]:
    rows = [json.loads(line) for line in (log / "samples-r0.jsonl").read_text().splitlines()]
    return [(row["step"], row["loss"]) for row in rows]


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_cnn_learns_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    common = ["--local", str(tmp_path), "--dataset-size", "256", "--sample-log", str(tmp_path)]
    run_example("cnn", *common, "--epochs", "6", "--max-steps", "20")
    run_example("cnn", *common, "--epochs", "6")
    steps = losses(tmp_path)
    assert [step for step, _ in steps] == list(range(48))  # 6 epochs x 8 steps, no step twice
    values = [loss for _, loss in steps]
    assert mean(values[-8:]) < 0.8 * mean(values[:8])


def test_transformer_learns(tmp_path: Path) -> None:
    run_example(
        "transformer", "--local", str(tmp_path), "--epochs", "3", "--dataset-size", "256",
        "--sample-log", str(tmp_path),
    )  # fmt: skip
    values = [loss for _, loss in losses(tmp_path)]
    assert len(values) == 24
    assert mean(values[-8:]) < 0.8 * mean(values[:8])
