"""A dev cluster's slower GPU types (sia_slurm/job/elastic/devspeed.py): the variables' parsing, the
stretch of one step with a fake clock, and a real 1-process run whose reported step times
double at factor 0.5."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticTrainer, JobEnvironment, devspeed
from sia_slurm.job.elastic.steps import StepStats
from sia_slurm_dev import speed
from tests.job.gloo import run_two_ranks

# --------------------------------------------------------------------------------------------
# parsing


def test_the_job_side_reads_the_variables_the_dev_cluster_writes() -> None:
    assert devspeed.SPEED_VARIABLE == speed.SPEED_VARIABLE
    assert devspeed.MEMORY_VARIABLE == speed.MEMORY_VARIABLE


def test_type_values_parse_with_spaces_and_an_empty_text_is_no_types() -> None:
    assert devspeed.parse_type_values("a100=1, rtx=0.349 ,t4=0.246") == {
        "a100": 1.0,
        "rtx": 0.349,
        "t4": 0.246,
    }
    assert devspeed.parse_type_values("") == {}
    assert devspeed.parse_type_values("  ") == {}


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("a100", "expected TYPE=NUMBER, got 'a100'"),
        ("=0.5", "expected TYPE=NUMBER, got '=0.5'"),
        ("a100=1,", "expected TYPE=NUMBER, got ''"),
        ("t4=fast", "t4: expected a positive number, got 'fast'"),
        ("t4=0", "t4: expected a positive number, got '0'"),
        ("t4=-0.5", "t4: expected a positive number, got '-0.5'"),
        ("t4=nan", "t4: expected a positive number, got 'nan'"),
        ("t4=inf", "t4: expected a positive number, got 'inf'"),
        ("t4=0.2,t4=0.3", "t4: given twice"),
    ],
)
def test_malformed_type_values_say_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        devspeed.parse_type_values(text)
    assert str(excinfo.value) == said


def test_speed_factor_of_a_type_and_full_speed_wherever_it_is_not_given() -> None:
    environ = {devspeed.SPEED_VARIABLE: "a100=1,t4=0.25"}
    assert devspeed.speed_factor("t4", environ) == 0.25
    assert devspeed.speed_factor("a100", environ) == 1.0
    assert devspeed.speed_factor("rtx", environ) == 1.0  # a type it does not name
    assert devspeed.speed_factor("t4", {}) == 1.0  # a real cluster


@pytest.mark.parametrize("value", ["t4=fast", "t4=2", "t4"])
def test_a_malformed_speed_is_a_warning_and_no_slowdown(
    value: str, caplog: pytest.LogCaptureFixture
) -> None:
    environ = {devspeed.SPEED_VARIABLE: f"a100=1,{value},rtx=0.5"}
    with caplog.at_level(logging.WARNING, logger="sia_slurm.job.elastic.devspeed"):
        assert devspeed.speed_factor("rtx", environ) == 1.0
        assert devspeed.speed_factor("rtx", environ) == 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # once per value, not once per step
    assert "SIA_DEVCLUSTER_SPEED" in warnings[0] and "ignored (no slowdown)" in warnings[0]


def test_emulated_memory_of_a_type_and_none_where_there_is_no_limit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environ = {devspeed.MEMORY_VARIABLE: "a100=320,rtx=88"}
    assert devspeed.emulated_memory("rtx", environ) == 88
    assert devspeed.emulated_memory("t4", environ) is None
    assert devspeed.emulated_memory("rtx", {}) is None
    with caplog.at_level(logging.WARNING, logger="sia_slurm.job.elastic.devspeed"):
        assert devspeed.emulated_memory("rtx", {devspeed.MEMORY_VARIABLE: "rtx=8.5"}) is None
    assert "ignored (no memory limit)" in caplog.text


# --------------------------------------------------------------------------------------------
# one step, a fake clock


@dataclass(frozen=True)
class _Env:
    gpu_type: str


class _Job:
    """The part of an ElasticJob that pace_step reads."""

    def __init__(self, gpu_type: str, replicas: int = 2):
        self.env = _Env(gpu_type)
        self.replicas = replicas


class _Clock:
    def __init__(self, now: float):
        self.now = now
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def _pace(
    job: _Job, stats: StepStats, last_start: float | None, clock: _Clock, cpu: float | None = None
) -> float:
    """``cpu``: the CPU seconds the step used (None: as much as its wall time)."""
    cpu_clock = None if cpu is None else (lambda: stats.started_cpu + cpu)
    return devspeed.pace_step(  # type: ignore[arg-type]
        job, stats, last_start, clock=clock, sleep=clock.sleep, cpu_clock=cpu_clock
    )


def test_ddps_own_forward_work_is_not_stretched(monkeypatch: pytest.MonkeyPatch) -> None:
    """0.4 s from the first micro-batch to the last gradient, 0.1 s of it DDP's forward
    before the model's (its buffer broadcast): factor 0.25 sleeps 3 x 0.3 s."""
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "t4=0.25")
    stats = StepStats(started=10.0, sync_ready=10.4, sync_done=10.45, ddp_forward_s=0.1)
    assert _pace(_Job("t4"), stats, 10.0, _Clock(10.5)) == pytest.approx(0.9)


