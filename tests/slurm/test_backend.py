"""SlurmBackend against captured 22.05 output (snapshot) and a fake Slurm (apply): phases,
capacity, exact command sequences, overlapping checkpoint waits, and idempotent replays."""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import time
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.cluster import BatchChoice, JobPhase, Move, Rebatch, Start, Stop
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import (
    Assignment,
    JobSpec,
    MetricsReport,
    RunExit,
    StatePaths,
    StopRequest,
    document_json,
    read_document,
    write_document,
)
from sia_slurm.slurm.actuate import actuator
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.commands import SQUEUE_JSON as SQUEUE
from sia_slurm.slurm.runner import CommandResult
from sia_slurm.state.tree import set_up
from sia_slurm_dev.access import Account
from tests.accounts import TestAccounts, run_as

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-22.05"
BATCH = BatchChoice(32, 32, 0)


def make_config(state_dir: Path, timeout_s: float = 30.0) -> Any:
    from sia_slurm.config import parse_config

    return parse_config(
        f"state_dir: {state_dir}\npartitions:\n"
        "  a100: {gpu_type: a100, gpus_per_node: 4}\n"
        "  rtx: {gpu_type: rtx, gpus_per_node: 4}\n"
        "  t4: {gpu_type: t4, gpus_per_node: 4}\n"
        f"restart: {{checkpoint_timeout_s: {timeout_s}}}\n"
    )


class FixtureRunner:
    """Answers the three observation commands with captured output (and records any other
    command, answering it with nothing)."""

    def __init__(self, squeue: str, nodes: str, reservations: str) -> None:
        self.outputs = {"squeue": squeue, "node": nodes, "reservation": reservations}
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], *, check: bool = True) -> CommandResult:
        self.calls.append(list(argv))
        if argv[0] == "squeue":
            return CommandResult(tuple(argv), 0, self.outputs["squeue"], "")
        if argv[:2] == ["scontrol", "-d"]:  # -d -o show node
            return CommandResult(tuple(argv), 0, self.outputs["node"], "")
        if argv[:3] == ["scontrol", "-o", "show"]:
            return CommandResult(tuple(argv), 0, self.outputs[argv[3]], "")
        return CommandResult(tuple(argv), 0, "", "")  # an action: recorded, changes nothing


def report(sia_id: str, time: float, **changes: Any) -> MetricsReport:
    """A report of Slurm job 14's first run (``run-1`` in the captured squeue) by default."""
    values: dict[str, Any] = dict(
        sia_id=sia_id,
        time=time,
        gpu_type="a100",
        nodes=1,
        gpus=2,
        local_bsz=32,
        accum_steps=0,
        step_time=0.2,
        sync_time=0.02,
        grad_sqr=1.0,
        grad_var=2.0,
        slurm_job_id="14",
        slurm_restart_count=0,
    )
    values.update(changes)
    return MetricsReport(**values)


# run-1 as the controller started it: Slurm job 14's first run, on a100-1 with 2 GPUs.
RUN_1 = Assignment("run-1", 3, "a100", "a100", 1, 2, ("a100-1",), 64, 32, 0, slurm_job_id="14")
CAPTURED_IDS = ("pend-1", "run-1", "requeued-1", "done-1", "failed-1")


def captured_backend(paths: StatePaths, user_id: int) -> tuple[SlurmBackend, FixtureRunner]:
    """A backend whose Slurm answers with the captured output, its jobs owned by ``user_id``
    (the fixture's owner was root)."""
    squeue = json.loads((FIXTURES / "squeue-mixed.json").read_text())
    for job in squeue["jobs"]:
        job["user_id"] = user_id
    runner = FixtureRunner(
        json.dumps(squeue),
        (FIXTURES / "show-node-drained.txt").read_text(),
        (FIXTURES / "show-reservation.txt").read_text(),
    )
    return SlurmBackend(make_config(paths.state_dir), runner), runner


@pytest.fixture
def captured(tmp_path: Path) -> tuple[SlurmBackend, FixtureRunner, StatePaths]:
    """The captured squeue with its jobs owned by this process's uid, and their directories
    made as sia-sbatch makes them in a tree as setup makes it."""
    paths = StatePaths(tmp_path / "state")
    set_up(paths.state_dir, os.geteuid(), os.getegid())
    for sia_id in CAPTURED_IDS:
        paths.job_dir(sia_id).mkdir(mode=0o755)
        write_document(paths.spec(sia_id), JobSpec(sia_id=sia_id, app="cifar10"))
    return (*captured_backend(paths, os.geteuid()), paths)


def as_user(account: Account, *argv: str | Path) -> None:
    """Run ``argv`` as ``account`` (a real local user); it must succeed."""
    proc = run_as(account.name, [str(arg) for arg in argv])
    assert proc.returncode == 0, f"{argv} as {account.name}: {proc.stderr.strip()}"


def write_as(account: Account, path: Path, document: Any, mode: str = "644") -> None:
    """``document`` at ``path`` in a file that ``account`` creates itself, so it owns it: the
    text is staged next to the state tree and copied by ``install`` run as that user."""
    staged = path.parent.parent.parent / f"staged-{account.name}-{path.name}"
    write_document(staged, document)
    staged.chmod(0o644)
    as_user(account, "install", "-m", mode, staged, path)
    staged.unlink()


