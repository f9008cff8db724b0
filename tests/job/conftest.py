"""Fixtures of the job-side tests: a controller config whose partitions match the dev cluster,
a tiny throughput profile with small per-GPU batch limits, and job environments."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.state.tree import set_up
from sia_slurm_dev import DEFAULT_SPEC, DevClusterSpec, controller_config

# Limits small enough that a move to rtx needs gradient accumulation; step times that differ
# per type so the emulated trainer's reports show which type it ran on.
TINY_APP = """\
description: tiny test model
init_batch_size: 16
max_batch_size: 256
min_local_bsz: 2
"""
TINY_LIMITS = "gpu_type,local_bsz\ndgx,64\nrtx,8\nt4,16\n"
TINY_SEED = """\
gpu_type,local_bsz,placement,step_time,sync_time
dgx,2,1,0.010,0.0005
dgx,64,1,0.030,0.0005
rtx,2,1,0.030,0.0005
rtx,8,1,0.040,0.0005
t4,2,1,0.050,0.0005
t4,16,1,0.080,0.0005
"""


def write_config(directory: Path) -> Path:
    """A sia.yaml with the dev cluster's partitions and its state directory under ``directory``,
    whose tree (control/, sticky jobs/) is made as ``sia-slurm setup`` makes it."""
    path = directory / "sia.yaml"
    spec = DevClusterSpec.parse(DEFAULT_SPEC)
    path.write_text(controller_config(spec, directory / "state", checkpoint_timeout_s=120))
    set_up(directory / "state", os.geteuid(), os.getegid())
    return path


def write_tiny_profile(directory: Path) -> Path:
    profile = directory / "tiny"
    profile.mkdir(parents=True)
    (profile / "app.yaml").write_text(TINY_APP)
    (profile / "max_local_bsz.csv").write_text(TINY_LIMITS)
    (profile / "seed.csv").write_text(TINY_SEED)
    return profile


@pytest.fixture
def config_path(tmp_path: Path) -> Path:
    return write_config(tmp_path)


@pytest.fixture
def tiny_profile(tmp_path: Path) -> Path:
    return write_tiny_profile(tmp_path / "profiles")


MakeEnv = Callable[..., JobEnvironment]


@pytest.fixture
def make_env(tmp_path: Path) -> MakeEnv:
    """A factory of one-GPU job environments under ``tmp_path`` (override any field)."""

    def make(**overrides: object) -> JobEnvironment:
        return _job_env(tmp_path, **overrides)

    return make


def _job_env(tmp_path: Path, **overrides: object) -> JobEnvironment:
    values: dict[str, object] = {
        "sia_id": "job-1",
        "state_dir": tmp_path / "state",
        "checkpoint_dir": tmp_path / "ckpt",
        "app": "tiny",
        "gpu_type": "a100",
        "profile_gpu_type": "dgx",
        "nodes": 1,
        "gpus": 1,
        "batch_size": 8,
        "local_bsz": 4,
        "accum_steps": 1,
        "init_batch_size": 8,
        "max_batch_size": 64,
        "launch_round": 1,
        "slurm_job_id": "7",
        "linger_s": 0.2,
        "poll_interval_s": 1e-9,  # poll the files at every step
    }
    values.update(overrides)
    return JobEnvironment(**values)  # type: ignore[arg-type]
