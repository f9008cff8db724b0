"""Parsers of ``squeue --json`` and ``scontrol show res``: output captured from the real 22.05
daemons (tests/fixtures/slurm-22.05/squeue-mixed.json: an unmanaged 2-node job with 3 GPUs per
node on rtx-[1-2], a held managed job, a running managed job with 2 GPUs on a100-1, a requeued
held one, a completed and a failed one, and older cancelled ones), plus hand-written records in
the shapes newer Slurm releases print (state lists, number objects, ``gres/gpu`` TRES).

The ``*_on_every_release`` tests run on the captures of every release in tests/fixtures/
(22.05, 24.11, 26.05): ``squeue-mixed.json`` holds the jobs named above on each, and the
scenario of ``scripts/capture_slurm_fixtures.py`` (a job in every state the backend meets) is
``squeue-mixed.json`` on 24.11 and 26.05 and ``squeue-scenario.json`` on 22.05."""

from __future__ import annotations

import gc
import json
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.slurm.observe.hostlist import expand_hostlist
from sia_slurm.slurm.observe.jsonparse import (
    SlurmParseError,
    gres_detail_gpus,
    job_state,
    number,
    parse_job,
    parse_reservations,
    parse_squeue_json,
    tres_gpus,
)

FIXTURE_ROOT = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURES = FIXTURE_ROOT / "slurm-22.05"
RELEASES = ("22.05", "24.11", "26.05")
# The capture script's queue; on 22.05 squeue-mixed.json was captured earlier, by hand.
SCENARIO = {"22.05": "squeue-scenario.json"}


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def jobs_by_comment() -> dict[str, Any]:
    result = parse_squeue_json(fixture("squeue-mixed.json"))
    assert result.problems == ()
    return {job.comment or job.job_id: job for job in result.jobs}


def test_real_squeue_jobs() -> None:
    jobs = jobs_by_comment()
    unmanaged = jobs["12"]
    assert unmanaged.state == "RUNNING" and unmanaged.nodes == ("rtx-1", "rtx-2")
    assert unmanaged.gpus_per_node == (3, 3) and unmanaged.requested_gpus_per_node == 3
    assert unmanaged.gpus_on("rtx-2") == 3 and unmanaged.gpus_on("a100-1") == 0
    assert unmanaged.holds_gpus and not unmanaged.finished

    pending = jobs["sia-slurm:pend-1"]
    assert pending.state == "PENDING" and pending.held and pending.nodes == ()
    assert pending.requested_gpus_per_node == 1 and pending.partition == "t4"
    assert not pending.holds_gpus and pending.gpus_on("t4-1") == 0

    running = jobs["sia-slurm:run-1"]
    assert running.nodes == ("a100-1",) and running.gpus_per_node == (2,)
    assert running.restart_count == 0 and running.start_time >= running.submit_time > 0

    requeued = jobs["sia-slurm:requeued-1"]
    assert requeued.held and requeued.restart_count == 1

    assert jobs["sia-slurm:done-1"].state == "COMPLETED" and jobs["sia-slurm:done-1"].finished
    failed = jobs["sia-slurm:failed-1"]
    assert failed.state == "FAILED" and failed.reason == "NonZeroExitCode"
    assert not failed.holds_gpus and failed.gpus_on("t4-1") == 0


def test_real_fixture_from_first_capture() -> None:
    (job,) = parse_squeue_json(fixture("squeue.json")).jobs
    assert (job.job_id, job.partition, job.gpus_per_node) == ("1", "rtx", (2,))
    assert job.working_dir == "/work/main" and job.time_limit_min is None


NEWER_JOB = {
    "job_id": 42,
    "name": "train",
    "job_state": ["RUNNING", "COMPLETING"],
    "state_reason": "None",
    "comment": {"job": "sia-slurm:x1", "administrator": ""},
    "partition": "a100",
    "nodes": "a100-[01-02]",
    "node_count": {"set": True, "infinite": False, "number": 2},
    "tasks": {"set": True, "infinite": False, "number": 2},
    "cpus": {"set": True, "infinite": False, "number": 4},
    "tres_per_node": "gres/gpu:4",
    "tres_alloc_str": "cpu=4,node=2,gres/gpu=8,gres/gpu:a100=8",
    "gres_detail": ["gpu:a100:4(IDX:0-3)", "gpu:a100:4(IDX:0-3)"],
    "restart_cnt": 2,
    "priority": {"set": True, "infinite": False, "number": 100},
    "submit_time": {"set": True, "infinite": False, "number": 100},
    "start_time": {"set": True, "infinite": False, "number": 200},
    "end_time": {"set": True, "infinite": False, "number": 0},
    "time_limit": {"set": False, "infinite": True, "number": 0},
    "user_id": 1000,
    "group_id": 1000,
    "required_nodes": "",
}


