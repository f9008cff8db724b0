"""The state database: schema, WAL, histories, the journal and the action codec."""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from pathlib import Path

import pytest

from sia_slurm import __version__
from sia_slurm.cluster import (
    BatchChoice,
    ClusterSnapshot,
    JobPhase,
    JobSnapshot,
    Move,
    Rebatch,
    Start,
    Stop,
)
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare, NodeView
from sia_slurm.protocol import JobSpec
from sia_slurm.state import (
    DONE,
    FAILED,
    PENDING,
    SCHEMA_VERSION,
    SKIPPED,
    CodecError,
    Journal,
    Store,
    StoreError,
)
from sia_slurm.state.codec import action_from_row, action_kind, action_payload

NODES = (NodeView("a100-1", "a100", 4, 4), NodeView("t4-1", "t4", 4, 3))
CONFIG = Configuration("a100", 1, 2)
SHARES = (NodeShare("a100-1", 2),)
BATCH = BatchChoice(256, 128, 0)
ACTIONS = (
    Start("j1", 3, CONFIG, SHARES, BATCH),
    Move("j1", 3, Configuration("a100", 2, 8), (NodeShare("a", 4), NodeShare("b", 4)), BATCH),
    Stop("j2", 3),
    Rebatch("j3", 3, BatchChoice(512, 128, 1)),
)


def test_new_database_is_wal_versioned_and_private(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "sia.db"
    with Store.open(path) as store:
        assert store.schema_version == SCHEMA_VERSION
        assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        tables = {
            r[0] for r in store.conn.execute("SELECT name FROM sqlite_master WHERE type='table'")
        }
        assert {"jobs", "rounds", "decisions", "actions", "reports", "controller", "meta"} <= tables
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with Store.open(path) as again:  # reopening migrates nothing and keeps the version
        assert again.schema_version == SCHEMA_VERSION


def test_newer_schema_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "sia.db"
    with sqlite3.connect(path) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError) as refused:
        Store.open(path)
    assert str(refused.value) == (
        f"{path}: schema version {SCHEMA_VERSION + 1} is newer than this sia-slurm "
        f"({__version__}) knows ({SCHEMA_VERSION}): a newer release wrote it. Run that release, "
        "or restore the copy of the database taken before the upgrade (docs/operations.md, "
        "Upgrading)"
    )
    with sqlite3.connect(path) as conn:  # refused untouched: not even switched to WAL
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION + 1
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    assert not path.with_name("sia.db-wal").exists()


_THROUGHPUT = "    throughput REAL NOT NULL DEFAULT 0,\n"
_OWNER = (
    "    last_report_time REAL,\n"
    "    user TEXT NOT NULL DEFAULT '',\n"
    "    account TEXT NOT NULL DEFAULT ''\n"
)


def _old_database(path: Path, version: int) -> None:
    """A database as sia-slurm wrote it at schema ``version`` (1: decisions without
    ``throughput``; 2: jobs without ``user`` and ``account``)."""
    from sia_slurm.state.schema import SCHEMA

    assert _THROUGHPUT in SCHEMA and _OWNER in SCHEMA
    schema = SCHEMA.replace(_OWNER, "    last_report_time REAL\n")
    if version == 1:
        schema = schema.replace(_THROUGHPUT, "")
    with sqlite3.connect(path) as conn:
        conn.executescript(schema)
        conn.execute(f"PRAGMA user_version={version}")


def _columns(store: Store, table: str) -> list[tuple[object, ...]]:
    return [tuple(c) for c in store.conn.execute(f"PRAGMA table_info({table})").fetchall()]


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_schema_is_upgraded_in_place_to_a_new_ones_tables(
    tmp_path: Path, version: int
) -> None:
    """Schema 1 (decisions without ``throughput``, issue 34) and 2 (jobs without the user and
    account, issue 36) are upgraded in place: what was kept stays, the new columns read their
    defaults ("not kept"), and every table has a new database's columns, so rows recorded from
    now on insert as into a new database."""
    old = tmp_path / "old.db"
    _old_database(old, version)
    with sqlite3.connect(old) as conn:
        values = "(3, 'j1', 'running', 'keep', 'a100:1x2', 'a100:1x2', 256, 128, 0, 1234.5, ''"
        conn.execute(f"INSERT INTO decisions VALUES {values}{', 99.0' if version > 1 else ''})")
        conn.execute(
            "INSERT INTO jobs (sia_id, spec, phase, phase_history, slurm_job_ids) "
            "VALUES ('j1', '{}', 'running', '[]', '[]')"
        )
    with Store.open(old, create=False) as store:
        assert store.schema_version == SCHEMA_VERSION == 4
        decision = store.decisions(3)["j1"]
        assert (decision.after, decision.local_bsz, decision.goodput) == ("a100:1x2", 128, 1234.5)
        assert decision.throughput == (0.0 if version == 1 else 99.0)
        (job,) = store.jobs(["j1"])
        assert (job.phase, job.user, job.account) == ("running", "", "")
        migrated = {table: _columns(store, table) for table in ("jobs", "decisions")}
    with Store.open(tmp_path / "new.db") as fresh:
        created = {table: _columns(fresh, table) for table in ("jobs", "decisions")}
    assert migrated == created