@pytest.fixture
def alices_captured(
    test_accounts: TestAccounts, shared_tmp_path: Path
) -> tuple[SlurmBackend, FixtureRunner, StatePaths]:
    """The captured squeue with its jobs owned by siaalice, a real account, who made their
    directories and wrote their specs herself (as sia-sbatch does, run by her), in a tree that
    other accounts can reach; the controller is this process."""
    alice = test_accounts.alice
    paths = StatePaths(shared_tmp_path / "state")
    set_up(paths.state_dir, os.geteuid(), os.getegid())
    for sia_id in CAPTURED_IDS:
        as_user(alice, "mkdir", "-m", "755", paths.job_dir(sia_id))
        write_as(alice, paths.spec(sia_id), JobSpec(sia_id=sia_id, app="cifar10"))
    assert {paths.spec(i).stat().st_uid for i in CAPTURED_IDS} == {alice.uid}
    return (*captured_backend(paths, alice.uid), paths)


def test_snapshot_of_captured_cluster(captured: Any) -> None:
    backend, runner, paths = captured
    write_document(paths.assignment("run-1"), RUN_1)
    # failed-1's own code failed (its launcher says so): it ends FAILED (--max-failures 0).
    failed = RunExit("failed-1", "17", 0, "failed", 3, message="exit 3")
    write_document(paths.job_dir("failed-1") / "exit-17.0.json", failed)
    snapshot = backend.snapshot()
    # 3 commands a round, and once per process `scontrol show config` (is accounting on?)
    config = ["scontrol", "show", "config"]
    assert [c[0] for c in runner.calls if c != config] == ["scontrol", "scontrol", "squeue"]
    assert runner.calls.count(config) == 1 and snapshot.site is None
    usable = {
        node.name: (node.gpu_type, node.total_gpus, node.usable_gpus) for node in snapshot.nodes
    }
    assert usable == {
        "a100-1": ("a100", 4, 4),  # a managed job runs here as assigned: its GPUs stay usable
        "a100-2": ("a100", 4, 0),  # in an active reservation
        "rtx-1": ("rtx", 4, 1),  # the unmanaged 2-node job holds 3 GPUs on each
        "rtx-2": ("rtx", 4, 1),
        "t4-1": ("t4", 4, 4),
        "t4-2": ("t4", 4, 0),  # drained
    }
    jobs = {job.sia_id: job for job in snapshot.jobs}
    assert sorted(jobs) == ["done-1", "failed-1", "pend-1", "requeued-1", "run-1"]
    assert jobs["pend-1"].phase is JobPhase.PENDING and jobs["pend-1"].slurm_job_id == "13"
    run = jobs["run-1"]
    assert run.phase is JobPhase.STARTING  # its assignment's run, no report from it yet
    assert run.config == Configuration("a100", 1, 2)
    assert run.placement == (NodeShare("a100-1", 2),)
    assert jobs["requeued-1"].phase is JobPhase.PENDING and jobs["requeued-1"].restarts == 1
    assert jobs["done-1"].phase is JobPhase.DONE and jobs["done-1"].finish_time
    assert jobs["failed-1"].phase is JobPhase.FAILED
    # Age and owner are Slurm's (the job's submit_time and user_id), not the spec's.
    assert jobs["pend-1"].spec.submit_time == 1795336149.0
    assert {job.spec.owner_uid for job in jobs.values()} == {os.geteuid()}
    assert snapshot.rejected == ()  # finished jobs without files are old news, not errors
    # Both pending jobs wait under their user's hold only (sbatch --hold, a requeuehold): the
    # next apply puts them under the controller's; run-1 runs as granted.
    assert backend.enforcement.requeue == {}
    assert {k: why for k, (_, why) in backend.enforcement.hold.items()} == {
        "pend-1": "held by its user (JobHeldUser)",
        "requeued-1": "held by its user (JobHeldUser)",
    }
    # Seen for the first time; the records are written by apply, never by a snapshot (status
    # and explain take snapshots and must change nothing).
    assert sorted(backend.enforcement.new_records) == sorted(CAPTURED_IDS)
    assert not any(paths.slurm_record(sia_id).exists() for sia_id in CAPTURED_IDS)


def test_a_run_without_a_grant_counts_as_pending_and_its_gpus_as_taken(captured: Any) -> None:
    backend, _, _ = captured
    snapshot = backend.snapshot()  # run-1 runs, but the controller never assigned it anything
    (run,) = [job for job in snapshot.jobs if job.sia_id == "run-1"]
    assert run.phase is JobPhase.PENDING and run.config is None and run.placement == ()
    assert run.message == (
        "runs on GPUs the controller did not grant (no assignment from the controller); "
        "being requeued"
    )
    assert {n.name: n.usable_gpus for n in snapshot.nodes}["a100-1"] == 2  # 2 of 4 taken
    ((managed, why),) = backend.enforcement.requeue.values()
    assert (managed.sia_id, managed.current.job_id, why) == (
        "run-1",
        "14",
        "no assignment from the controller",
    )


