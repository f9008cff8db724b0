"""sia-launch's pure steps: the allocation check, the command line, the environment."""

from __future__ import annotations

from pathlib import Path

import pytest

from launcher.launch import (
    EXIT_MISMATCH,
    STALE_SLURM_VARIABLES,
    LaunchError,
    SlurmAllocation,
    check_allocation,
    job_environment,
    split_command,
    stopped_on_request,
    torchrun_argv,
    worker_environment,
)
from sia_slurm.config import load_config
from sia_slurm.protocol import Assignment, JobSpec, StatePaths, StopRequest, write_document

SLURM = {
    "SLURM_JOB_ID": "41",
    "SLURM_JOB_PARTITION": "rtx",
    "SLURM_JOB_NUM_NODES": "2",
    "SLURM_GPUS_ON_NODE": "2",
    "SLURM_JOB_NODELIST": "rtx-[1-2]",
    "SLURM_RESTART_COUNT": "1",
}


def assignment(**overrides: object) -> Assignment:
    values: dict[str, object] = {
        "sia_id": "s1-abcd",
        "round_index": 7,
        "gpu_type": "rtx",
        "partition": "rtx",
        "nodes": 2,
        "gpus": 4,
        "node_list": (),
        "batch_size": 48,
        "local_bsz": 6,
        "accum_steps": 1,
    }
    values.update(overrides)
    return Assignment(**values)  # type: ignore[arg-type]


def test_allocation_is_read_from_the_launch_environment() -> None:
    allocation = SlurmAllocation.from_env(SLURM)
    assert (allocation.partition, allocation.nodes, allocation.gpus_per_node) == ("rtx", 2, 2)
    assert allocation.restart_count == 1
    first = SlurmAllocation.from_env({k: v for k, v in SLURM.items() if "RESTART" not in k})
    assert first.restart_count == 0
    with pytest.raises(LaunchError, match="SLURM_JOB_PARTITION: not set"):
        SlurmAllocation.from_env({k: v for k, v in SLURM.items() if "PARTITION" not in k})
    with pytest.raises(LaunchError, match="SLURM_JOB_NUM_NODES: expected an integer, got 'x'"):
        SlurmAllocation.from_env(SLURM | {"SLURM_JOB_NUM_NODES": "x"})


def test_matching_allocation_passes(config_path: Path) -> None:
    config = load_config(config_path)
    check_allocation(assignment(), SlurmAllocation.from_env(SLURM), config, ["rtx-1", "rtx-2"])
    named = assignment(node_list=("rtx-2", "rtx-1"), slurm_job_id="41")
    check_allocation(named, SlurmAllocation.from_env(SLURM), config, ["rtx-1", "rtx-2"])


def test_every_mismatch_is_named(config_path: Path) -> None:
    config = load_config(config_path)
    stale = assignment(
        gpu_type="a100",
        partition="a100",
        nodes=1,
        gpus=4,
        batch_size=48,
        local_bsz=6,
        node_list=("a100-1",),
        slurm_job_id="40",
    )
    with pytest.raises(LaunchError) as caught:
        check_allocation(stale, SlurmAllocation.from_env(SLURM), config, ["rtx-1", "rtx-2"])
    message = str(caught.value)
    assert caught.value.status == EXIT_MISMATCH
    for expected in (
        "assignment.json: gpu_type: a100, but partition rtx holds rtx",
        "assignment.json: partition: a100, but SLURM_JOB_PARTITION=rtx",
        "assignment.json: nodes: 1, but SLURM_JOB_NUM_NODES=2",
        "assignment.json: gpus per node: 4 (gpus=4), but SLURM_GPUS_ON_NODE=2",
        "assignment.json: slurm_job_id: 40, but SLURM_JOB_ID=41",
        "assignment.json: node_list: a100-1, but SLURM_JOB_NODELIST=rtx-[1-2]",
    ):
        assert expected in message
    with pytest.raises(LaunchError, match="SLURM_JOB_PARTITION=gpu is not a partition"):
        check_allocation(
            assignment(), SlurmAllocation.from_env(SLURM | {"SLURM_JOB_PARTITION": "gpu"}), config
        )


