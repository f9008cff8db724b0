"""The emulated trainer's efficiency progress agrees with the simulator's (sim/progress.py).

A fixed batch schedule is run through :class:`EfficiencyProgress` (one optimizer step at a time)
and through :func:`sia_slurm.sim.progress.integrate` (the simulator's rate, with the same time
compression); both must reach the same progress and finish at the same step.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.examples.emulated import (
    EfficiencyProgress,
    ProgressModeError,
    TraceStatsReporter,
    efficiency_progress,
)
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.model.efficiency import GradientStats
from sia_slurm.protocol import MetricsReport, StatePaths, read_document
from sia_slurm.sim.apps import default_traces_dir
from sia_slurm.sim.gradstats import AppGradStats
from sia_slurm.sim.progress import StatsTable, integrate

STEP_S = 0.5  # emulated seconds per optimizer step; any value works, the sim gets the same


@pytest.fixture(scope="module")
def cifar10() -> AppGradStats:
    return AppGradStats.load(default_traces_dir(), "cifar10")


def sim_progress(
    stats: AppGradStats, schedule: list[tuple[int, int]], compression: float
) -> tuple[float, float]:
    """(app progress, finish in steps or nan) of a simulated job following ``schedule``
    [(batch, steps), ...], its progress ``compression`` times faster (calibration / k)."""
    table = StatsTable.build({stats.app: stats})
    m0 = stats.init_batch_size
    progress, elapsed = 0.0, 0.0
    for batch, steps in schedule:
        stepped = integrate(
            table,
            progress=np.array([progress]),
            base_rate=np.array([m0 * compression / STEP_S]),
            scale=np.array([batch / m0]),
            curve=np.array([table.curve_index(stats.app, batch)], dtype=np.int64),
            target=np.array([stats.completion_samples]),
            duration=np.array([steps * STEP_S]),
            max_substep=STEP_S,
        )
        progress = float(stepped.progress[0])
        if not math.isnan(stepped.finish[0]):
            return progress, elapsed + float(stepped.finish[0]) / STEP_S
        elapsed += steps
    return progress, math.nan


def emulated_progress(
    tracker: EfficiencyProgress, schedule: list[tuple[int, int]]
) -> tuple[float, int | None]:
    """(app progress, steps taken when done or None) of the emulated trainer's accounting."""
    taken = 0
    for batch, steps in schedule:
        for _ in range(steps):
            tracker.step(batch)
            taken += 1
            if tracker.done:
                return tracker.app_progress, taken
    return tracker.app_progress, None


def test_fixed_schedule_matches_the_simulator(cifar10: AppGradStats) -> None:
    compression = 10.0
    tracker = EfficiencyProgress.for_target(cifar10, cifar10.completion_samples / compression)
    assert tracker.compression == pytest.approx(compression)
    schedule = [(128, 200), (512, 150), (2048, 100)]
    emulated, done = emulated_progress(tracker, schedule)
    simulated, finish = sim_progress(cifar10, schedule, compression)
    assert done is None and math.isnan(finish)  # not done yet in either world
    assert emulated == pytest.approx(simulated, rel=1e-3)
    # Large batches are worth less than their raw samples: the test would fail on raw counting.
    raw = sum(batch * steps for batch, steps in schedule) * compression
    assert emulated < 0.9 * raw


def test_completion_step_matches_the_simulator(cifar10: AppGradStats) -> None:
    compression = 200.0
    tracker = EfficiencyProgress.for_target(cifar10, cifar10.completion_samples / compression)
    schedule = [(128, 100), (1024, 100_000)]
    _, done = emulated_progress(tracker, schedule)
    _, finish = sim_progress(cifar10, schedule, compression)
    assert done is not None and not math.isnan(finish)
    assert done == math.ceil(finish - 1e-9) or abs(done - finish) <= 1.0
    assert tracker.job_progress >= cifar10.completion_samples / compression


def test_small_batch_progress_is_raw_samples(cifar10: AppGradStats) -> None:
    """At M0 the gain is 1: each step is worth M0 samples (x compression in app units)."""
    tracker = EfficiencyProgress.for_target(cifar10, 1000.0)
    tracker.step(cifar10.init_batch_size)
    assert tracker.job_progress == pytest.approx(cifar10.init_batch_size)


def test_reported_statistics_are_the_simulators(cifar10: AppGradStats) -> None:
    tracker = EfficiencyProgress.for_target(cifar10, cifar10.completion_samples / 10)
    for _ in range(50):
        tracker.step(1024)
    job_m0 = 64
    reported = tracker.statistics(1024, job_m0)
    sqr, var = cifar10.at(1024, tracker.app_progress)
    assert reported.grad_sqr == pytest.approx(float(sqr))
    assert reported.grad_var == pytest.approx(float(var) * cifar10.init_batch_size / job_m0)


def test_reporter_writes_the_trace_statistics(tmp_path: Path) -> None:
    env = JobEnvironment.standalone(tmp_path, 128)
    reporter = TraceStatsReporter(env, lambda: GradientStats(0.25, 3.5))
    reporter.interval_s = 0.0
    reporter.record(0.2, 0.01, 128, 0)
    written = reporter.report(
        steps=1, local_bsz=128, accum_steps=0, round_index=0, noise=GradientNoise(128)
    )
    assert written is not None
    on_disk = read_document(MetricsReport, StatePaths(env.state_dir).metrics(env.sia_id))
    assert (on_disk.grad_sqr, on_disk.grad_var) == (0.25, 3.5)


def test_modes_and_bad_targets(cifar10: AppGradStats) -> None:
    assert efficiency_progress("raw", "cifar10", 100.0) is None
    assert efficiency_progress("auto", "no-such-app", 100.0) is None
    assert isinstance(efficiency_progress("auto", "cifar10", 100.0), EfficiencyProgress)
    with pytest.raises(ProgressModeError, match="no-such-app"):
        efficiency_progress("efficiency", "no-such-app", 100.0)
    with pytest.raises(ProgressModeError, match="--target-samples"):
        EfficiencyProgress.for_target(cifar10, 0.0)
