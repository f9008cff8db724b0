"""sia-launch's pure steps: the allocation check, the command line, the environment."""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

import sia_slurm.job.launch
from sia_slurm.job.grant import (
    EXIT_MISMATCH,
    LaunchError,
    SlurmAllocation,
    await_grant,
    check_allocation,
)
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.job.launch import (
    STALE_SLURM_VARIABLES,
    job_environment,
    launch,
    split_command,
    torchrun_argv,
    worker_environment,
)
from sia_slurm.job.runs import TrainingRecord, mark_task, write_training
from sia_slurm.job.settings import JobSiteSettings, load_job_settings
from sia_slurm.protocol import (
    Assignment,
    JobSpec,
    RunExit,
    RunRefusal,
    StatePaths,
    StopRequest,
    read_document,
    refusal_name,
    write_document,
)

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
        "slurm_job_id": "41",  # the run of SLURM below: job 41 after one restart
        "slurm_restart_count": 1,
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
    settings = load_job_settings(config_path)
    check_allocation(assignment(), SlurmAllocation.from_env(SLURM), settings, ["rtx-1", "rtx-2"])
    named = assignment(node_list=("rtx-2", "rtx-1"))
    check_allocation(named, SlurmAllocation.from_env(SLURM), settings, ["rtx-1", "rtx-2"])


@pytest.mark.parametrize(
    ("job_id", "restarts"),
    [("40", 1), ("41", 0), ("41", 2), ("", 1)],
    ids=["another-job", "the-run-before", "a-later-run", "no-run-named"],
)
def test_only_the_granted_run_may_train(config_path: Path, job_id: str, restarts: int) -> None:
    """Job and shape may match: a run the assignment was not written for (the user's own
    release or requeue, Slurm's requeue) is not the controller's grant."""
    settings = load_job_settings(config_path)
    granted = assignment(slurm_job_id=job_id, slurm_restart_count=restarts)
    with pytest.raises(LaunchError) as caught:
        check_allocation(granted, SlurmAllocation.from_env(SLURM), settings, ["rtx-1", "rtx-2"])
    assert caught.value.status == EXIT_MISMATCH
    (problem,) = str(caught.value).splitlines()[1:]
    assert problem.strip() == (
        f"assignment.json: written for Slurm job {job_id or '-'} run {restarts}, but this is "
        "SLURM_JOB_ID=41 SLURM_RESTART_COUNT=1: not granted by the controller"
    )


def test_every_mismatch_is_named(config_path: Path) -> None:
    settings = load_job_settings(config_path)
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
        check_allocation(stale, SlurmAllocation.from_env(SLURM), settings, ["rtx-1", "rtx-2"])
    message = str(caught.value)
    assert caught.value.status == EXIT_MISMATCH
    for expected in (
        "assignment.json: gpu_type: a100, but partition rtx holds rtx",
        "assignment.json: partition: a100, but SLURM_JOB_PARTITION=rtx",
        "assignment.json: nodes: 1, but SLURM_JOB_NUM_NODES=2",
        "assignment.json: gpus per node: 4 (gpus=4), but SLURM_GPUS_ON_NODE=2",
        "assignment.json: written for Slurm job 40 run 1, but this is SLURM_JOB_ID=41 "
        "SLURM_RESTART_COUNT=1",
        "assignment.json: node_list: a100-1, but SLURM_JOB_NODELIST=rtx-[1-2]",
    ):
        assert expected in message
    with pytest.raises(LaunchError, match="SLURM_JOB_PARTITION=gpu is not a partition"):
        check_allocation(
            assignment(), SlurmAllocation.from_env(SLURM | {"SLURM_JOB_PARTITION": "gpu"}), settings
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
        "sia_slurm.job.agent",
        "--nnodes=2",
        "--nproc-per-node=2",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=10.0.0.1:29400",
        "--rdzv-id=41",
        "--max-restarts=0",
        "t.py",
    ]