@pytest.mark.parametrize(
    ("command", "python", "args"),
    [
        (["python", "train.py", "--lr", "1"], "python", ["train.py", "--lr", "1"]),
        (
            ["/venv/bin/python3.11", "-m", "pkg.train", "-x"],
            "/venv/bin/python3.11",
            ["--module", "pkg.train", "-x"],
        ),
        (["train.py"], "/usr/bin/py", ["train.py"]),
        (["-m", "pkg"], "/usr/bin/py", ["--module", "pkg"]),
        (["./run.sh", "a b"], "/usr/bin/py", ["--no-python", "./run.sh", "a b"]),
    ],
)
def test_training_command_becomes_torchrun_arguments(
    command: list[str], python: str, args: list[str]
) -> None:
    assert split_command(command, "/usr/bin/py") == (python, args)


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ([], "command: empty"),
        (["python"], "without a script"),
        (["python", "-m"], "without a module"),
        (["python", "-u", "x.py"], "python option '-u' is not supported"),
    ],
)
def test_unusable_commands_are_refused(command: list[str], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        split_command(command, "/usr/bin/py")


def test_srun_line_runs_one_shielded_torchrun_agent_per_node() -> None:
    argv = torchrun_argv(
        SlurmAllocation.from_env(SLURM), assignment(), "10.0.0.1:29400", ["t.py"], "py"
    )
    assert argv == [
        "srun",
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--gpus-per-node=2",
        "--kill-on-bad-exit=1",
        "py",
        "-m",
        "launcher.agent",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=41",
        "--max-restarts=0",
        "t.py",
    ]


def test_workers_get_the_job_variables_and_not_the_stale_ones(config_path: Path) -> None:
    config = load_config(config_path)
    spec = JobSpec(sia_id="s1-abcd", app="cifar10", init_batch_size=0, command=("t.py",))
    environ = SLURM | {name: "9" for name in STALE_SLURM_VARIABLES} | {"SIA_LINGER_S": "5"}
    job = job_environment(spec, assignment(), SlurmAllocation.from_env(SLURM), config, environ)
    assert (job.gpu_type, job.profile_gpu_type, job.gpus, job.local_bsz) == ("rtx", "rtx", 4, 6)
    assert (job.init_batch_size, job.max_batch_size) == (128, 4096)  # cifar10's profile
    assert job.checkpoint_dir == config.state_dir / "jobs" / "s1-abcd" / "checkpoints"
    assert (job.launch_round, job.restarts, job.linger_s) == (7, 1, 5.0)
    env = worker_environment(environ, job)
    assert not set(STALE_SLURM_VARIABLES) & set(env)
    assert env["SIA_BATCH_SIZE"] == "48" and env["SLURM_JOB_NUM_NODES"] == "2"
    with pytest.raises(LaunchError, match="SIA_METRICS_INTERVAL_S: expected seconds"):
        job_environment(
            spec,
            assignment(),
            SlurmAllocation.from_env(SLURM),
            config,
            {"SIA_METRICS_INTERVAL_S": "soon"},
        )


def test_exit_status_says_stopped_only_for_an_acknowledged_later_stop(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    assert not stopped_on_request(paths, "s1-abcd", 7)
    write_document(paths.stop_request("s1-abcd"), StopRequest("s1-abcd", 7))
    paths.ack("s1-abcd", 7).touch()
    assert not stopped_on_request(paths, "s1-abcd", 7)  # the stop before this start
    write_document(paths.stop_request("s1-abcd"), StopRequest("s1-abcd", 8))
    assert not stopped_on_request(paths, "s1-abcd", 7)  # requested, not acknowledged
    paths.ack("s1-abcd", 8).touch()
    assert stopped_on_request(paths, "s1-abcd", 7)