def test_starting_until_the_first_report_of_this_run(captured: Any) -> None:
    backend, _, paths = captured
    write_document(paths.assignment("run-1"), RUN_1)
    snapshot = backend.snapshot()
    run = next(job for job in snapshot.jobs if job.sia_id == "run-1")
    assert run.phase is JobPhase.STARTING and run.batch == BatchChoice(64, 32, 0)
    start = 1795336149.0  # the job's start_time in the fixture
    # A report of an earlier run (Slurm job 11, or job 14 before a requeue), however recent,
    # is the last run's: it neither makes the job RUNNING nor reaches the controller.
    for job_id, restarts in (("11", 0), ("14", 1)):
        write_document(
            paths.metrics("run-1"),
            report("run-1", start + 60, slurm_job_id=job_id, slurm_restart_count=restarts),
        )
        snapshot = backend.snapshot()
        assert next(j for j in snapshot.jobs if j.sia_id == "run-1").phase is JobPhase.STARTING
        assert snapshot.reports == ()
    # One of this run, even with a time before the job's start (clocks differ): RUNNING.
    write_document(paths.metrics("run-1"), report("run-1", start - 30))
    snapshot = backend.snapshot()
    assert next(j for j in snapshot.jobs if j.sia_id == "run-1").phase is JobPhase.RUNNING
    assert [r.time for r in snapshot.reports] == [start - 30]
    again = backend.snapshot()
    assert again.reports == ()  # each report once
    assert next(j for j in again.jobs if j.sia_id == "run-1").phase is JobPhase.RUNNING
    write_document(paths.metrics("run-1"), report("run-1", start + 5))
    assert [r.time for r in backend.snapshot().reports] == [start + 5]


def test_bad_metrics_files_are_rejected_once_and_never_crash(captured: Any) -> None:
    backend, _, paths = captured
    write_document(paths.assignment("run-1"), RUN_1)
    good = report("run-1", 100.0)
    write_document(paths.metrics("run-1"), good)
    payload = json.loads(Path(paths.metrics("run-1")).read_text())
    paths.metrics("pend-1").write_text("{not json")
    paths.metrics("requeued-1").write_text(json.dumps({**payload, "sia_id": "other"}))
    paths.metrics("done-1").write_text(
        json.dumps({**payload, "sia_id": "done-1", "step_time": "fast"})
    )
    paths.metrics("failed-1").write_text(
        json.dumps({**payload, "sia_id": "failed-1", "gpu_type": "h100"})
    )
    (paths.job_dir("run-1") / ".metrics.json.x1.tmp").write_text("partial")  # a writer's temp
    paths.job_dir("ghost").mkdir()  # a directory without a Slurm job: never read
    paths.metrics("ghost").write_text("{not json")
    snapshot = backend.snapshot()
    assert [r.sia_id for r in snapshot.reports] == ["run-1"]
    text = "\n".join(snapshot.rejected)
    assert f"{paths.metrics('pend-1')}: not valid JSON" in text
    assert f"{paths.metrics('requeued-1')}: sia_id: 'other' is not the job's 'requeued-1'" in text
    assert f"{paths.metrics('done-1')}: step_time: expected float, got 'fast'" in text
    assert f"{paths.metrics('failed-1')}: gpu_type: 'h100' is not a configured GPU type" in text
    assert "ghost" not in text
    assert len(snapshot.rejected) == 4
    assert backend.snapshot().rejected == ()  # unchanged files are not reported again
    paths.metrics("pend-1").write_text("x" * 70_000)
    assert backend.snapshot().rejected == (f"{paths.metrics('pend-1')}: larger than 65536 bytes",)
    # A symlink to a valid report elsewhere is not followed, whatever it points to.
    elsewhere = paths.state_dir.parent / "report.json"
    write_document(elsewhere, report("pend-1", 200.0, slurm_job_id="13"))
    paths.metrics("pend-1").unlink()
    paths.metrics("pend-1").symlink_to(elsewhere)
    snapshot = backend.snapshot()
    assert snapshot.reports == ()
    assert snapshot.rejected == (f"{paths.metrics('pend-1')}: is a symbolic link (not followed)",)


