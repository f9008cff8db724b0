"""benchmarks/fidelity.py: both worlds must be told the same job (pure; no Slurm, no simulation).

The dev-cluster run submits each phoebe job with ``sia-sbatch``; the simulated run builds its
:class:`~sia_slurm.protocol.JobSpec` from the compressed truth. A job whose two versions differ
(a restart cost 10x too high on one side once starved imagenet for minutes on an empty cluster)
makes the comparison meaningless, so the submitted options are checked against the simulator's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.fidelity import (
    DEV_CLUSTER,
    compressed_truth,
    job_command,
    sbatch_argv,
    scaled_workload,
)
from sia_slurm.sim.inputs import job_spec, load_inputs, load_workload_truths

SCALE = 10.0


@pytest.fixture(scope="module")
def world() -> tuple:
    workload = scaled_workload(30, SCALE)
    truths = load_workload_truths([workload], load_inputs(DEV_CLUSTER))
    return workload, truths


def _option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_each_job_is_told_the_restart_cost_the_simulated_policy_is_told(world) -> None:
    workload, truths = world
    assert {job.application for job in workload.jobs} == {
        "bert", "cifar10", "deepspeech2", "imagenet", "yolov3",
    }  # fmt: skip
    for job in workload.jobs:
        truth = truths[job.application]
        argv = sbatch_argv(job, truth, SCALE, Path("/out"))
        simulated = job_spec(job, compressed_truth(truth, SCALE))
        assert float(_option(argv, "--restart-cost")) == pytest.approx(simulated.restart_cost)
        assert simulated.restart_cost == pytest.approx(truth.restart.assumed_s / SCALE)
        assert _option(argv, "--app") == simulated.app == job.application
        assert f"--output={Path('/out') / job.name}.out" in argv


def test_the_trainer_runs_at_the_apps_pace_towards_a_k_times_smaller_target(world) -> None:
    workload, truths = world
    for job in workload.jobs:
        truth = truths[job.application]
        argv = sbatch_argv(job, truth, SCALE, Path("/out"))
        command = argv[argv.index("--") + 1 :]
        assert command == job_command(truth, SCALE)
        # The trainer sleeps the app's uncompressed pace, slowed by its calibration factor where
        # the step timer does not see it (as the simulator); the work shrinks k times.
        assert float(_option(command, "--untimed-scale")) == pytest.approx(truth.calibration)
        assert "--time-scale" not in command
        target = float(_option(command, "--target-samples"))
        assert target == pytest.approx(truth.completion_samples / SCALE)
