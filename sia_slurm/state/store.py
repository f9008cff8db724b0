"""The controller's SQLite database (``<state_dir>/sia.db``): one file that survives restarts.

Why SQLite: the controller may run as a cron ``--once`` job, a new process every round, so every
piece of its memory and every action it issues must outlive the process; SQLite gives atomic
multi-table commits (one per round stage) without a server. The database runs in WAL mode with
``synchronous=FULL``: a commit that returned is on disk, which the action journal relies on
(an action is committed *before* it is issued).

Tables (schema version :data:`SCHEMA_VERSION`, kept in ``PRAGMA user_version``):

* ``jobs`` — per sia job: spec, phase and its history, Slurm job id history, first start,
  finish, restarts, current configuration, and the controller's memory of it;
* ``rounds`` / ``decisions`` — per round its timings, solve info and GPUs per type, and the
  controller's :class:`~sia_slurm.core.Decision` for every job;
* ``actions`` — the journal (:mod:`sia_slurm.state.journal`);
* ``reports`` / ``controller`` — metrics reports ingested and the policy's previous allocation
  (:mod:`sia_slurm.state.memory`; :mod:`sia_slurm.service.controller_memory` turns them into a
  controller);
* ``meta`` — small key/value facts (the last round's nodes, for offline ``status``/``explain``).

This module owns the connection and the queries of the ``meta``/``jobs``/``rounds``/``decisions``
tables; :mod:`sia_slurm.state.schema` holds the statements that create and upgrade the tables,
:mod:`sia_slurm.state.rows` the rows decoded.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sia_slurm import __version__
from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot
from sia_slurm.core import Decision, NodeView
from sia_slurm.protocol import to_json
from sia_slurm.state.codec import batch_to_json, config_to_json, placement_to_json
from sia_slurm.state.rows import (
    GONE,
    JobRow,
    RoundRow,
    decision,
    decision_values,
    job_row,
    round_row,
)
from sia_slurm.state.schema import SCHEMA_VERSION, upgrade_statements

logger = logging.getLogger(__name__)
DEFAULT_KEEP_ROUNDS = 7 * 24 * 60  # a week of 60 s rounds of history (decisions, done actions)


class StoreError(RuntimeError):
    """The state database cannot be opened or used (names the file and the reason)."""


def _newer_schema(path: Path, version: int) -> str:
    return (
        f"{path}: schema version {version} is newer than this sia-slurm ({__version__}) knows "
        f"({SCHEMA_VERSION}): a newer release wrote it. Run that release, or restore the copy "
        "of the database taken before the upgrade (docs/operations.md, Upgrading)"
    )


class Store:
    """An open state database. Use :meth:`open`; every write goes through :meth:`transaction`."""

    def __init__(self, path: Path, conn: sqlite3.Connection) -> None:
        self.path = path
        self.conn = conn

    # ------------------------------------------------------------------------------------------
    # Opening, schema, transactions

    @classmethod
    def open(cls, path: Path, *, create: bool = True) -> Store:
        """Open (and with ``create``, create and migrate) the database at ``path``.

        A new database is created readable and writable by its owner only: it holds the
        policy's memory (and, from a release before memory format 3, a pickle read once), which
        must never be writable by job owners (see docs/operations.md).
        """
        path = Path(path)
        if not create and not path.exists():
            raise StoreError(f"{path}: no state database (has the controller run yet?)")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            old_umask = os.umask(0o077)
            try:
                conn = sqlite3.connect(path, isolation_level=None, timeout=30.0)
            finally:
                os.umask(old_umask)
            conn.row_factory = sqlite3.Row
            # A newer release's database is refused before anything is written to it (the
            # switch to WAL rewrites its header): a downgrade must leave it as it was.
            version = int(conn.execute("PRAGMA user_version").fetchone()[0])
            if version > SCHEMA_VERSION:
                conn.close()
                raise StoreError(_newer_schema(path, version))
            mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{path}: cannot open the state database: {exc}") from None
        if str(mode).lower() != "wal":
            conn.close()
            raise StoreError(f"{path}: the filesystem refused WAL mode (got {mode!r})")
        store = cls(path, conn)
        store._migrate()
        return store

    def _migrate(self) -> None:
        version = self.schema_version
        if version > SCHEMA_VERSION:  # written by a newer release since open() looked
            self.close()
            raise StoreError(_newer_schema(self.path, version))
        if version == SCHEMA_VERSION:
            return
        with self.transaction():
            version = self.schema_version  # re-read under the write lock: another may have won
            for statement in upgrade_statements(version):
                self.conn.execute(statement)
            self.conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    @property
    def schema_version(self) -> int:
        return int(self.conn.execute("PRAGMA user_version").fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on any exception); not reentrant."""
        try:
            self.conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot start a transaction: {exc}") from None
        try:
            yield self.conn
        except BaseException:
            self.conn.execute("ROLLBACK")
            raise
        self.conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------
    # meta

    def set_meta(self, key: str, value: Any) -> None:
        self.conn.execute(
            "INSERT INTO meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, json.dumps(value)),
        )

    def meta(self, key: str, default: Any = None) -> Any:
        row = self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return default if row is None else json.loads(row[0])

    def last_nodes(self) -> tuple[NodeView, ...]:
        """The nodes of the last recorded snapshot (for offline ``status`` and ``explain``)."""
        return tuple(NodeView(*item) for item in self.meta("last_nodes", []))

    # ------------------------------------------------------------------------------------------
    # jobs

    def record_jobs(self, snapshot: ClusterSnapshot) -> None:
        """Fold the snapshot's view of every job into ``jobs`` (histories only grow)."""
        existing = {row.sia_id: row for row in self.jobs([job.sia_id for job in snapshot.jobs])}
        for job in snapshot.jobs:
            self._upsert_job(job, existing.get(job.sia_id), snapshot.time)
        # A job the backend could not read this round is quarantined, not gone.
        seen = {job.sia_id for job in snapshot.jobs} | set(snapshot.quarantined)
        self._mark_vanished(seen, snapshot.time)
        self.set_meta(
            "last_nodes",
            [[n.name, n.gpu_type, n.total_gpus, n.usable_gpus] for n in snapshot.nodes],
        )

    def _upsert_job(self, job: JobSnapshot, row: JobRow | None, now: float) -> None:
        phases = row.phase_history if row else []
        if not phases or phases[-1][1] != job.phase.value:
            phases = [*phases, [now, job.phase.value]]
        slurm_ids = row.slurm_job_ids if row else []
        if job.slurm_job_id and job.slurm_job_id not in slurm_ids:
            slurm_ids = [*slurm_ids, job.slurm_job_id]
        first_start = row.first_start if row else None
        if first_start is None and job.phase.holds_gpus:
            first_start = now
        finish = job.finish_time if job.phase.finished else None
        if finish is None and job.phase.finished:
            finish = row.finish_time if row and row.finish_time is not None else now
        holds = job.phase.holds_gpus
        values = {
            "sia_id": job.sia_id,
            "spec": json.dumps(to_json(job.spec), sort_keys=True),
            "phase": job.phase.value,
            "phase_history": json.dumps(phases),
            "slurm_job_ids": json.dumps(slurm_ids),
            "submit_time": job.spec.submit_time,
            "first_start": first_start,
            "finish_time": finish,
            "restarts": job.restarts,
            "config": json.dumps(config_to_json(job.config)) if holds else None,
            "placement": json.dumps(placement_to_json(job.placement)) if holds else None,
            "batch": json.dumps(batch_to_json(job.batch)) if holds else None,
            "message": job.message,
            "last_seen": now,
            "user": job.user,
            "account": job.account,
        }
        columns = ", ".join(values)
        updates = ", ".join(f"{k} = excluded.{k}" for k in values if k != "sia_id")
        self.conn.execute(
            f"INSERT INTO jobs ({columns}) VALUES ({', '.join('?' * len(values))}) "
            f"ON CONFLICT (sia_id) DO UPDATE SET {updates}",
            tuple(values.values()),
        )

    def _mark_vanished(self, seen: set[str], now: float) -> None:
        """Unfinished jobs missing from the snapshot (cancelled outside sia-slurm, or purged)
        become ``gone``, as the controller forgets them too; each is said once at ERROR: a
        job Slurm forgot before it finished (a restarted slurmctld that had not saved it, seen
        in the chaos soak) is lost, and only its user can submit it again."""
        rows = self.conn.execute(
            "SELECT sia_id, phase_history FROM jobs WHERE phase NOT IN (?, ?, ?)",
            (JobPhase.DONE.value, JobPhase.FAILED.value, GONE),
        ).fetchall()
        for row in rows:
            if row["sia_id"] in seen:
                continue
            logger.error(
                "[job=%s] gone: no Slurm job carries it any more, and it had not finished "
                "(cancelled outside sia-slurm, or forgotten by a restarted slurmctld)",
                row["sia_id"],
            )
            history = [*json.loads(row["phase_history"]), [now, GONE]]
            self.conn.execute(
                "UPDATE jobs SET phase = ?, phase_history = ?, config = NULL, placement = NULL, "
                "batch = NULL WHERE sia_id = ?",
                (GONE, json.dumps(history), row["sia_id"]),
            )

    def jobs(self, sia_ids: Sequence[str] | None = None) -> list[JobRow]:
        """Rows of ``jobs`` (all, or those of ``sia_ids``), in id order."""
        if sia_ids is None:
            rows = self.conn.execute("SELECT * FROM jobs ORDER BY sia_id").fetchall()
        else:
            rows = []
            ids = list(sia_ids)
            for start in range(0, len(ids), 500):  # SQLite's bound-parameter limit
                chunk = ids[start : start + 500]
                rows += self.conn.execute(
                    f"SELECT * FROM jobs WHERE sia_id IN ({', '.join('?' * len(chunk))}) "
                    "ORDER BY sia_id",
                    chunk,
                ).fetchall()
        return [job_row(row) for row in rows]

    def job(self, sia_id: str) -> JobRow | None:
        found = self.jobs([sia_id])
        return found[0] if found else None

    # ------------------------------------------------------------------------------------------
    # rounds and decisions

    def record_round(self, row: RoundRow, decisions: Sequence[Decision]) -> None:
        """One row of ``rounds`` and one ``decisions`` row per job (replacing a re-run round).

        The caller summarises the round (:func:`sia_slurm.service.summary.round_summary`): the
        store only writes the values it is given."""
        self.conn.execute(
            "INSERT OR REPLACE INTO rounds VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row.round_index,
                row.time,
                row.wall_time,
                int(row.dry_run),
                json.dumps(row.timings, sort_keys=True),
                row.solve_status,
                row.solve_seconds,
                row.solve_message,
                json.dumps(row.gpus, sort_keys=True),
                json.dumps(row.jobs_by_phase, sort_keys=True),
                json.dumps(list(row.rejected)),
            ),
        )
        self.conn.execute("DELETE FROM decisions WHERE round_index = ?", (row.round_index,))
        self.conn.executemany(
            "INSERT INTO decisions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(row.round_index, *decision_values(d)) for d in decisions],
        )

    def last_round(self) -> RoundRow | None:
        row = self.conn.execute("SELECT * FROM rounds ORDER BY round_index DESC LIMIT 1").fetchone()
        return None if row is None else round_row(row)

    def decisions(self, round_index: int) -> dict[str, Decision]:
        rows = self.conn.execute(
            "SELECT * FROM decisions WHERE round_index = ? ORDER BY sia_id", (round_index,)
        ).fetchall()
        return {row["sia_id"]: decision(row) for row in rows}

    def last_decision(self, sia_id: str) -> tuple[int, Decision] | None:
        """The latest round's decision about ``sia_id``, with that round's index."""
        row = self.conn.execute(
            "SELECT * FROM decisions WHERE sia_id = ? ORDER BY round_index DESC LIMIT 1",
            (sia_id,),
        ).fetchone()
        return None if row is None else (row["round_index"], decision(row))

    def prune(self, keep_rounds: int = DEFAULT_KEEP_ROUNDS) -> None:
        """Forget rounds, decisions and settled actions older than the last ``keep_rounds``."""
        last = self.conn.execute("SELECT MAX(round_index) FROM rounds").fetchone()[0]
        if last is None:
            return
        oldest = last - keep_rounds
        self.conn.execute("DELETE FROM rounds WHERE round_index <= ?", (oldest,))
        self.conn.execute("DELETE FROM decisions WHERE round_index <= ?", (oldest,))
        self.conn.execute(
            "DELETE FROM actions WHERE round_index <= ? AND state != 'pending'", (oldest,)
        )