def test_newer_version_shapes() -> None:
    job = parse_job(NEWER_JOB)
    assert job.state == "RUNNING" and job.flags == ("COMPLETING",) and job.completing
    assert job.holds_gpus and not job.finished
    assert job.nodes == ("a100-01", "a100-02") and job.node_count == 2
    assert job.gpus_per_node == (4, 4) and job.requested_gpus_per_node == 4
    assert job.comment == "sia-slurm:x1" and job.restart_count == 2 and job.start_time == 200
    assert job.time_limit_min is None and job.cpus_per_task == 2


def test_cpus_per_task_is_slurms_own_where_it_prints_it() -> None:
    """24.11/26.05 after a shrunk running job was requeued: NumTasks 1, NumCPUs 2 (seen live);
    the counts would say 2 CPUs per task, the job asked for 1."""
    shrunk = {**NEWER_JOB, "tasks": {"set": True, "infinite": False, "number": 1}}
    shrunk["cpus"] = {"set": True, "infinite": False, "number": 2}
    assert parse_job(shrunk).cpus_per_task == 2  # no field: from the counts, as on 22.05
    shrunk["cpus_per_task"] = {"set": True, "infinite": False, "number": 1}
    assert parse_job(shrunk).cpus_per_task == 1


def test_held_by_state_flag_and_gpus_from_alloc_tres() -> None:
    raw = {
        **NEWER_JOB,
        "job_state": ["PENDING", "REQUEUE_HOLD"],
        "state_reason": "Priority",
        "priority": {"set": True, "infinite": False, "number": 5},
        "nodes": "",
        "gres_detail": [],
    }
    assert parse_job(raw).held
    running = {**NEWER_JOB, "job_state": "RUNNING", "gres_detail": [], "tres_per_node": ""}
    assert parse_job(running).gpus_on("a100-02") == 4  # 8 allocated over 2 nodes


@pytest.mark.parametrize(
    ("text", "gpus"),
    [
        ("gres:gpu:a100:4", 4),
        ("gres:gpu:2", 2),
        ("gres/gpu:2", 2),
        ("gres/gpu=8,gres/gpu:a100=8", 8),
        ("gres/gpu:a100=2,gres/gpu:t4=1", 3),
        ("cpu=1,node=1,billing=1", 0),
        ("", 0),
    ],
)
def test_tres_gpus(text: str, gpus: int) -> None:
    assert tres_gpus(text) == gpus


def test_gres_detail_and_states() -> None:
    assert gres_detail_gpus(["gpu:rtx:3(IDX:0-2)", "gpu:2(IDX:0-1),shard:0"]) == (3, 2)
    assert job_state("COMPLETING") == ("COMPLETING", ("COMPLETING",))  # 22.05's completing
    # A job allocated a powered-down node while it boots (seen on the dev cluster's power
    # saving): 22.05 prints CONFIGURING alone, 24.11 and 26.05 RUNNING with flags.
    assert job_state("CONFIGURING") == ("RUNNING", ("CONFIGURING",))
    booting = ["RUNNING", "CONFIGURING", "POWER_UP_NODE"]
    assert job_state(booting) == ("RUNNING", ("CONFIGURING", "POWER_UP_NODE"))
    assert job_state(["PENDING", "REQUEUE_HOLD"]) == ("PENDING", ("REQUEUE_HOLD",))
    assert number({"set": False, "infinite": False, "number": 0}) is None
    assert number(7) == 7
    with pytest.raises(SlurmParseError, match="job_state"):
        job_state(["WEIRD"])
    with pytest.raises(SlurmParseError, match="expected a number"):
        number("7")


def test_one_bad_job_is_skipped_and_named() -> None:
    payload = json.loads(fixture("squeue.json"))
    payload["jobs"].append({**payload["jobs"][0], "job_id": 99, "job_state": 5})
    result = parse_squeue_json(json.dumps(payload))
    assert [job.job_id for job in result.jobs] == ["1"]
    assert result.problems == (
        "squeue job 99: skipped: job_state: expected a string or list of strings, got 5",
    )