def test_time_waiting_on_peers_is_not_stretched(monkeypatch: pytest.MonkeyPatch) -> None:
    """A step that took 1 s, of which its own work was 0.1 s of CPU (it waited 0.9 s for a
    slower peer): it sleeps 3 x 0.1 s, not 3 x 1 s."""
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "t4=0.25")
    stats = StepStats(started=0.0, sync_ready=1.0, sync_done=1.1)
    assert _pace(_Job("t4"), stats, 0.0, _Clock(1.2), cpu=0.1) == pytest.approx(0.3)


def test_a_lone_replica_stretches_its_whole_wall_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """One replica (a profiling run's one GPU) waits on no peer: a step of 1 s wall, 0.1 s of
    CPU (the shared CPU busy elsewhere the rest) sleeps 3 x 1 s, so the type stays 4x slower
    than a full-speed one under the same load."""
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "t4=0.25")
    stats = StepStats(started=0.0, sync_ready=1.0, sync_done=1.1)
    assert _pace(_Job("t4", replicas=1), stats, 0.0, _Clock(1.2), cpu=0.1) == pytest.approx(3.0)


def test_a_jobs_first_stretched_step_is_logged_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A run's log says its type was emulated, and at what factor (once, at its first
    stretched step); a type at full speed says nothing."""
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "a100=1,t4=0.25")
    slow, fast = _Job("t4", replicas=1), _Job("a100", replicas=1)
    with caplog.at_level(logging.INFO, logger="sia_slurm.job.elastic.devspeed"):
        for started in (0.0, 2.0):
            for job in (slow, fast):
                stats = StepStats(started=started, sync_ready=started + 0.1)
                _pace(job, stats, started, _Clock(started + 0.1))
    assert [r.getMessage() for r in caplog.records] == [
        "t4 emulated at speed factor 0.25 (SIA_DEVCLUSTER_SPEED): the first step's 100 ms of "
        "compute slept 300 ms more"
    ]


@pytest.mark.heavy
def test_two_replicas_on_a_slow_type_keep_training() -> None:
    """Each replica sleeping its factor times the time it waited for the other made the sleeps
    grow 1/f - 1 times every step: 2 replicas at factor 0.35 stopped dead after ~17 steps."""
    work = Path(tempfile.mkdtemp())
    (work / "state" / "jobs" / "j").mkdir(parents=True)
    env = JobEnvironment(
        sia_id="j", state_dir=work / "state", checkpoint_dir=work / "ck", app="x",
        gpu_type="rtx", profile_gpu_type="rtx", nodes=1, gpus=2, batch_size=64, local_bsz=32,
        accum_steps=0, init_batch_size=64, max_batch_size=512, launch_round=0,
    )  # fmt: skip
    # 24 steps: past the 17 at which the growing sleeps stopped it; 300 s: two ranks of a
    # transformer on a machine at load 16 took over 120 s for 40 steps
    command = [sys.executable, "-m", "sia_slurm.job.examples.transformer", "--epochs", "1000",
               "--max-steps", "24", "--dataset-size", "512"]  # fmt: skip
    os.environ[devspeed.SPEED_VARIABLE] = "rtx=0.35"
    try:
        assert run_two_ranks(command, env, 300) == [0, 0]
    finally:
        del os.environ[devspeed.SPEED_VARIABLE]
        shutil.rmtree(work, ignore_errors=True)


def test_a_step_sleeps_its_whole_compute_and_reports_the_last_micro_batch_share(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Factor 0.25 on t4: a step of two micro-batches, 0.2 s of compute each (from 10.0 to
    10.4), then 0.05 s of all-reduce. It sleeps 3 x 0.4 s; the synchronising micro-batch (from
    10.2) reports 0.2 x 4 + 0.05 s, its all-reduce wait unchanged."""
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "a100=1,t4=0.25")
    stats = StepStats(started=10.0, sync_ready=10.4, sync_done=10.45)
    clock = _Clock(10.5)  # after the optimizer step
    assert _pace(_Job("t4"), stats, 10.2, clock) == pytest.approx(1.2)
    assert clock.slept == pytest.approx([1.2])
    assert stats.sync_ready is not None and stats.sync_done is not None
    assert stats.sync_done - 10.2 == pytest.approx(0.85)
    assert stats.sync_done - stats.sync_ready == pytest.approx(0.05)