def test_workers_get_the_job_variables_and_not_the_stale_ones(config_path: Path) -> None:
    settings = load_job_settings(config_path)
    spec = JobSpec(sia_id="s1-abcd", app="cifar10", init_batch_size=0, command=("t.py",))
    environ = SLURM | {name: "9" for name in STALE_SLURM_VARIABLES} | {"SIA_LINGER_S": "5"}
    allocation, hostnames = SlurmAllocation.from_env(SLURM), ["rtx-1", "rtx-2"]
    job = job_environment(spec, assignment(), allocation, settings, environ, hostnames)
    assert JobEnvironment.from_env(job.to_env()).hostnames == ("rtx-1", "rtx-2")  # the run's
    assert (job.gpu_type, job.profile_gpu_type, job.gpus, job.local_bsz) == ("rtx", "rtx", 4, 6)
    assert (job.init_batch_size, job.max_batch_size) == (128, 4096)  # cifar10's profile
    assert job.checkpoint_dir == settings.state_dir / "jobs" / "s1-abcd" / "checkpoints"
    assert (job.launch_round, job.restarts, job.linger_s) == (7, 1, 5.0)
    env = worker_environment(environ, job)
    assert not set(STALE_SLURM_VARIABLES) & set(env)
    assert env["SIA_BATCH_SIZE"] == "48" and env["SLURM_JOB_NUM_NODES"] == "2"
    with pytest.raises(LaunchError, match="SIA_METRICS_INTERVAL_S: expected seconds"):
        job_environment(
            spec,
            assignment(),
            SlurmAllocation.from_env(SLURM),
            settings,
            {"SIA_METRICS_INTERVAL_S": "soon"},
        )


def test_a_profiling_run_gets_its_sweep_and_the_users_step_count(config_path: Path) -> None:
    settings = load_job_settings(config_path)
    spec = JobSpec(sia_id="s1-abcd", app="cifar10", init_batch_size=0, command=("t.py",))
    one_gpu = assignment(
        nodes=1, gpus=1, batch_size=8, local_bsz=8, accum_steps=0, profile_sweep=(2, 4)
    )
    allocation = SlurmAllocation.from_env(SLURM)
    job = job_environment(spec, one_gpu, allocation, settings, {"SIA_PROFILE_STEPS": "5"})
    assert (job.sweep, job.profile_steps) == ((2, 4), 5)
    assert job.to_env()["SIA_PROFILE_SWEEP"] == "2,4"
    assert job_environment(spec, assignment(), allocation, settings, {}).sweep == ()
    with pytest.raises(LaunchError, match=r"SIA_PROFILE_STEPS: expected 1\.\.100"):
        job_environment(spec, one_gpu, allocation, settings, {"SIA_PROFILE_STEPS": "0"})


# ------------------------------------------------------------------------------------------------
# Waiting for the grant


class Clock:
    """A monotonic clock that moves only when the launcher sleeps; ``on_sleep`` runs at each
    sleep (the controller acting meanwhile)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []
        self.on_sleep = lambda now: None

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.on_sleep(self.now)


def grant_args(config_path: Path) -> tuple[StatePaths, SlurmAllocation, JobSiteSettings]:
    settings = load_job_settings(config_path)
    return StatePaths(settings.state_dir), SlurmAllocation.from_env(SLURM), settings


def wait(config_path: Path, clock: Clock, wait_s: float = 60.0) -> Assignment:
    paths, allocation, settings = grant_args(config_path)
    return await_grant(
        paths, "s1-abcd", allocation, settings, ["rtx-1", "rtx-2"], wait_s,
        poll_s=2.0, clock=clock, sleep=clock.sleep,
    )  # fmt: skip


def test_the_granted_run_starts_at_once(config_path: Path) -> None:
    paths, _, _ = grant_args(config_path)
    write_document(paths.assignment("s1-abcd"), assignment())
    clock = Clock()
    assert wait(config_path, clock) == assignment()
    assert clock.sleeps == []


def test_a_run_waits_for_its_grant_written_late(
    config_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The assignment of the run before (restart 0) is there when Slurm starts this one: the
    launcher trains nothing and re-reads it until the controller's for this run arrives."""
    paths, _, _ = grant_args(config_path)
    write_document(paths.assignment("s1-abcd"), assignment(slurm_restart_count=0))
    clock = Clock()

    def controller(now: float) -> None:
        if now >= 7.0:
            write_document(paths.assignment("s1-abcd"), assignment(round_index=8))

    clock.on_sleep = controller
    with caplog.at_level(logging.WARNING, logger="sia-launch"):
        granted = wait(config_path, clock)
    assert granted == assignment(round_index=8)
    assert clock.sleeps == [2.0] * 4  # re-read every poll_s until it matched
    assert caplog.text.count("not training:") == 1  # the same problem is said once
    assert "written for Slurm job 41 run 0" in caplog.text
    assert "waiting for the controller to requeue this run" in caplog.text