def test_unusable_output_raises_with_the_text() -> None:
    with pytest.raises(SlurmParseError, match="not JSON"):
        parse_squeue_json("squeue: error: Invalid user")
    with pytest.raises(SlurmParseError, match="reported errors"):
        parse_squeue_json(json.dumps({"jobs": [], "errors": [{"error": "boom"}]}))


def test_reservations_from_real_output() -> None:
    (reservation,) = parse_reservations(fixture("show-reservation.txt"))
    assert reservation.name == "maint" and reservation.active
    assert reservation.nodes == ("a100-2",)
    assert parse_reservations(fixture("show-reservation-none.txt")) == ()


@pytest.mark.parametrize(
    ("text", "hosts"),
    [
        ("a100-[1-2]", ("a100-1", "a100-2")),
        ("a100-[1-2,4],rtx-1", ("a100-1", "a100-2", "a100-4", "rtx-1")),
        ("n[08-10]", ("n08", "n09", "n10")),
        ("gpu[1-2]-ib", ("gpu1-ib", "gpu2-ib")),
        ("", ()),
        ("(null)", ()),
    ],
)
def test_hostlists(text: str, hosts: tuple[str, ...]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["a[1-", "a[3-1]", "a[x]", "a[1]b[2]"])
def test_bad_hostlists_quote_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="host"):
        expand_hostlist(text)


# ------------------------------------------------------------------------------------------------
# Every release's captures


def release_fixture(release: str, name: str) -> str:
    return (FIXTURE_ROOT / f"slurm-{release}" / name).read_text()


def test_every_release_directory_is_tested() -> None:
    on_disk = sorted(p.name.removeprefix("slurm-") for p in FIXTURE_ROOT.glob("slurm-*"))
    assert on_disk == list(RELEASES)


@pytest.mark.parametrize("release", RELEASES)
def test_mixed_queue_on_every_release(release: str) -> None:
    result = parse_squeue_json(release_fixture(release, "squeue-mixed.json"))
    assert result.problems == ()
    jobs = {job.comment: job for job in result.jobs if job.comment}

    pending = jobs["sia-slurm:pend-1"]
    assert (pending.state, pending.held, pending.reason) == ("PENDING", True, "JobHeldUser")
    assert pending.nodes == () and pending.requested_gpus_per_node == 1
    assert pending.partition == "t4" and pending.gpus_on("t4-1") == 0

    running = jobs["sia-slurm:run-1"]
    assert (running.state, running.nodes, running.gpus_per_node) == ("RUNNING", ("a100-1",), (2,))
    assert running.requested_gpus_per_node == 2 and running.gpus_on("a100-1") == 2
    assert running.restart_count == 0 and running.start_time >= running.submit_time > 1.7e9
    assert (running.user_id, running.group_id) == (0, 0)

    requeued = jobs["sia-slurm:requeued-1"]
    assert requeued.held and requeued.restart_count == 1 and requeued.reason == "JobHeldUser"
    assert jobs["sia-slurm:done-1"].state == "COMPLETED" and jobs["sia-slurm:done-1"].finished
    failed = jobs["sia-slurm:failed-1"]
    assert (failed.state, failed.reason, failed.holds_gpus) == ("FAILED", "NonZeroExitCode", False)

    (wide,) = [job for job in result.jobs if job.state == "RUNNING" and job.node_count == 2]
    assert wide.nodes == ("rtx-1", "rtx-2") and wide.gpus_per_node == (3, 3)
    assert wide.requested_gpus_per_node == 3 and wide.gpus_on("rtx-2") == 3


