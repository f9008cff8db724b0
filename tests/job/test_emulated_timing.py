"""The emulated trainer follows its profile: bounded own cost, paced micro-batches (issue 19)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch

from sia_slurm.job.examples.emulated import (
    COMPUTED_SAMPLES,
    Pacer,
    bounded_fetch,
    make_dataset,
    micro_batch_seconds,
    train,
)
from sia_slurm.protocol.profile import (
    GPU_TYPES_FILE,
    default_profiles_dir,
    load_app_profile,
    load_gpu_types,
)


class FakeClock:
    """A clock that sleeps exactly, plus a wake-up latency the test sets per sleep."""

    def __init__(self) -> None:
        self.now = 0.0
        self.latency = 0.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds + self.latency


def test_pacer_takes_a_late_wake_up_off_the_next_micro_batch():
    clock = FakeClock()
    pacer = Pacer(clock, clock.sleep)
    clock.latency = 0.004  # each wake-up 4 ms late
    durations = []
    for _ in range(4):
        started = pacer.now()
        pacer.start(0.020, started)
        clock.now += 0.001  # the micro-batch's own work
        pacer.wait()
        durations.append(clock.now - started)
    # first 24 ms (19 ms asleep + 4 late), then each sleeps 4 ms less and ends 4 ms late: 20 ms
    assert durations == pytest.approx([0.024, 0.020, 0.020, 0.020])
    assert clock.slept == pytest.approx([0.019, 0.015, 0.015, 0.015])


def test_pacer_does_not_make_up_time_between_micro_batches_or_beyond_its_cap():
    clock = FakeClock()
    pacer = Pacer(clock, clock.sleep)
    started = pacer.now()
    pacer.start(0.020, started)
    pacer.wait()
    clock.now += 5.0  # a checkpoint between steps: not part of any micro-batch
    started = pacer.now()
    pacer.start(0.020, started)
    pacer.wait()
    assert clock.now - started == pytest.approx(0.020)
    clock.latency = 3.0  # an overrun of 3 s is carried only up to catch_up_s
    started = pacer.now()
    pacer.start(0.020, started)
    pacer.wait()
    clock.latency = 0.0
    started = pacer.now()
    pacer.start(1.0, started)
    pacer.wait()
    assert clock.now - started == pytest.approx(1.0 - Pacer.catch_up_s)


def test_pacer_takes_a_stall_off_one_micro_batch_only():
    """A 200 ms stall on a 20 ms micro-batch (the first step's allocations, a descheduled
    process) shortens the next micro-batch to its own work, not the ten after it: a report
    whose window holds the catch-up but not the stall would say the steps are faster than
    profiled."""
    clock = FakeClock()
    pacer = Pacer(clock, clock.sleep)
    started = pacer.now()
    pacer.start(0.020, started)
    clock.now += 0.220  # the stall, inside the micro-batch
    pacer.wait()
    durations = []
    for _ in range(4):
        started = pacer.now()
        pacer.start(0.020, started)
        clock.now += 0.002  # the micro-batch's own work
        pacer.wait()
        durations.append(clock.now - started)
    # 2 ms (all of its 20 ms taken off), then 20 ms less the first one's 2 ms overrun, then 20
    assert durations == pytest.approx([0.002, 0.018, 0.020, 0.020])


def test_pacer_carries_what_the_trainer_measured_either_way():
    """The report is the trainer's timing, not the pacer's window: a process descheduled 15 ms
    after the pacer started but before the trainer did leaves a 5 ms measured step for a 20 ms
    budget; the next micro-batch gets the missing 15 ms. One measured 6 ms over its budget plus
    the planned all-reduce wait gives 6 ms back. Each carry is bounded by ``catch_up_s``."""
    clock = FakeClock()
    pacer = Pacer(clock, clock.sleep)
    pacer.start(0.020, pacer.now())
    pacer.wait()
    pacer.measured(0.005)
    started = pacer.now()
    pacer.start(0.020, started)
    pacer.wait()
    assert clock.now - started == pytest.approx(0.035)
    pacer.measured(0.035 + 0.003 + 0.006, sync_s=0.003)
    started = pacer.now()
    pacer.start(0.020, started)
    pacer.wait()
    assert clock.now - started == pytest.approx(0.014)
    pacer.measured(0.014 - 5.0)  # a clock gone wrong: at most catch_up_s is added
    started = pacer.now()
    pacer.start(0.020, started)
    pacer.wait()
    assert clock.now - started == pytest.approx(0.020 + Pacer.catch_up_s)


def test_bounded_fetch_gathers_at_most_the_computed_samples_in_order():
    dataset = make_dataset(5000, seed=1)
    fetch = bounded_fetch(dataset)
    indices = list(range(4999, -1, -1))
    inputs, targets = fetch(indices)
    assert inputs.shape == (COMPUTED_SAMPLES, 16) and targets.shape == (COMPUTED_SAMPLES,)
    expected = torch.as_tensor(indices[:COMPUTED_SAMPLES])
    assert torch.equal(inputs, dataset.tensors[0][expected])
    assert torch.equal(targets, dataset.tensors[1][expected])
    small_inputs, _ = fetch([3, 1])
    assert torch.equal(small_inputs, dataset.tensors[0][[3, 1]])


def test_pacer_pauses_between_steps_without_moving_a_deadline():
    clock = FakeClock()
    pacer = Pacer(clock, clock.sleep)
    clock.latency = 0.004
    pacer.start(0.020, pacer.now())
    pacer.wait()  # 4 ms late: carried to the next micro-batch
    pacer.pause(0.5)
    pacer.pause(0.0)  # nothing to sleep
    started = pacer.now()
    pacer.start(0.020, started)
    pacer.wait()
    assert clock.slept == pytest.approx([0.020, 0.5, 0.016])
    assert clock.now - started == pytest.approx(0.020)  # the pause carried nothing


@pytest.mark.heavy
def test_untimed_scale_slows_the_steps_but_not_the_step_times_they_report(tmp_path: Path):
    """``--untimed-scale c`` (the fidelity benchmark's calibration factor): each step lasts c
    times its emulated time, and the report still says the profile's step time, as the
    simulator's jobs do (they progress c times slower than the step times they report). ncf on
    rtx at 32,768: a 20 ms step; at c = 6, 20 steps sleep 2 s between steps. Counted in the
    step, the report would say 120 ms; it must stay under 60 ms on a crowded machine too."""
    batch, steps, scale = 32768, 20, 6.0
    root = default_profiles_dir()
    profile = load_app_profile(root / "ncf", load_gpu_types(root / GPU_TYPES_FILE))
    step_s = micro_batch_seconds(profile, "rtx", batch)
    started = time.monotonic()
    report = _run(tmp_path / "slow", steps, batch, "--untimed-scale", str(scale))
    wall = time.monotonic() - started
    assert report["steps"] == steps
    assert wall >= (scale - 1.0) * step_s * steps  # the untimed part was slept
    assert 0.9 * step_s <= report["step_time"] < 3.0 * step_s


def test_untimed_scale_below_one_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    with pytest.raises(SystemExit):
        _run(tmp_path / "bad", 1, 64, "--untimed-scale", "0.5")
    assert "--untimed-scale: expected a factor >= 1, got 0.5" in capsys.readouterr().err


def _run(directory: Path, steps: int, batch: int, *extra: str) -> dict:
    train(
        [
            *extra,
            "--local",
            str(directory),
            "--app",
            "ncf",
            "--profile-type",
            "rtx",
            "--batch-size",
            str(batch),
            "--dataset-size",
            str(batch * 42),
            "--max-steps",
            str(steps),
            "--epochs",
            "1",
            "--progress",
            "raw",
        ]
    )
    return json.loads((directory / "state" / "jobs" / "local" / "metrics.json").read_text())


@pytest.mark.heavy
def test_emulated_step_costs_little_cpu_at_a_large_batch(tmp_path: Path):
    """ncf on rtx at a local batch of 32,768: the profile (profiles/ncf/seed.csv) measured a
    20 ms step; the demo's emulated trainer reported 0.49 s there (it collated 32,768 samples
    one by one, 2.4 s of CPU per step here). Its own CPU work per step must now be a small
    part of the step, under half of it (10 ms), so that the pacing above sleeps the rest and
    its reported step is the profile's wherever it gets the CPU it needs. CPU time is not
    quite free of the machine's load (caches refilled after every switch): 2.8-4.1 ms per step
    at load 3-4, 5.9 ms once at load 14 in a loaded run of the suite (2026-11-27), where a
    bound of 25% (5 ms) failed. The wall-clock step it reports is a benchmark, not asserted
    here (it depends on the machine's load): 19.7-20.0 ms at load 12 on the shared 2-core
    machine, 33.5 ms at load 16, when a process gets an eighth of a core (issue 19's
    report)."""
    root = default_profiles_dir()
    profile = load_app_profile(root / "ncf", load_gpu_types(root / GPU_TYPES_FILE))
    (measured,) = [
        obs
        for obs in profile.seed["rtx"]
        if obs.gpus == 1 and obs.nodes == 1 and obs.local_bsz == 32768
    ]
    assert micro_batch_seconds(profile, "rtx", 32768) == pytest.approx(
        measured.step_time - measured.sync_time
    )
    batch = 32768
    before = time.process_time()
    _run(tmp_path / "one", 1, batch)
    setup = time.process_time() - before
    before = time.process_time()
    report = _run(tmp_path / "many", 41, batch)
    per_step = (time.process_time() - before - setup) / 40
    assert report["local_bsz"] == batch and report["steps"] == 41
    assert per_step < 0.5 * measured.step_time, f"{per_step * 1000:.1f} ms of CPU per step"
    assert report["step_time"] >= 0.9 * measured.step_time  # paced, never faster than profiled