def test_a_run_never_granted_gives_up_after_the_wait(config_path: Path) -> None:
    paths, _, _ = grant_args(config_path)
    write_document(paths.assignment("s1-abcd"), assignment(slurm_job_id="40"))
    clock = Clock()
    with pytest.raises(LaunchError) as caught:
        wait(config_path, clock, wait_s=30.0)
    assert caught.value.status == EXIT_MISMATCH
    assert "written for Slurm job 40 run 1" in str(caught.value)
    assert clock.now == 30.0 and clock.sleeps == [2.0] * 15


def test_a_missing_assignment_is_waited_for_too(config_path: Path) -> None:
    clock = Clock()
    with pytest.raises(LaunchError) as caught:
        wait(config_path, clock, wait_s=10.0)
    assert caught.value.status == EXIT_MISMATCH
    assert "assignment.json: cannot read" in str(caught.value)
    assert len(clock.sleeps) == 5
    paths, _, _ = grant_args(config_path)
    write_document(paths.assignment("s1-abcd"), replace(assignment(), sia_id="other"))
    with pytest.raises(LaunchError, match="sia_id is 'other'"):
        wait(config_path, Clock(), wait_s=4.0)


def refusals(paths: StatePaths) -> list[str]:
    return sorted(n for n in os.listdir(paths.job_dir("s1-abcd")) if n.startswith("refusal-"))


def test_a_run_its_assignment_names_on_another_allocation_records_its_refusal(
    config_path: Path,
) -> None:
    """Slurm started the very run the assignment names (job 41 run 1 on rtx-[1-2]) with
    ``SLURM_GPUS_ON_NODE=0``: the launcher leaves its refusal for the controller while it
    waits, and withdraws it once the assignment names the next run (the controller
    requeued this one)."""
    paths, allocation, settings = grant_args(config_path)
    write_document(paths.assignment("s1-abcd"), assignment(node_list=("rtx-2", "rtx-1")))
    seen: list[RunRefusal | None] = []
    clock = Clock()

    def controller(now: float) -> None:
        path = paths.job_dir("s1-abcd") / refusal_name("41", 1)
        seen.append(read_document(RunRefusal, path) if path.exists() else None)
        if now >= 4.0:
            write_document(paths.assignment("s1-abcd"), assignment(slurm_restart_count=2))

    clock.on_sleep = controller
    with pytest.raises(LaunchError) as caught:
        await_grant(
            paths, "s1-abcd", replace(allocation, gpus_per_node=0), settings, ["rtx-1", "rtx-2"],
            8.0, poll_s=2.0, clock=clock, sleep=clock.sleep,
        )  # fmt: skip
    refusal = seen[0]
    assert refusal is not None and seen == [refusal, refusal, None, None]
    run = (refusal.sia_id, refusal.slurm_job_id, refusal.slurm_restart_count)
    assert run == ("s1-abcd", "41", 1)
    assert (refusal.node_list, refusal.round_index) == (("rtx-1", "rtx-2"), 7)
    assert "SLURM_GPUS_ON_NODE=0" in refusal.message
    assert "written for Slurm job 41 run 2" in str(caught.value)  # then not this run's
    assert refusals(paths) == []


def test_a_refusal_is_withdrawn_when_the_launcher_gives_up(config_path: Path) -> None:
    paths, allocation, settings = grant_args(config_path)
    write_document(paths.assignment("s1-abcd"), assignment())
    clock = Clock()
    clock.on_sleep = lambda now: seen.append(refusals(paths))
    seen: list[list[str]] = []
    with pytest.raises(LaunchError, match="SLURM_JOB_PARTITION=t4"):
        await_grant(
            paths, "s1-abcd", replace(allocation, partition="t4"), settings, ["t4-1", "t4-2"],
            4.0, poll_s=2.0, clock=clock, sleep=clock.sleep,
        )  # fmt: skip
    assert seen == [["refusal-41.1.json"]] * 2
    assert refusals(paths) == []


@pytest.mark.parametrize(
    "granted",
    [
        None,  # none yet
        assignment(slurm_restart_count=0),  # the run before's: this run's may come late
        assignment(slurm_job_id="40"),  # another job's
        assignment(node_list=("rtx-3", "rtx-4")),  # the same identity on other nodes
    ],
)
def test_no_refusal_without_an_assignment_for_this_very_run(
    config_path: Path, granted: Assignment | None
) -> None:
    paths, allocation, settings = grant_args(config_path)
    paths.job_dir("s1-abcd").mkdir(exist_ok=True)
    if granted is not None:
        write_document(paths.assignment("s1-abcd"), granted)
    clock = Clock()
    seen: list[list[str]] = []
    clock.on_sleep = lambda now: seen.append(refusals(paths))
    with pytest.raises(LaunchError):
        await_grant(
            paths, "s1-abcd", replace(allocation, gpus_per_node=0), settings, ["rtx-1", "rtx-2"],
            4.0, poll_s=2.0, clock=clock, sleep=clock.sleep,
        )  # fmt: skip
    assert seen == [[], []]