# comment (or job name) -> state, flags, held, reason, nodes, GPUs per allocated node, GPUs asked
# per node, required nodes, restarts: alike on every release, save what COMPLETING_STATE says.
EVERY_STATE = {
    "sia-slurm:done-1": ("COMPLETED", (), False, "None", ("t4-1",), (), 1, (), 0),
    "sia-slurm:failed-1": ("FAILED", (), False, "NonZeroExitCode", ("t4-1",), (), 1, (), 0),
    # requeuehold of a job that had COMPLETED: pending again, held, one restart
    "sia-slurm:requeued-done-1": ("PENDING", (), True, "JobHeldUser", (), (), 1, (), 1),
    "sia-slurm:run-1": ("RUNNING", (), False, "None", ("a100-1",), (2,), 2, ("a100-1",), 0),
    # -N 2 --gpus-per-node=rtx:3 (typed): gres_detail per node
    "multi": ("RUNNING", (), False, "None", ("rtx-1", "rtx-2"), (3, 3), 3, (), 0),
    "sia-slurm:pend-1": ("PENDING", (), True, "JobHeldUser", (), (), 1, (), 0),  # sbatch --hold
    "sia-slurm:admin-1": ("PENDING", (), True, "JobHeldAdmin", (), (), 1, (), 0),  # scontrol hold
    "sia-slurm:x1": ("PENDING", (), True, "JobHeldUser", (), (), 1, (), 0),
    # sbatch --hold, then scontrol release: pending, not held, waiting for 2 whole a100 nodes
    "sia-slurm:released-1": ("PENDING", (), False, "Resources", (), (), 4, (), 0),
    # requeuehold of a running job (-w t4-1)
    "sia-slurm:requeued-1": ("PENDING", (), True, "JobHeldUser", (), (), 1, ("t4-1",), 1),
    "sia-slurm:cancelled-1": ("CANCELLED", (), False, "None", ("t4-1",), (), 1, ("t4-1",), 0),
    # --exclusive with --gpus-per-node=1: Slurm allocates all 4 GPUs of the node
    "alloc": ("RUNNING", (), False, "None", ("t4-1",), (4,), 1, ("t4-1",), 0),
    # plain requeue of a running job: pending until the requeue delay (cred_expire) has passed
    "sia-slurm:requeue-1": ("PENDING", (), False, "BeginTime", (), (), 1, ("rtx-1",), 1),
}
# scancel of a job that ignores SIGTERM, seen within KillWait: 22.05 prints the state COMPLETING
# alone; 24.11 and 26.05 print ["CANCELLED", "COMPLETING"].
COMPLETING_STATE = {"22.05": "COMPLETING", "24.11": "CANCELLED", "26.05": "CANCELLED"}
# 26.05: a job without a time limit that the backfill scheduler started shows 525600 minutes
# (365 days: backfill.c sets YEAR_MINUTES into the job; scontrol: TimeLimit=365-00:00:00).
BACKFILL_LIMIT = {"26.05": 525600}


@pytest.mark.parametrize("release", RELEASES)
def test_every_state_on_every_release(release: str) -> None:
    text = release_fixture(release, SCENARIO.get(release, "squeue-mixed.json"))
    result = parse_squeue_json(text)
    assert result.problems == ()
    jobs = {job.comment or job.name: job for job in result.jobs}
    for label, expected in EVERY_STATE.items():
        job = jobs[label]
        seen = (
            job.state,
            job.flags,
            job.held,
            job.reason,
            job.nodes,
            job.gpus_per_node,
            job.requested_gpus_per_node,
            job.required_nodes,
            job.restart_count,
        )
        assert seen == expected, label
        assert (job.user_id, job.group_id) == (0, 0) and job.submit_time > 1.7e9, label
        assert job.time_limit_min in (None, BACKFILL_LIMIT.get(release)), label
    assert jobs["sia-slurm:released-1"].node_count == 2
    assert jobs["sia-slurm:run-1"].start_time >= jobs["sia-slurm:run-1"].submit_time

    completing = jobs["sia-slurm:completing-1"]
    assert (completing.state, completing.flags) == (COMPLETING_STATE[release], ("COMPLETING",))
    assert completing.completing and completing.holds_gpus and not completing.finished
    assert completing.gpus_per_node == ()  # gres_detail is empty while completing
    assert completing.gpus_on("rtx-2") == 1  # so the GPUs asked for count as held


@pytest.mark.parametrize("release", RELEASES)
def test_reservations_on_every_release(release: str) -> None:
    (reservation,) = parse_reservations(release_fixture(release, "show-reservation.txt"))
    assert (reservation.name, reservation.active, reservation.nodes) == ("maint", True, ("a100-2",))
    assert parse_reservations(release_fixture(release, "show-reservation-none.txt")) == ()


def test_the_garbage_collector_is_left_as_it_was_even_when_parsing_fails():
    assert gc.isenabled()
    parse_squeue_json('{"jobs": []}')
    assert gc.isenabled()
    with pytest.raises(SlurmParseError):
        parse_squeue_json("not json")
    assert gc.isenabled()
    gc.disable()
    try:
        parse_squeue_json('{"jobs": []}')
        assert not gc.isenabled()  # a caller that had paused it keeps it paused
    finally:
        gc.enable()