def test_a_step_without_the_model_wrappers_timing_counts_to_now(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "t4=0.5")
    stats = StepStats(started=1.0)
    clock = _Clock(1.3)
    assert _pace(_Job("t4"), stats, 1.0, clock) == pytest.approx(0.3)
    assert (stats.sync_ready, stats.sync_done) == pytest.approx((1.6, 1.6))


def test_full_speed_an_exempt_job_and_a_real_cluster_leave_the_step_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "a100=1,t4=0.25")
    exempt = _Job("t4")
    devspeed.exempt(exempt)  # type: ignore[arg-type]
    for job in (_Job("a100"), _Job("v100"), exempt):
        stats = StepStats(started=0.0, sync_ready=1.0, sync_done=1.1)
        clock = _Clock(2.0)
        assert _pace(job, stats, 0.0, clock) == 0.0
        assert clock.slept == [] and (stats.sync_ready, stats.sync_done) == (1.0, 1.1)
    monkeypatch.delenv(devspeed.SPEED_VARIABLE)
    stats = StepStats(started=0.0, sync_ready=1.0, sync_done=1.1)
    assert _pace(_Job("t4"), stats, 0.0, _Clock(2.0)) == 0.0


# --------------------------------------------------------------------------------------------
# a real run

COMPUTE_S = 0.03


class _SlowLinear(torch.nn.Linear):
    """A model whose forward pass takes COMPUTE_S of CPU, as a dev cluster's compute does (the
    factor stretches the step's own work, measured in CPU time, never its waits)."""

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        until = time.process_time() + COMPUTE_S
        while time.process_time() < until:
            pass
        return super().forward(inputs)


def _mean_step(env: JobEnvironment) -> tuple[float, float, float]:
    """(reported step time, reported sync time, wall seconds per step) of one epoch."""
    torch.manual_seed(0)
    data = torch.randn(24, 4)
    dataset = TensorDataset(data, data.sum(1))
    model = _SlowLinear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = ElasticTrainer(
        model, optimizer, dataset, env=env, install_signal_handlers=False, lr_scaling="none"
    )
    started = time.perf_counter()
    for _ in trainer.epochs(1):
        for step in trainer.steps():
            for x, y in step.micro_batches():
                step.backward(F.mse_loss(trainer.model(x).squeeze(1), y))
            step.finish()
    wall = (time.perf_counter() - started) / trainer.step
    (totals,) = trainer.reporter.profile.values()
    return totals.step_time / totals.count, totals.sync_time / totals.count, wall


def test_factor_one_half_sleeps_each_steps_compute_and_reports_the_last_micro_batchs_share(
    make_env, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    """An a100 job at factor 0.5, two micro-batches a step of at least COMPUTE_S of CPU each:
    every step sleeps at least its two micro-batches' compute and its reported step time grows
    by at least the last one's. Only lower
    bounds on times, so that a loaded machine cannot fail it: the sleep is bounded by the CPU
    time, which the busy loop guarantees, while the wall time grows with the load (a ratio of
    two runs' wall times failed CI at 1.56 with three pytest sessions on two cores)."""
    options = {"batch_size": 8, "local_bsz": 4, "accum_steps": 1}
    slept: list[float] = []
    pace = devspeed.pace_step

    def recorded(*args, **kwargs) -> float:  # type: ignore[no-untyped-def]
        slept.append(pace(*args, **kwargs))
        return slept[-1]

    monkeypatch.setattr(devspeed, "pace_step", recorded)
    monkeypatch.delenv(devspeed.SPEED_VARIABLE, raising=False)
    _mean_step(make_env(checkpoint_dir=tmp_path / "plain", **options))
    assert slept and set(slept) == {0.0}  # no variable: full speed
    slept.clear()
    monkeypatch.setenv(devspeed.SPEED_VARIABLE, "a100=0.5,t4=0.25")
    step_time, _, wall = _mean_step(make_env(checkpoint_dir=tmp_path / "slow", **options))
    assert len(slept) == 3 and min(slept) >= 2 * COMPUTE_S, slept  # (1/0.5 - 1) x >= 2 x COMPUTE_S
    assert step_time >= 2 * COMPUTE_S  # its own compute, then as long again
    assert wall >= 4 * COMPUTE_S  # two micro-batches, then as long again
    # That the all-reduce's wait (the sync time) is not stretched is checked exactly with a
    # fake clock (test_a_step_sleeps_its_whole_compute_and_reports_the_last_micro_batch_share):
    # here it is a wall time, 38 ms once for a 1-process all-reduce on a machine at load 16.