@pytest.mark.parametrize(
    ("round_seconds", "environ", "expected"),
    [(60.0, {}, 180.0), (10.0, {}, 60.0), (60.0, {"SIA_MISMATCH_WAIT_S": "7.5"}, 7.5)],
)
def test_launch_waits_three_rounds_or_sia_mismatch_wait_s(
    config_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    round_seconds: float,
    environ: dict[str, str],
    expected: float,
) -> None:
    """At least three rounds (the controller requeues an ungranted run at its next), at
    least a minute, unless SIA_MISMATCH_WAIT_S says otherwise."""
    settings = replace(load_job_settings(config_path), round_seconds=round_seconds)
    paths = StatePaths(settings.state_dir)
    paths.job_dir("s1-abcd").mkdir()
    write_document(paths.spec("s1-abcd"), JobSpec("s1-abcd", "cifar10", command=("t.py",)))
    monkeypatch.setattr(sia_slurm.job.launch, "expand_hostnames", lambda runner, nodes: ["rtx-1"])
    monkeypatch.setattr(sia_slurm.job.launch, "node_address", lambda runner, node: node)
    waited: list[float] = []

    def give_up(*args: object, **kwargs: object) -> Assignment:
        waited.append(args[-1])  # type: ignore[arg-type]
        raise LaunchError("not granted", EXIT_MISMATCH)

    monkeypatch.setattr(sia_slurm.job.launch, "await_grant", give_up)
    with pytest.raises(LaunchError, match="not granted"):
        launch(settings, "s1-abcd", SLURM | environ)
    assert waited == [expected]
    with pytest.raises(LaunchError, match="SIA_MISMATCH_WAIT_S: expected seconds > 0"):
        launch(settings, "s1-abcd", SLURM | {"SIA_MISMATCH_WAIT_S": "0"})


class _FakeChild:
    """srun's stand-in: exits with ``status``, or as if Slurm signalled the launcher."""

    status = 0
    terminated = 0

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        pass

    def wait(self) -> int:
        return self.status