def test_files_of_another_user_are_rejected_and_the_spec_cannot_claim_an_owner(
    alices_captured: Any, test_accounts: TestAccounts, shared_tmp_path: Path
) -> None:
    backend, _, paths = alices_captured
    alice, bob = test_accounts.alice, test_accounts.bob
    write_document(paths.assignment("run-1"), RUN_1)
    # The spec's owner and age are the user's to write, so they count for nothing.
    write_as(
        alice,
        paths.spec("run-1"),
        JobSpec(sia_id="run-1", app="cifar10", owner_uid=bob.uid, submit_time=1.0),
    )
    # A report that siabob wrote (his file, left writable by all), hard-linked by siaalice into
    # her job directory: the kernel lets her (protected_hardlinks: she may write it), and the
    # file in her directory is still his.
    stash = shared_tmp_path / "stash"
    stash.mkdir()
    stash.chmod(0o1777)  # sticky, like /tmp: anyone makes files, only their owner removes them
    write_as(bob, stash / "report.json", report("run-1", 100.0), mode="666")
    as_user(alice, "ln", stash / "report.json", paths.metrics("run-1"))
    assert paths.metrics("run-1").stat().st_uid == bob.uid
    snapshot = backend.snapshot()
    assert snapshot.reports == ()
    assert snapshot.rejected == (
        f"{paths.metrics('run-1')}: owned by uid {bob.uid}, but the job's Slurm user is uid "
        f"{alice.uid}",
    )
    (run,) = [job for job in snapshot.jobs if job.sia_id == "run-1"]
    assert (run.spec.owner_uid, run.spec.submit_time) == (alice.uid, 1795336149.0)
    # The same report as her own file is taken: only the owner made the difference.
    as_user(alice, "rm", paths.metrics("run-1"))
    write_as(alice, paths.metrics("run-1"), report("run-1", 100.0))
    snapshot = backend.snapshot()
    assert [(r.sia_id, r.time) for r in snapshot.reports] == [("run-1", 100.0)]
    assert snapshot.rejected == ()
    backend.apply([])  # the records of first sight are written
    # A job directory that another account owns is not the job's: siaalice removes hers (the
    # sticky jobs/ lets only her) and siabob makes one of the same name, with a valid spec.
    as_user(alice, "rm", "-r", paths.job_dir("pend-1"))
    as_user(bob, "mkdir", "-m", "755", paths.job_dir("pend-1"))
    write_as(bob, paths.spec("pend-1"), JobSpec(sia_id="pend-1", app="cifar10"))
    snapshot = backend.snapshot()
    assert "pend-1" not in {job.sia_id for job in snapshot.jobs}
    assert snapshot.rejected == (
        f"job pend-1: not scheduled: {paths.job_dir('pend-1')}: owned by uid {bob.uid}, but the "
        f"job's Slurm user is uid {alice.uid}",
    )


def test_a_job_whose_directory_is_not_its_users_is_never_managed(
    alices_captured: Any, test_accounts: TestAccounts
) -> None:
    """At first sight the job's user is the owner of ``jobs/<sia_id>/``, a real directory,
    who must also own the Slurm job: otherwise the job is not scheduled."""
    backend, _, paths = alices_captured
    alice, bob = test_accounts.alice, test_accounts.bob
    # siaalice swaps her directory for a symlink to it (moved beside it, in the jobs/ every user
    # may write): the directory is hers, the name is not a directory.
    real = paths.jobs_dir / "real-pend-1"
    as_user(alice, "mv", paths.job_dir("pend-1"), real)
    as_user(alice, "ln", "-s", real, paths.job_dir("pend-1"))
    snapshot = backend.snapshot()
    assert "pend-1" not in {job.sia_id for job in snapshot.jobs}
    assert "pend-1" not in backend.enforcement.new_records
    assert snapshot.rejected == (
        f"job pend-1: not scheduled: Slurm job(s) 13 carry it, but {paths.job_dir('pend-1')} "
        "is not a directory of their user",
    )
    assert backend.snapshot().rejected == ()  # said once
    backend.apply([])  # records only the jobs it manages
    assert not paths.slurm_record("pend-1").exists()
    assert paths.slurm_record("run-1").exists()
    # A real directory, made by siabob before the job was first seen: not the job's either.
    as_user(alice, "rm", paths.job_dir("pend-1"))
    as_user(bob, "mkdir", "-m", "755", paths.job_dir("pend-1"))
    write_as(bob, paths.spec("pend-1"), JobSpec(sia_id="pend-1", app="cifar10"))
    assert paths.job_dir("pend-1").stat().st_uid == bob.uid
    fresh = SlurmBackend(backend.config, backend.runner)  # says everything once again
    assert fresh.snapshot().rejected == (
        f"job pend-1: not scheduled: Slurm job(s) 13 carry it, but "
        f"{paths.job_dir('pend-1')} is not a directory of their user",
    )
    assert not paths.slurm_record("pend-1").exists()


def test_bad_spec_is_reported_and_the_job_left_out(captured: Any) -> None:
    backend, _, paths = captured
    paths.spec("pend-1").write_text(json.dumps({"sia_id": "pend-1", "app": 3}))
    snapshot = backend.snapshot()
    assert "pend-1" not in {job.sia_id for job in snapshot.jobs}
    assert "job pend-1: not scheduled:" in snapshot.rejected[0]
    assert "app: expected str, got 3" in snapshot.rejected[0]
    assert backend.snapshot().rejected == ()


# ------------------------------------------------------------------------------------------------
# apply, on the fake Slurm


def backend_for(fake: Any, timeout_s: float = 30.0, **options: Any) -> SlurmBackend:
    config = make_config(fake.paths.state_dir, timeout_s)
    return SlurmBackend(config, fake, fake.clock, **options)


def start(
    sia_id: str, gpu_type: str, nodes: list[str], per_node: int, round_index: int = 1
) -> Start:
    config = Configuration(gpu_type, len(nodes), per_node * len(nodes))
    batch = BatchChoice(32 * config.gpus, 32, 0)
    return Start(sia_id, round_index, config, tuple(NodeShare(n, per_node) for n in nodes), batch)


def move(sia_id: str, gpu_type: str, nodes: list[str], per_node: int, round_index: int) -> Move:
    s = start(sia_id, gpu_type, nodes, per_node, round_index)
    return Move(sia_id, round_index, s.config, s.placement, s.batch)