def test_missing_database_without_create(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no state database"):
        Store.open(tmp_path / "sia.db", create=False)
    assert not (tmp_path / "sia.db").exists()


def test_failed_transaction_rolls_back(store: Store) -> None:
    with pytest.raises(RuntimeError), store.transaction():
        Journal(store).add(ACTIONS, 1.0)
        raise RuntimeError("crash inside the commit")
    assert Journal(store).entries() == []


def snapshot(time: float, *jobs: JobSnapshot) -> ClusterSnapshot:
    return ClusterSnapshot(time, NODES, jobs)


def test_job_histories_only_grow(store: Store) -> None:
    spec = JobSpec("j1", "cifar10", submit_time=5.0)
    states = [
        (10.0, JobSnapshot(spec, JobPhase.PENDING, slurm_job_id="100")),
        (20.0, JobSnapshot(spec, JobPhase.PENDING, slurm_job_id="100")),
        (30.0, JobSnapshot(spec, JobPhase.STARTING, CONFIG, SHARES, BATCH, slurm_job_id="100")),
        (40.0, JobSnapshot(spec, JobPhase.RUNNING, CONFIG, SHARES, BATCH, slurm_job_id="100")),
        (50.0, JobSnapshot(spec, JobPhase.PENDING, restarts=1, slurm_job_id="101")),
        (60.0, JobSnapshot(spec, JobPhase.DONE, restarts=1, finish_time=58.0, slurm_job_id="101")),
    ]
    for time, job in states:
        with store.transaction():
            store.record_jobs(snapshot(time, job))
        if time == 40.0:
            row = store.job("j1")
            assert row is not None and row.config == {"gpu_type": "a100", "nodes": 1, "gpus": 2}
            assert row.placement == [["a100-1", 2]] and row.batch == {
                "batch_size": 256,
                "local_bsz": 128,
                "accum_steps": 0,
            }
    row = store.job("j1")
    assert row is not None
    assert row.phase_history == [
        [10.0, "pending"],
        [30.0, "starting"],
        [40.0, "running"],
        [50.0, "pending"],
        [60.0, "done"],
    ]
    assert row.slurm_job_ids == ["100", "101"]
    assert (row.first_start, row.finish_time, row.restarts) == (30.0, 58.0, 1)
    assert row.config is None and row.spec["app"] == "cifar10" and row.submit_time == 5.0
    assert store.last_nodes() == NODES


def test_job_missing_from_the_snapshot_is_gone(store: Store) -> None:
    running = JobSnapshot(JobSpec("j1", "cifar10"), JobPhase.RUNNING, CONFIG, SHARES, BATCH)
    finished = JobSnapshot(JobSpec("j2", "cifar10"), JobPhase.DONE, finish_time=3.0)
    with store.transaction():
        store.record_jobs(snapshot(1.0, running, finished))
    with store.transaction():
        store.record_jobs(snapshot(2.0))
    j1, j2 = store.jobs()
    assert (j1.phase, j1.phase_history[-1], j1.config) == ("gone", [2.0, "gone"], None)
    assert j2.phase == "done"


def test_journal_lifecycle_and_counts(store: Store) -> None:
    journal = Journal(store)
    with store.transaction():
        ids = journal.add(ACTIONS, 100.0)
        journal.add(ACTIONS[:1], 100.0, state=SKIPPED)
    pending = journal.pending()
    assert [e.id for e in pending] == ids and [e.action for e in pending] == list(ACTIONS)
    with store.transaction():
        journal.mark(ids[0], True, "released", 101.0)
        journal.mark(ids[1], False, "scontrol: exit 1", 101.0)
    assert [e.state for e in journal.entries()] == [DONE, FAILED, PENDING, PENDING, SKIPPED]
    first = journal.entries()[0]
    assert (first.message, first.attempts, first.finished) == ("released", 1, 101.0)
    assert journal.counts() == {
        ("start", DONE): 1, ("move", FAILED): 1, ("stop", PENDING): 1,
        ("rebatch", PENDING): 1, ("start", SKIPPED): 1,
    }  # fmt: skip
    with pytest.raises(ValueError, match="state"):
        journal.add(ACTIONS, 1.0, state=DONE)


def test_damaged_journal_entry_is_reported_not_guessed(store: Store) -> None:
    journal = Journal(store)
    with store.transaction():
        (entry_id,) = journal.add(ACTIONS[:1], 1.0)
        store.conn.execute(
            "UPDATE actions SET payload = ? WHERE id = ?", ('{"config": 3}', entry_id)
        )
    (entry,) = journal.pending()
    assert entry.action is None
    assert f"actions.id={entry_id}: config: expected a configuration object" in entry.error


@pytest.mark.parametrize("action", ACTIONS, ids=lambda a: type(a).__name__)
def test_action_codec_round_trip(action: object) -> None:
    payload = json.loads(json.dumps(action_payload(action)))  # type: ignore[arg-type]
    kind = action_kind(action)  # type: ignore[arg-type]
    assert action_from_row(kind, action.sia_id, action.round_index, payload, "x") == action  # type: ignore[attr-defined]


def test_action_codec_names_the_bad_field() -> None:
    payload = action_payload(ACTIONS[0])
    payload["batch"]["local_bsz"] = "128"
    with pytest.raises(CodecError, match=r"row: batch: local_bsz: expected an integer, got '128'"):
        action_from_row("start", "j1", 3, payload, "row")
    with pytest.raises(CodecError, match="kind: expected one of start, move, stop, rebatch"):
        action_from_row("resize", "j1", 3, {}, "row")
    with pytest.raises(CodecError, match=r"placement: expected \[node, gpus\]"):
        action_from_row("move", "j1", 3, {**payload, "placement": [["n"]]}, "row")