def granted_job(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[JobSiteSettings, StatePaths, Path]:
    """Job s1-abcd with its spec, on rtx-1, granted at once (:func:`assignment`): what
    ``launch`` needs before it runs srun. Returns the settings, the state paths, the job's
    directory."""
    settings = load_job_settings(config_path)
    paths = StatePaths(settings.state_dir)
    job_dir = paths.job_dir("s1-abcd")
    job_dir.mkdir()
    write_document(paths.spec("s1-abcd"), JobSpec("s1-abcd", "cifar10", command=("t.py",)))
    monkeypatch.setattr(sia_slurm.job.launch, "expand_hostnames", lambda runner, nodes: ["rtx-1"])
    monkeypatch.setattr(sia_slurm.job.launch, "node_address", lambda runner, node: node)
    monkeypatch.setattr(sia_slurm.job.launch, "await_grant", lambda *a, **k: assignment())
    return settings, paths, job_dir


@pytest.mark.parametrize(
    ("status", "terminated", "training", "cause", "exit_status"),
    [
        (0, 0, "completed", "completed", 0),
        (1, 0, "", "failed", 1),
        (1, 0, None, "launch_failed", 1),  # srun started no task
        (0, 0, "killed", "aborted", 77),  # srun exited 0 under a killed trainer
        (143, 15, "", "terminated", 143),
    ],
)
def test_every_run_leaves_how_it_ended_for_the_controller(
    config_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    status: int,
    terminated: int,
    training: str | None,
    cause: str,
    exit_status: int,
) -> None:
    """``exit-<job>.<restart>.json`` tells the controller whether the job's own code failed
    (``failed``: it spends --max-failures) or Slurm ended the run (brought back), judged from
    srun's status and what the job side left (``training``: None, no task started; "", a task
    started and no trainer; else the trainer's record); the evidence is gone afterwards."""
    settings, _, job_dir = granted_job(config_path, monkeypatch)
    monkeypatch.setattr(sia_slurm.job.launch, "slurm_ended", lambda *a: "")  # a healthy cluster

    def run(self: _FakeChild, on_terminate: Callable[[], None] | None = None) -> int:
        if training is not None:
            mark_task(job_dir, "41", 1, 0)
        if training:
            end = None if training == "killed" else training
            write_training(job_dir, "41", 1, TrainingRecord(33, end))
        return status

    child = type("Child", (_FakeChild,), {"terminated": terminated, "wait": run})
    monkeypatch.setattr(sia_slurm.job.launch, "_Child", child)
    assert launch(settings, "s1-abcd", SLURM) == exit_status
    record = read_document(RunExit, job_dir / "exit-41.1.json")
    assert (record.cause, record.status) == (cause, exit_status)
    assert (record.slurm_job_id, record.slurm_restart_count) == ("41", 1)
    assert sorted(p.name for p in job_dir.iterdir()) == ["exit-41.1.json", "spec.json"]


def test_a_stopped_run_says_so_when_slurms_sigterm_comes_not_only_when_srun_exits(
    config_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Slurm SIGKILLs the batch script KillWait after its SIGTERM, and srun may still wait for
    a slow step then (loaded run 30): the record and the log line must be out by the
    SIGTERM's handling, and the line said once when srun does exit."""
    settings, paths, job_dir = granted_job(config_path, monkeypatch)
    line = "[job=s1-abcd] stopped on request and checkpointed; exit 75"
    seen_at_sigterm: list[tuple[bool, bool]] = []

    def run(self: _FakeChild, on_terminate: Callable[[], None] | None = None) -> int:
        write_document(paths.stop_request("s1-abcd"), StopRequest("s1-abcd", 8, 0.0))
        paths.ack("s1-abcd", 8, "41", 1).touch()  # this run acknowledged the stop
        assert on_terminate is not None
        on_terminate()  # Slurm's SIGTERM, srun still waiting for its step
        seen_at_sigterm.append(((job_dir / "exit-41.1.json").exists(), line in caplog.text))
        return 143

    child = type("Child", (_FakeChild,), {"terminated": signal.SIGTERM, "wait": run})
    monkeypatch.setattr(sia_slurm.job.launch, "_Child", child)
    with caplog.at_level(logging.INFO, logger="sia-launch"):
        assert launch(settings, "s1-abcd", SLURM) == 75
    assert seen_at_sigterm == [(True, True)]
    assert caplog.text.count(line) == 1
    record = read_document(RunExit, job_dir / "exit-41.1.json")
    assert (record.cause, record.status) == ("stopped", 75)


def test_a_refused_or_invalid_launch_is_recorded_too(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = load_job_settings(config_path)
    paths = StatePaths(settings.state_dir)
    paths.job_dir("s1-abcd").mkdir()
    with pytest.raises(LaunchError, match=r"spec\.json"):  # no spec: the job is not launchable
        launch(settings, "s1-abcd", SLURM)
    record = read_document(RunExit, paths.job_dir("s1-abcd") / "exit-41.1.json")
    assert (record.cause, record.status) == ("invalid", 2)
    write_document(paths.spec("s1-abcd"), JobSpec("s1-abcd", "cifar10", command=("t.py",)))
    monkeypatch.setattr(sia_slurm.job.launch, "expand_hostnames", lambda runner, nodes: ["rtx-1"])
    monkeypatch.setattr(sia_slurm.job.launch, "node_address", lambda runner, node: node)

    def refuse(*args: object, **kwargs: object) -> Assignment:
        raise LaunchError("not granted", EXIT_MISMATCH)

    monkeypatch.setattr(sia_slurm.job.launch, "await_grant", refuse)
    with pytest.raises(LaunchError, match="not granted"):
        launch(settings, "s1-abcd", SLURM)
    record = read_document(RunExit, paths.job_dir("s1-abcd") / "exit-41.1.json")
    assert (record.cause, record.status, record.message) == ("refused", 3, "not granted")


def test_a_forwarded_sigterm_is_acted_on_while_srun_still_waits_for_its_step() -> None:
    """Slurm SIGKILLs the batch script KillWait after its SIGTERM: sia-launch must not leave
    what it knows (a stopped run's record) until srun has exited, which may be later."""
    # srun's stand-in ignores SIGTERM from its first instruction (an ignored signal is
    # inherited across exec; _Child installs its own handler here after the Popen), and ends
    # only when the callback kills it.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = sia_slurm.job.launch._Child(["sleep", "60"], dict(os.environ))
    threading.Timer(0.3, os.kill, (os.getpid(), signal.SIGTERM)).start()
    seen: list[bool] = []

    def on_terminate() -> None:
        seen.append(child._proc.poll() is None)
        child._proc.kill()

    status = child.wait(on_terminate=on_terminate)
    assert seen == [True] and child.terminated == signal.SIGTERM  # once, srun still running
    assert status == -signal.SIGKILL