def test_each_job_is_told_its_start_and_stop_in_the_protocol_its_spec_speaks(
    fake_slurm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After an upgrade to a release of protocol 2 (here: this code as if it spoke 2 and read
    1 and 2), a job submitted before it (spec.json in protocol 1) gets its assignment and stop
    request in protocol 1, which its launcher reads; a job submitted after, in 2
    (docs/protocol.md, "Between releases")."""
    monkeypatch.setattr(document_json, "PROTOCOL_VERSION", 2)
    monkeypatch.setattr(document_json, "OLDEST_PROTOCOL", 1)
    old_id, new_id = fake_slurm.submit("old"), fake_slurm.submit("new")
    spec = read_document(JobSpec, fake_slurm.paths.spec("new"))
    write_document(fake_slurm.paths.spec("new"), dataclasses.replace(spec, version=2))
    backend = backend_for(fake_slurm)
    results = backend.apply([start("old", "t4", ["t4-1"], 1), start("new", "t4", ["t4-2"], 1)])
    assert all(r.ok for r in results), results

    def version(path: Path) -> int:
        return int(json.loads(path.read_text())["version"])

    assert version(fake_slurm.paths.assignment("old")) == 1
    assert version(fake_slurm.paths.assignment("new")) == 2
    fake_slurm.start(old_id, ["t4-1"])
    fake_slurm.start(new_id, ["t4-2"])
    stops: dict[str, int] = {}  # each stop.json as written (the job removes it when it stops)

    def write(path: Path, document: Any) -> None:
        write_document(path, document)
        if path.name == "stop.json":
            stops[path.parent.name] = version(path)

    monkeypatch.setattr(actuator, "write_document", write)
    backend.apply([Stop("old", 2), Stop("new", 2)])
    assert stops == {"old": 1, "new": 2}


def test_start_writes_the_assignment_before_release(fake_slurm: Any) -> None:
    job_id = fake_slurm.submit("a")
    seen: list[Assignment] = []
    fake_slurm.on_release = lambda _: seen.append(
        read_document(Assignment, fake_slurm.paths.assignment("a"))
    )
    (result,) = backend_for(fake_slurm).apply([start("a", "rtx", ["rtx-2"], 2)])
    assert result.ok, result.message
    # sbatch --hold is a hold its user may release: the controller's own hold comes first, so
    # nobody but the controller releases the job it is reshaping.
    assert fake_slurm.calls[1] == ["scontrol", "hold", job_id]
    assert fake_slurm.calls[2:4] == [
        [
            "scontrol",
            "update",
            f"JobId={job_id}",
            "Partition=rtx",
            "TresPerNode=gres:gpu:2",
            "NumNodes=1-1",
            "NumTasks=1",
            "NumCPUs=1",
            "ReqNodeList=rtx-2",
        ],
        ["squeue", "--json", "--all", "--states=all"],  # read back
    ]
    assert fake_slurm.calls[4] == ["scontrol", "release", job_id]
    assert len(fake_slurm.calls) == 5  # never ran: no StartTime update
    (assignment,) = seen
    assert (assignment.partition, assignment.gpus, assignment.node_list) == ("rtx", 2, ("rtx-2",))
    assert (assignment.round_index, assignment.slurm_job_id, assignment.restarts) == (1, job_id, 0)
    assert assignment.slurm_restart_count == 0  # for the job's first run only
    assert fake_slurm.paths.assignment("a").parent == fake_slurm.paths.control("a")


def test_move_checkpoints_requeues_reshapes_and_restarts(fake_slurm: Any) -> None:
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    assert backend.apply([start("a", "t4", ["t4-1"], 1)])[0].ok
    fake_slurm.start(job_id, ["t4-1"])
    fake_slurm.clear_calls()
    fake_slurm.on_release = lambda _: (
        None if not fake_slurm.paths.stop_request("a").exists() else pytest.fail("stop.json left")
    )
    (result,) = backend.apply([move("a", "a100", ["a100-1", "a100-2"], 2, round_index=2)])
    assert result.ok, result.message
    assert result.details["checkpoint"].startswith("acknowledged")
    assert fake_slurm.verbs() == [
        "squeue",
        "scancel",  # --batch --signal=USR1
        "scontrol requeuehold",
        "squeue",  # until PENDING; also the view the start half works from
        "scontrol hold",  # the requeue's hold is its user's: the controller's replaces it
        "scontrol update",
        "squeue",  # read back
        "scontrol show",  # config: cred_expire, asked once
        "scontrol update",  # StartTime, while held: a requeued job waits cred_expire + 1 s
        "scontrol release",
    ]
    assert fake_slurm.calls[1] == ["scancel", "--batch", "--signal=USR1", job_id]
    assert "NumNodes=2-2" in fake_slurm.calls[5] and "NumCPUs=2" in fake_slurm.calls[5]
    # Slurm delayed the requeued job to K + cred_expire + 1 (K: the requeue's second); moved
    # to nodes its killed run did not use (t4-1: the only one that revoked its credential),
    # it may start in K itself, i.e. at once (tests/slurm/test_backend_replays.py: K + 2 on
    # the same node).
    requeued_at = int(fake_slurm.time_of(["scontrol", "requeuehold", job_id]))
    assert fake_slurm.calls[-2][:3] == ["scontrol", "update", f"JobId={job_id}"]
    assert fake_slurm.calls[-1] == ["scontrol", "release", job_id]  # held until its StartTime
    assert fake_slurm.job(job_id)["start_time"] == requeued_at
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert (assignment.nodes, assignment.gpus, assignment.restarts) == (2, 4, 1)
    assert (assignment.slurm_job_id, assignment.slurm_restart_count) == (job_id, 1)
    assert not fake_slurm.paths.stop_request("a").exists()
    # The ack is the user's file: the controller never removes anything under jobs/.
    assert fake_slurm.paths.ack("a", 2, job_id, 0).exists()

    fake_slurm.start(job_id, ["a100-1", "a100-2"])
    fake_slurm.clear_calls()
    (again,) = backend.apply([move("a", "a100", ["a100-1", "a100-2"], 2, round_index=2)])
    assert again.ok and "already moved" in again.message
    assert fake_slurm.verbs() == ["squeue"]  # a replay of a finished move changes nothing


def test_stops_signal_together_and_wait_together(fake_slurm: Any) -> None:
    ids = [fake_slurm.submit(name) for name in ("a", "b", "c")]
    for job_id, node in zip(ids, ["t4-1", "t4-2", "rtx-1"], strict=True):
        fake_slurm.start(job_id, [node])
    fake_slurm.ack_delay_s.update(a=10.0, b=10.0, c=float("inf"))
    backend = backend_for(fake_slurm, timeout_s=30.0)
    before = fake_slurm.clock.now()
    results = backend.apply([Stop("a", 5), Stop("b", 5), Stop("c", 5)])
    assert all(r.ok for r in results), [r.message for r in results]
    assert fake_slurm.calls[1] == ["scancel", "--batch", "--signal=USR1", *ids]
    assert [r.details["checkpoint"].split(" ")[0] for r in results] == [
        "acknowledged",
        "acknowledged",
        "timed",
    ]
    assert "no acknowledgement within 30 s" in results[2].details["checkpoint"]
    waited = fake_slurm.clock.now() - before
    assert 30.0 <= waited < 32.0  # one shared wait, not 10 + 10 + 30
    requeues = [c for c in fake_slurm.calls if c[:2] == ["scontrol", "requeuehold"]]
    assert requeues == [["scontrol", "requeuehold", ",".join(ids)]]
    assert fake_slurm.calls[-1] == ["scontrol", "hold", ",".join(ids)]
    assert all(fake_slurm.job(i)["priority"] == 0 for i in ids)
    # Under the controller's hold, which their users cannot release.
    assert not any(fake_slurm.user_release(i) for i in ids)
    assert not any(fake_slurm.paths.stop_request(s).exists() for s in "abc")


def test_each_job_of_a_round_goes_as_soon_as_it_can(fake_slurm: Any) -> None:
    """A Start does not wait for the round's stops, and a Move is placed when its own job is
    PENDING, not when the slowest requeued job of the round is."""
    slow, fast, new = (fake_slurm.submit(name) for name in ("slow", "fast", "new"))
    fake_slurm.start(slow, ["t4-1"])
    fake_slurm.start(fast, ["t4-2"])
    fake_slurm.ack_delay_s.update(slow=4.0, fast=4.0)
    fake_slurm.completing_s.update(slow=20.0, fast=1.0)
    released: dict[str, float] = {}
    fake_slurm.on_release = lambda job_id: released.setdefault(job_id, fake_slurm.clock.now())
    backend = backend_for(fake_slurm)
    before = fake_slurm.clock.now()
    results = backend.apply(
        [
            move("slow", "rtx", ["rtx-1"], 1, round_index=3),
            move("fast", "rtx", ["rtx-2"], 1, round_index=3),
            start("new", "a100", ["a100-1"], 1, round_index=3),
        ]
    )
    assert all(r.ok for r in results), [r.message for r in results]
    after = {job_id: at - before for job_id, at in released.items()}
    assert after[new] < 1.0  # before the stops' checkpoints (4 s)
    assert 5.0 <= after[fast] < 7.0  # ack 4 s + COMPLETING 1 s, not the slow job's 20 s
    assert after[slow] >= 24.0


def test_waits_ask_slurm_about_the_waited_jobs_alone(fake_slurm: Any) -> None:
    """While acks and COMPLETING jobs are awaited, squeue is asked about those jobs alone
    (a whole squeue of a 10,000-job cluster costs ~0.7 s of CPU, every 0.5 s); the whole
    view only when a job became PENDING and its move goes on. An unrelated job stays out."""
    slow, fast, other = (fake_slurm.submit(name) for name in ("slow", "fast", "other"))
    for job_id, node in ((slow, "t4-1"), (fast, "t4-2"), (other, "rtx-2")):
        fake_slurm.start(job_id, [node])
    fake_slurm.ack_delay_s.update(slow=12.0, fast=4.0)
    fake_slurm.completing_s.update(slow=3.0, fast=3.0)
    backend = backend_for(fake_slurm, timeout_s=30.0)
    fake_slurm.clear_calls()
    results = backend.apply(
        [
            move("slow", "rtx", ["rtx-1"], 1, round_index=3),
            move("fast", "a100", ["a100-1"], 1, round_index=3),
        ]
    )
    assert all(r.ok for r in results), [r.message for r in results]
    queries = [c for c in fake_slurm.calls if c[0] == "squeue"]
    narrow = [c[-1] for c in queries if c[-1].startswith("--jobs=")]
    whole = [c for c in queries if not c[-1].startswith("--jobs=")]
    assert len(narrow) >= 6, queries  # polled while the jobs completed
    assert all(set(q.removeprefix("--jobs=").split(",")) <= {slow, fast} for q in narrow)
    assert len(whole) <= 4, queries  # the round's view, and one per batch that went on


def test_a_job_that_never_leaves_completing_fails_only_its_own_move(fake_slurm: Any) -> None:
    stuck, fine = (fake_slurm.submit(name) for name in ("stuck", "fine"))
    fake_slurm.start(stuck, ["t4-1"])
    fake_slurm.start(fine, ["t4-2"])
    fake_slurm.completing_s.update(stuck=float("inf"))
    results = backend_for(fake_slurm).apply(
        [move("stuck", "rtx", ["rtx-1"], 1, round_index=3), Stop("fine", 3)]
    )
    assert not results[0].ok and "is COMPLETING, not PENDING after requeue" in results[0].message
    assert results[1].ok, results[1].message
    assert fake_slurm.job(stuck)["priority"] == 0  # held, never released


def test_stop_after_a_crash_completes_it(fake_slurm: Any) -> None:
    """Crash after requeuehold: the replayed Stop neither signals nor requeues again."""
    job_id = fake_slurm.submit("a")
    fake_slurm.start(job_id, ["t4-1"])
    backend = backend_for(fake_slurm)
    fake_slurm.run(["scontrol", "requeuehold", job_id])  # what the crashed round did
    fake_slurm.clear_calls()
    (result,) = backend.apply([Stop("a", 7)])
    assert result.ok, result.message
    # Only the hold the crashed round had not issued yet: the requeue's is its user's.
    assert fake_slurm.calls == [list(SQUEUE), ["scontrol", "hold", job_id]]
    assert fake_slurm.job(job_id)["restart_cnt"] == 1
    assert not fake_slurm.user_release(job_id)


def test_start_of_a_job_that_exited_after_its_ack_requeues_it(fake_slurm: Any) -> None:
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    write_document(fake_slurm.paths.stop_request("a"), StopRequest("a", 3))
    fake_slurm.paths.ack("a", 3, job_id, 0).write_text("")
    fake_slurm.job(job_id).update(job_state="COMPLETED", priority=1, state_reason="None")
    (result,) = backend.apply([start("a", "t4", ["t4-2"], 1, round_index=4)])
    assert result.ok, result.message
    # The requeue leaves a hold its user may release: the controller's follows before the
    # reshape, as for any start.
    hold = fake_slurm.calls.index(["scontrol", "hold", job_id])
    requeue = fake_slurm.calls.index(["scontrol", "requeuehold", job_id])
    update = next(i for i, c in enumerate(fake_slurm.calls) if "TresPerNode=gres:gpu:1" in c)
    assert requeue < hold < update
    requeued_at = int(fake_slurm.time_of(["scontrol", "requeuehold", job_id]))
    assert fake_slurm.calls[-2][:3] == ["scontrol", "update", f"JobId={job_id}"]
    assert fake_slurm.calls[-1] == ["scontrol", "release", job_id]
    assert fake_slurm.job(job_id)["start_time"] == requeued_at + 2
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert (assignment.restarts, assignment.slurm_restart_count) == (1, 1)
    assert fake_slurm.paths.ack("a", 3, job_id, 0).exists()  # the user's: left alone


def test_an_update_that_does_not_take_fails_the_action(fake_slurm: Any) -> None:
    fake_slurm.submit("a")
    fake_slurm.ignore_fields.add("Partition")
    (result,) = backend_for(fake_slurm).apply([start("a", "a100", ["a100-1"], 4)])
    assert not result.ok
    assert "exited 0 but did not take: Partition=t4 (wanted a100)" in result.message
    assert not fake_slurm.paths.assignment("a").exists()
    assert not any(c[:2] == ["scontrol", "release"] for c in fake_slurm.calls)


def test_shrink_by_resubmission_keeps_the_sia_id(fake_slurm: Any) -> None:
    old = fake_slurm.submit("a", "a100", 2)
    backend = backend_for(fake_slurm, resubmit_shrinks=True)
    assert backend.apply([start("a", "a100", ["a100-1", "a100-2"], 2)])[0].ok
    fake_slurm.start(old, ["a100-1", "a100-2"])
    (result,) = backend.apply([move("a", "t4", ["t4-1"], 1, round_index=2)])
    assert result.ok, result.message
    new = result.details["slurm_job_id"]
    assert new != old and fake_slurm.job(old)["job_state"] == "CANCELLED"
    sbatch = next(c for c in fake_slurm.calls if c[0] == "sbatch")
    assert "--comment=sia-slurm:a" in sbatch and "--hold" in sbatch and "--nodes=1-1" in sbatch
    # The script is the controller's own copy, in its own tree, readable by nobody else.
    copy = fake_slurm.paths.batch_copy("a")
    assert copy.parent == fake_slurm.paths.control("a")
    assert sbatch[-1] == str(copy)
    assert copy.read_text().startswith("#!")
    assert stat.S_IMODE(copy.stat().st_mode) == 0o600
    record = json.loads(fake_slurm.paths.slurm_record("a").read_text())
    assert record == {
        "slurm_job_id": new,
        "user_id": os.geteuid(),  # Slurm's owner of the first job, kept across resubmissions
        "submit_time": fake_slurm.job(old)["submit_time"],
        "restart_base": 1,
        "superseded": [old],
        "failed_runs": [],
        "slurm_failed_runs": [],
        "time_limit_min": None,  # the job's limit at first sight (none here), for its life
    }
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert (assignment.slurm_job_id, assignment.restarts) == (new, 1)
    assert assignment.slurm_restart_count == 0  # the new job's first run
    # Nothing of the controller's under the user's directory.
    assert sorted(p.name for p in fake_slurm.paths.job_dir("a").iterdir()) == [
        f"ack-2.{old}.0",
        "spec.json",
    ]
    fake_slurm.start(new, ["t4-1"])
    snapshot = backend.snapshot()
    (job,) = [j for j in snapshot.jobs if j.sia_id == "a"]
    assert (job.slurm_job_id, job.restarts, job.phase) == (new, 1, JobPhase.STARTING)
    assert snapshot.rejected == () and backend.enforcement.requeue == {}


def test_orphan_of_an_interrupted_resubmission_is_cancelled(fake_slurm: Any) -> None:
    current = fake_slurm.submit("a")
    orphan = fake_slurm.submit("a")  # sbatch ran, the record was never written
    backend = backend_for(fake_slurm)
    (job,) = backend.snapshot().jobs
    assert job.slurm_job_id == current
    backend.apply([Rebatch("b-unknown", 1, BATCH)])
    assert ["scancel", orphan] in fake_slurm.calls
    assert fake_slurm.job(current)["job_state"] == "PENDING"


def test_rebatch_rewrites_only_the_assignment(fake_slurm: Any) -> None:
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    backend.apply([start("a", "rtx", ["rtx-1"], 2)])
    fake_slurm.start(job_id, ["rtx-1"])
    fake_slurm.clear_calls()
    (result,) = backend.apply([Rebatch("a", 2, BatchChoice(128, 32, 1))])
    assert result.ok and fake_slurm.verbs() == ["squeue"]
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert (assignment.round_index, assignment.batch_size, assignment.accum_steps) == (2, 128, 1)
    assert assignment.node_list == ("rtx-1",)
    stale = backend.apply([Rebatch("a", 1, BatchChoice(64, 32, 0))])[0]
    assert not stale.ok and "superseded by the assignment of round 2" in stale.message
    bad = backend.apply([Rebatch("a", 3, BatchChoice(100, 32, 0))])[0]
    assert not bad.ok and "batch_size" in bad.message
    replay = backend.apply([Rebatch("a", 2, BatchChoice(128, 32, 1))])[0]  # after a crash
    assert replay.ok and replay.message == "batch already set"
    fake_slurm.job(job_id)["job_state"] = "PENDING"
    pending = backend.apply([Rebatch("a", 3, BatchChoice(64, 32, 0))])[0]
    assert not pending.ok and f"Slurm job {job_id} is PENDING" in pending.message


def test_one_bad_action_does_not_stop_the_others(fake_slurm: Any) -> None:
    fake_slurm.submit("a")
    results = backend_for(fake_slurm).apply(
        [
            start("ghost", "t4", ["t4-1"], 1),
            start("a", "t4", ["t4-1", "t4-2"], 1),  # 2 nodes x 1 GPU: fine
            Start("a", 1, Configuration("h100", 1, 1), (NodeShare("h1", 1),), BATCH),
        ]
    )
    assert [r.ok for r in results] == [False, True, False]
    assert "no Slurm job carries this sia id" in results[0].message
    assert "GPU type 'h100' has no configured partition" in results[2].message


def test_released_job_reads_starting_until_slurm_starts_it(fake_slurm: Any) -> None:
    """A job released onto its assignment is not re-decided each round while Slurm starts it,
    but one Slurm has not started within the grace period is pending again."""
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    (result,) = backend.apply([start("a", "rtx", ["rtx-1", "rtx-2"], 2)])
    assert result.ok, result.message
    (job,) = backend.snapshot().jobs
    assert job.phase is JobPhase.STARTING
    assert job.config == Configuration("rtx", 2, 4)
    assert [(s.node, s.gpus) for s in job.placement] == [("rtx-1", 2), ("rtx-2", 2)]
    assert backend.enforcement.hold == {}  # released by the controller for this run
    fake_slurm.clear_calls()
    assert backend.apply([]) == [] and fake_slurm.calls == []
    old = time.time() - 10 * backend.config.round_seconds
    os.utime(fake_slurm.paths.assignment("a"), (old, old))
    (job,) = backend.snapshot().jobs
    assert job.phase is JobPhase.PENDING and job.config is None
    # Not started within the grace: held again, so it can never start later on GPUs the plan
    # has since given to another job.
    assert {k: why for k, (_, why) in backend.enforcement.hold.items()} == {
        "a": "released without a grant"
    }
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "hold", job_id]]
