"""The pure rules of which Slurm job is managed and how: a run as granted (``unauthorized``),
the phase from Slurm and the files (``job_phase``), the record at first sight, and the metrics
inbox that takes a report only from the job's current run."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.cluster import JobPhase
from sia_slurm.protocol import Assignment, MetricsReport, ProtocolError, write_document
from sia_slurm.slurm.observe.jobfiles import MetricsInbox, RunId, SlurmRecord
from sia_slurm.slurm.observe.jsonparse import SlurmJob, parse_job
from sia_slurm.slurm.observe.managed import (
    first_record,
    foreign_jobs,
    job_phase,
    resolve,
    unauthorized,
)
from sia_slurm.userfiles import JobDirectory

PARTITION_TYPES = {"a100": "a100", "rtx": "rtx", "t4": "t4", "old": "t4"}


def slurm_job(**fields: Any) -> SlurmJob:
    """Slurm job 7's second run (restart count 1), running on rtx-1 and rtx-2 with 2 GPUs each,
    as squeue --json says it."""
    raw: dict[str, Any] = {
        "job_id": 7,
        "job_state": "RUNNING",
        "state_reason": "None",
        "priority": 1,
        "comment": "sia-slurm:a",
        "partition": "rtx",
        "nodes": "rtx-[1-2]",
        "node_count": 2,
        "tasks": 2,
        "cpus": 2,
        "tres_per_node": "gres:gpu:2",
        "gres_detail": ["gpu:rtx:2(IDX:0-1)", "gpu:rtx:2(IDX:0-1)"],
        "restart_cnt": 1,
        "submit_time": 100,
        "start_time": 200,
        "user_id": 1000,
        "group_id": 1000,
    }
    raw.update(fields)
    return parse_job(raw)


GRANT = Assignment(
    "a", 4, "rtx", "rtx", 2, 4, ("rtx-1", "rtx-2"), 128, 32, 0,
    slurm_job_id="7", slurm_restart_count=1,
)  # fmt: skip


def test_a_run_as_granted_is_authorized() -> None:
    assert unauthorized(slurm_job(), GRANT, PARTITION_TYPES) is None
    assert unauthorized(slurm_job(nodes="rtx-[1-2]"), replace(GRANT, node_list=()), {}) is None


@pytest.mark.parametrize(
    ("fields", "grant", "reason"),
    [
        ({}, None, "no assignment from the controller"),
        (
            {"restart_cnt": 2},
            GRANT,
            "its assignment (round 4) is for Slurm job 7 run 1, this is job 7 run 2",
        ),
        (
            {"job_id": 8},
            GRANT,
            "its assignment (round 4) is for Slurm job 7 run 1, this is job 8 run 1",
        ),
        (
            {"partition": "a100", "gres_detail": ["gpu:a100:2(IDX:0-1)"] * 2},
            GRANT,
            "partition a100 (assigned rtx); GPU type a100 (assigned rtx)",
        ),
        (
            {"nodes": "rtx-1", "node_count": 1, "gres_detail": ["gpu:rtx:2(IDX:0-1)"]},
            GRANT,
            "1 node(s) (assigned 2)",
        ),
        ({"nodes": "rtx-[2-3]"}, GRANT, "nodes rtx-2,rtx-3 (assigned rtx-1,rtx-2)"),
        (
            {"gres_detail": ["gpu:rtx:4(IDX:0-3)", "gpu:rtx:2(IDX:0-1)"]},
            GRANT,
            "GPUs per node [4, 2] (assigned 2)",
        ),
        (
            {"partition": "old"},  # a partition of another GPU type than the one granted
            replace(GRANT, partition="old"),
            "GPU type t4 (assigned rtx)",
        ),
    ],
    ids=[
        "no-grant",
        "another-run",
        "another-job",
        "partition",
        "node-count",
        "nodes",
        "gpus",
        "gpu-type",
    ],
)
def test_each_difference_from_the_grant_is_named(
    fields: dict[str, Any], grant: Assignment | None, reason: str
) -> None:
    assert unauthorized(slurm_job(**fields), grant, PARTITION_TYPES) == reason


@pytest.mark.parametrize("state", ["PENDING", "COMPLETING", "COMPLETED", "FAILED"])
def test_only_running_jobs_are_judged(state: str) -> None:
    job = slurm_job(job_state=state, restart_cnt=5)
    assert unauthorized(job, None, PARTITION_TYPES) is None


def test_running_is_a_report_from_this_run() -> None:
    running = slurm_job()
    flags = dict(has_assignment=True, stop_requested=False, acked=False)
    assert job_phase(running, reported=False, **flags)[0] is JobPhase.STARTING
    assert job_phase(running, reported=True, **flags) == (JobPhase.RUNNING, "running")
    pending = slurm_job(job_state="PENDING", state_reason="JobHeldAdmin", priority=0)
    assert job_phase(pending, reported=True, **flags) == (
        JobPhase.PENDING,
        "pending (held, reason JobHeldAdmin)",
    )


def test_the_record_of_first_sight_is_the_directory_owners_oldest_job() -> None:
    copycat = slurm_job(job_id=5, user_id=2000, submit_time=50)
    ended = slurm_job(job_id=6, job_state="CANCELLED", submit_time=60)
    live = slurm_job(job_id=7, submit_time=70)
    group = [copycat, ended, live]
    assert first_record(group, None) is None  # no directory: nobody's
    assert first_record(group, 3000) is None  # a directory of someone without a job here
    assert first_record(group, 1000) == SlurmRecord("7", 1000, 70.0)  # oldest live one
    assert first_record([ended], 1000) == SlurmRecord("6", 1000, 60.0)
    record = SlurmRecord("7", 1000, 70.0)
    assert foreign_jobs(group, record) == [copycat]
    managed = resolve("a", group, record)
    assert managed is not None and managed.current is live and managed.strays == ()
    assert managed.user_id == 1000 and managed.run == RunId("7", 1)


# ------------------------------------------------------------------------------------------------
# The metrics inbox


def metrics(time: float, run: RunId) -> MetricsReport:
    return MetricsReport(
        "a", time, "rtx", 1, 2, 32, 0, 0.2, 0.02, 1.0, 2.0,
        slurm_job_id=run.slurm_job_id, slurm_restart_count=run.restart_count,
    )  # fmt: skip


@pytest.fixture
def job_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "jobs" / "a"
    directory.mkdir(parents=True)
    return directory


def read(
    inbox: MetricsInbox, job_dir: Path, run: RunId, nodes: tuple[str, ...] = ()
) -> tuple[Any, bool, list[str]]:
    rejected: list[str] = []
    with JobDirectory(job_dir.parent, "a", os.geteuid()) as directory:
        report, reported = inbox.read("a", directory, run, rejected, nodes)
    return report, reported, rejected


def test_the_inbox_takes_a_report_of_the_current_run_once(job_dir: Path) -> None:
    inbox = MetricsInbox(("rtx", "t4"))
    first, second = RunId("7", 0), RunId("7", 1)
    assert read(inbox, job_dir, first) == (None, False, [])  # no file yet
    write_document(job_dir / "metrics.json", metrics(500.0, first))
    report, reported, _ = read(inbox, job_dir, first)
    assert report is not None and report.time == 500.0 and reported
    assert read(inbox, job_dir, first) == (None, True, [])  # taken already; still reported
    # Requeued: the file is still the last run's, however new it is.
    assert read(inbox, job_dir, second) == (None, False, [])
    write_document(job_dir / "metrics.json", metrics(900.0, first))
    assert read(inbox, job_dir, second) == (None, False, [])
    assert read(inbox, job_dir, RunId("8", 1)) == (None, False, [])  # another job's run
    # The new run's first report, from a node whose clock is behind the last run's: it is
    # this run's first, so it counts (times are compared within one run only).
    write_document(job_dir / "metrics.json", metrics(450.0, second))
    report, reported, _ = read(inbox, job_dir, second)
    assert report is not None and report.slurm_restart_count == 1 and reported
    assert read(inbox, job_dir, second) == (None, True, [])
    write_document(job_dir / "metrics.json", metrics(440.0, second))  # rewritten, not newer
    assert read(inbox, job_dir, second) == (None, True, [])
    write_document(job_dir / "metrics.json", metrics(480.0, second))
    assert read(inbox, job_dir, second)[0] == metrics(480.0, second)


def test_a_report_of_this_runs_identity_from_other_nodes_is_not_this_runs(
    job_dir: Path,
) -> None:
    """slurmctld, restarted from state saved before a launch, launched the same identity a
    second time elsewhere: the run on the first nodes, until Slurm kills it, is not this run."""
    inbox = MetricsInbox(("rtx", "t4"))
    run, here = RunId("57", 3), ("a100-1", "a100-2")
    elsewhere = replace(metrics(500.0, run), nodes=2, gpus=2, node_list=("rtx-1", "rtx-2"))
    write_document(job_dir / "metrics.json", elsewhere)
    assert read(inbox, job_dir, run, here) == (None, False, [])
    assert read(inbox, job_dir, run)[0] == elsewhere  # nodes unknown: the identity decides
    mine = replace(elsewhere, time=510.0, node_list=("a100-2", "a100-1"))
    write_document(job_dir / "metrics.json", mine)
    assert read(inbox, job_dir, run, here)[0] == mine


def test_the_inbox_says_a_bad_file_once_per_version(job_dir: Path) -> None:
    inbox = MetricsInbox(("rtx",))
    run = RunId("7", 0)
    write_document(job_dir / "metrics.json", replace(metrics(500.0, run), nodes=2, gpus=3))
    report, reported, rejected = read(inbox, job_dir, run)
    assert (report, reported) == (None, False)
    where = job_dir / "metrics.json"
    assert rejected == [f"{where}: gpus: 3 GPUs do not split evenly over 2 nodes"]
    assert read(inbox, job_dir, run) == (None, False, [])
    inbox.keep_only([])  # the job is gone: forgotten, so a new job of the id starts afresh
    assert read(inbox, job_dir, run)[2] == rejected


def test_records_are_validated(tmp_path: Path) -> None:
    path = tmp_path / "slurm.json"
    SlurmRecord("7", 1000, 70.0, 2, ("5", "6")).write(path)
    assert SlurmRecord.read(path) == SlurmRecord("7", 1000, 70.0, 2, ("5", "6"))
    assert SlurmRecord.read(tmp_path / "none.json") is None
    path.write_text('{"slurm_job_id": "7", "submit_time": 1}')
    with pytest.raises(ProtocolError, match="bad controller record: KeyError\\('user_id'\\)"):
        SlurmRecord.read(path)
    path.write_text('{"slurm_job_id": "7", "user_id": -1, "submit_time": 1}')
    with pytest.raises(ProtocolError, match="user_id: expected integers >= 0"):
        SlurmRecord.read(path)
