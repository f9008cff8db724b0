"""The emulated trainer takes a multi-GPU step's time from the app's measured traces, as the
simulator does, not the 1-GPU profile's (docs/fidelity.md: the yolov3 gap)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from sia_slurm.job.examples.emulated import (
    EmulatedTimes,
    StepTimes,
    load_job_profile,
    micro_batch_seconds,
)
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.protocol.profile import default_profiles_dir, load_profiles
from sia_slurm.sim.apps import default_traces_dir
from sia_slurm.sim.groundtruth import GroundTruth
from tests.job.conftest import MakeEnv
from tests.job.gloo import run_ranks


def _times(env: JobEnvironment) -> StepTimes:
    profile = load_profiles(default_profiles_dir()).app(env.app)
    return StepTimes.for_job(profile, env)


def test_a_4_gpu_step_takes_the_traces_time_and_a_1_gpu_step_the_profiles(
    make_env: MakeEnv,
) -> None:
    """yolov3 on a100 (profile dgx, traces dgx-ext), local batch 8: on 4 GPUs the traces say
    0.41 s (0.04 s of it the all-reduce), 1.35x the 1-GPU step the profile measured."""
    env = make_env(app="yolov3", gpu_type="a100", profile_gpu_type="dgx")
    times = _times(env)
    truth = GroundTruth.load(default_traces_dir(), "yolov3", "dgx-ext", calibration=1.0)
    step, sync = truth.step_time(1, 4, 8)
    at_4 = times.at("dgx", 1, 4, 8)
    assert at_4 == EmulatedTimes(float(step - sync), float(sync))
    assert at_4.step_s(1) == pytest.approx(float(step))
    profile = load_profiles(default_profiles_dir()).app("yolov3")
    assert times.at("dgx", 1, 1, 8) == EmulatedTimes(micro_batch_seconds(profile, "dgx", 8))
    assert at_4.step_s(1) > 1.3 * times.at("dgx", 1, 1, 8).step_s(1)
    two_nodes = truth.step_time(2, 8, 8)
    assert times.at("dgx", 2, 8, 8).step_s(1) == pytest.approx(float(two_nodes[0]))


def test_a_users_own_profile_keeps_the_1_gpu_time_on_every_shape(
    make_env: MakeEnv, tiny_profile: Path
) -> None:
    """Nobody measured traces of a ``--profile`` model, even one named like a shipped app."""
    env = make_env(app="yolov3", profile=str(tiny_profile), profile_gpu_type="rtx")
    times = StepTimes.for_job(load_job_profile(env), env)
    assert times.truth is None
    assert times.at("rtx", 1, 4, 8) == times.at("rtx", 1, 1, 8)


def test_an_optimizer_step_counts_every_micro_batch_and_one_all_reduce() -> None:
    assert EmulatedTimes(0.2, 0.05).step_s(3) == pytest.approx(0.65)
    assert EmulatedTimes(0.2, 0.05).scaled(2.0) == EmulatedTimes(0.4, 0.1)


@pytest.mark.heavy
def test_a_4_gpu_run_reports_the_traces_4_gpu_step_and_sync_time(make_env: MakeEnv) -> None:
    """bert on rtx, 4 replicas of 8: the traces' 4-GPU step is 0.58 s, 0.24 s of it the
    all-reduce (the 1-GPU profile: 0.37 s, nearly no all-reduce). Four real gloo processes
    report it, the all-reduce wait as sync time (slept inside DDP's all-reduce)."""
    env = make_env(
        app="bert",
        gpu_type="rtx",
        profile_gpu_type="rtx",
        gpus=4,
        batch_size=32,
        local_bsz=8,
        accum_steps=0,
        init_batch_size=12,
        max_batch_size=384,
    )
    expected = _times(env).at("rtx", 1, 4, 8)
    steps = 5
    command = [sys.executable, "-m", "sia_slurm.job.examples.emulated", "--progress", "raw"]
    command += ["--max-steps", str(steps), "--epochs", "1", "--dataset-size", "640"]
    assert run_ranks(command, env, 300, count=4, unset=("SIA_DEVCLUSTER_SPEED",)) == [0] * 4
    report = json.loads((env.state_dir / "jobs" / env.sia_id / "metrics.json").read_text())
    assert report["steps"] == steps and report["gpus"] == 4
    step_s = expected.step_s(1)
    assert 0.95 * step_s <= report["step_time"] <= 1.3 * step_s, (report, expected)
    assert 0.95 * expected.sync_s <= report["sync_time"] <= expected.sync_s + 0.3 * step_s
