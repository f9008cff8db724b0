"""benchmarks/profiling_live.py: the accuracy table's predictions on made-up runs, and the
machine-noise table on made-up step times.

The kept profile says a type of speed ``s`` steps a per-GPU batch ``m`` in ``(a + b * m) / s``,
as the dev cluster's speed factors make it; the made-up pinned jobs take exactly that at 1 GPU,
and at 2 GPUs (a per-GPU batch of 32) 1.5 times their type's 1-GPU step at 32, the half being the
all-reduce: sub-linear scaling, the same on every type.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from benchmarks.profiling_live import Runs, accuracy, noise_rows, observation
from sia_slurm.controller import EstimatorFactory
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.protocol.profile_json import PROFILE_FORMAT
from sia_slurm_dev.controller_config import DEFAULT_PROFILES

SPEED = {"dgx": 1.0, "rtx": 0.35, "t4": 0.25}  # per profile type
TYPE_OF = {"a100": "dgx", "rtx": "rtx", "t4": "t4"}


def profile_step(profile_type: str, local_bsz: int) -> float:
    return (0.002 + 0.00005 * local_bsz) / SPEED[profile_type]


def step(gpu_type: str, local_bsz: int) -> float:
    return profile_step(TYPE_OF[gpu_type], local_bsz)


def kept() -> dict[str, Any]:
    return {
        "format": PROFILE_FORMAT,
        "app": "bench-lm",
        "init_batch_size": 64,
        "max_batch_size": 512,
        "min_local_bsz": 4,
        "max_local_bsz": {t: 256 for t in SPEED},
        "seed": [
            {
                "gpu_type": t,
                "local_bsz": m,
                "placement": "1",
                "sync_time": 0.0,
                "step_time": profile_step(t, m),
            }
            for t in SPEED
            for m in (4, 8, 16, 32, 64, 128, 256)
        ],
        "description": "",
    }


def report(gpu_type: str, gpus: int, at: float) -> MetricsReport:
    local = 64 // gpus
    compute = step(gpu_type, local)
    sync = 0.0 if gpus == 1 else 0.5 * compute  # the all-reduce after the compute
    return MetricsReport(
        sia_id="x", time=at, gpu_type=gpu_type, nodes=1, gpus=gpus, local_bsz=local,
        accum_steps=0, step_time=compute + sync, sync_time=sync, grad_sqr=1.0, grad_var=1.0,
    )  # fmt: skip


def runs() -> Runs:
    return {
        (t, g): [report(t, g, float(i)) for i in range(3)]
        for t in ("a100", "rtx", "t4")
        for g in (1, 2)
    }


def table() -> dict[tuple[str, str], list[str]]:
    factory = EstimatorFactory(load_profiles(), dict(DEFAULT_PROFILES))
    spec = JobSpec("x", "bench-lm", init_batch_size=64, max_batch_size=512)
    rows = accuracy(factory, spec, kept(), runs())
    return {(row[0], row[1]): row for row in rows}


def percent(cell: str) -> float:
    return float(cell.rstrip("%")) / 100


def test_one_gpu_steps_that_follow_the_profile_are_predicted_within_a_percent() -> None:
    for gpu_type in ("a100", "rtx", "t4"):
        row = table()[(gpu_type, "1")]
        assert row[2] == "64x1"
        assert abs(percent(row[5])) < 0.01, row
        assert row[6] == "-"  # no bootstrap at 1 GPU


def test_the_profile_alone_predicts_linear_scaling_and_the_bootstrap_the_measured_one() -> None:
    """2 GPUs: the profile alone has no all-reduce (+50%: the measured step is 1.5x); fed the
    other types' 2-GPU runs, the model projects their scaling onto this type (by the ratio of
    the types' best 1-GPU throughputs, exact here: the types differ by a factor only)."""
    for gpu_type in ("a100", "rtx", "t4"):
        row = table()[(gpu_type, "2")]
        assert percent(row[5]) == pytest.approx(0.5, abs=0.02), row
        assert abs(percent(row[6])) < 0.05, row


def slowed(made: MetricsReport, factor: float) -> MetricsReport:
    return replace(made, step_time=made.step_time * factor, sync_time=made.sync_time * factor)


def test_the_machines_drift_is_taken_out_of_the_steady_columns_alone() -> None:
    """Every run on a machine slower than at the profile's moment, each by its own factor:
    the plain errors show the drift (1 GPU: +50% at a drift of 1.5), the steady ones the
    model's error alone, as exact as without a drift; no drift column without drifts."""
    drift = {key: 1.1 + 0.1 * index for index, key in enumerate(sorted(runs()))}
    slow = {key: [slowed(r, drift[key]) for r in made] for key, made in runs().items()}
    factory = EstimatorFactory(load_profiles(), dict(DEFAULT_PROFILES))
    spec = JobSpec("x", "bench-lm", init_batch_size=64, max_batch_size=512)
    rows = {(r[0], r[1]): r for r in accuracy(factory, spec, kept(), slow, drift)}
    for (gpu_type, gpus), factor in drift.items():
        row = rows[(gpu_type, str(gpus))]
        assert row[7] == f"{factor:.3f}"
        if gpus == 1:
            assert percent(row[5]) == pytest.approx(factor - 1, abs=0.01), row
            assert abs(percent(row[8])) < 0.01, row
            assert row[9] == "-"
        else:
            assert percent(row[8]) == pytest.approx(0.5, abs=0.02), row
            assert abs(percent(row[9])) < 0.05, row
    assert all(row[7:] == ["-", "-", "-"] for row in table().values())


def test_a_run_without_a_report_is_shown_as_such() -> None:
    factory = EstimatorFactory(load_profiles(), dict(DEFAULT_PROFILES))
    spec = JobSpec("x", "bench-lm", init_batch_size=64, max_batch_size=512)
    rows = accuracy(factory, spec, kept(), {("a100", 1): []})
    assert rows == [["a100", "1", "-", "-", "no report", "-", "-", "-", "-", "-"]]


def test_a_report_is_observed_as_the_controller_ingests_it() -> None:
    made = report("rtx", 2, 0.0)
    seen = observation(made)
    assert (seen.nodes, seen.gpus, seen.local_bsz, seen.accum_steps) == (1, 2, 32, 0)
    assert (seen.step_time, seen.sync_time) == (made.step_time, made.sync_time)


def test_the_noise_table_gives_each_windows_spread_of_the_mean_step() -> None:
    """Steps of 1 ms for 2 s, then of 3 ms for 2 s, then one last window: 1-s windows mean 1
    or 3 ms (cv 50%), 2-s windows too; 4-s windows leave one whole window, too few for a
    spread, and no row."""
    steps = [(i * 0.001, 0.001) for i in range(2000)]
    steps += [(2.0 + i * 0.003, 0.003) for i in range(667)]
    steps += [(4.0 + i * 0.001, 0.001) for i in range(10)]  # the last window: left out
    rows = noise_rows(steps, (1.0, 2.0, 4.0))
    assert [row[0] for row in rows] == ["1", "2"]
    assert rows[0][1:] == ["4", "50.0%", "1.00", "3.00"]
    assert rows[1][1:] == ["2", "50.0%", "1.00", "3.00"]
