"""Backend selection and the pyslurm error paths (no pyslurm builds against Slurm 22.05 here,
so the binding is a stand-in module); plus the exact resubmission command line."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from sia_slurm.config import parse_config
from sia_slurm.slurm import commands
from sia_slurm.slurm.backend import SlurmBackend, build_backend
from sia_slurm.slurm.observe.jsonparse import parse_job
from sia_slurm.slurm.pyslurm_backend import (
    PyslurmBackend,
    PyslurmUnavailableError,
    job_record,
    load_pyslurm,
)
from sia_slurm.slurm.runner import CommandResult


class VersionRunner:
    def run(self, argv: list[str], *, check: bool = True) -> CommandResult:
        assert argv == ["scontrol", "--version"]
        return CommandResult(tuple(argv), 0, "slurm 22.05.8\n", "")


def config(tmp_path: Path, backend: str) -> Any:
    return parse_config(
        f"state_dir: {tmp_path}\npartitions:\n  t4: {{gpu_type: t4, gpus_per_node: 4}}\n"
        f"slurm: {{backend: {backend}}}\n"
    )


def fake_module(version: str) -> ModuleType:
    module = ModuleType("pyslurm")
    module.__version__ = version  # type: ignore[attr-defined]
    return module


def test_cli_is_the_default(tmp_path: Path) -> None:
    backend = build_backend(config(tmp_path, "cli"), VersionRunner())
    assert type(backend) is SlurmBackend


def test_missing_pyslurm_says_to_use_the_cli_backend(tmp_path: Path) -> None:
    def no_module(name: str) -> ModuleType:
        raise ImportError(f"No module named {name!r}")

    with pytest.raises(PyslurmUnavailableError) as caught:
        PyslurmBackend(config(tmp_path, "pyslurm"), VersionRunner(), importer=no_module)
    message = str(caught.value)
    assert "cannot be imported (No module named 'pyslurm')" in message
    assert "set `slurm.backend: cli`" in message


def test_pyslurm_for_another_slurm_is_refused() -> None:
    with pytest.raises(
        PyslurmUnavailableError, match=r"pyslurm 25\.11\.0 does not match Slurm 22\.05\.8"
    ):
        load_pyslurm("22.05.8", importer=lambda name: fake_module("25.11.0"))
    assert load_pyslurm("22.05.8", importer=lambda name: fake_module("22.5.3")) is not None


def test_pyslurm_backend_chosen_by_config(tmp_path: Path) -> None:
    module = fake_module("22.05.0")
    backend = PyslurmBackend(
        config(tmp_path, "pyslurm"), VersionRunner(), importer=lambda n: module
    )
    assert backend.pyslurm is module


def test_pyslurm_job_converts_like_squeue() -> None:
    job = SimpleNamespace(
        id=7,
        name="train",
        state="RUNNING",
        state_reason="None",
        comment="sia-slurm:x",
        partition="t4",
        allocated_nodes="t4-[1-2]",
        num_nodes=2,
        ntasks=2,
        required_nodes="t4-1,t4-2",
        requeue_count=1,
        priority=10,
        submit_time=1,
        start_time=2,
        eligible_time=2,
        end_time=None,
        user_id=1000,
        group_id=1000,
        working_directory="/w",
        standard_output="/w/o",
        standard_error="",
        standard_input="/dev/null",
        time_limit=None,
        account=None,
        qos=None,
        gres_per_node={"gpu": 2},
        get_resource_layout_per_node=lambda: {
            "t4-1": {"gres": {"gpu:t4": {"count": 2}}},
            "t4-2": {"gres": {"gpu:t4": 2}},
        },
    )
    parsed = parse_job(job_record(job))
    assert (parsed.job_id, parsed.nodes, parsed.gpus_per_node) == ("7", ("t4-1", "t4-2"), (2, 2))
    assert parsed.requested_gpus_per_node == 2 and parsed.restart_count == 1
    # Whose job it is and since when: the controller's record of the job is made from these.
    assert (parsed.user_id, parsed.group_id, parsed.submit_time) == (1000, 1000, 1.0)
    assert parsed.eligible_time == 2.0  # BeginTime: the relaunch floor's anchor


def test_resubmit_command_line_is_exact_and_shell_free() -> None:
    raw = {
        "job_id": 5,
        "name": "my job; rm -rf /",
        "job_state": "PENDING",
        "priority": 0,
        "comment": "sia-slurm:a",
        "partition": "a100",
        "nodes": "",
        "node_count": 2,
        "tasks": 2,
        "cpus": 8,
        "tres_per_node": "gres:gpu:4",
        "restart_cnt": 1,
        "user_id": 1000,
        "group_id": 100,
        "current_working_directory": "/home/u/my dir",
        "standard_output": "/home/u/out %j.txt",
        "standard_error": "",
        "standard_input": "",
        "time_limit": 60,
        "account": "proj",
        "qos": "",
    }
    shape = commands.Shape("t4", 1, 1, ("t4-1",))
    argv = commands.resubmit(parse_job(raw), shape, Path("/s/batch-script"), run_as_owner=True)
    assert argv == [
        "sbatch",
        "--parsable",
        "--hold",
        "--job-name=my job; rm -rf /",
        "--comment=sia-slurm:a",
        "--partition=t4",
        "--nodes=1-1",
        "--ntasks=1",
        "--cpus-per-task=4",
        "--gpus-per-node=1",
        "--nodelist=t4-1",
        "--requeue",
        "--open-mode=append",
        "--export=NONE",
        "--chdir=/home/u/my dir",
        "--output=/home/u/out %j.txt",
        "--account=proj",
        "--time=60",
        "--uid=1000",
        "--gid=100",
        "/s/batch-script",
    ]
    assert commands.parse_parsable("123;cluster\n") == "123"
    with pytest.raises(ValueError, match="expected a job id"):
        commands.parse_parsable("sbatch: error: Batch job submission failed")
