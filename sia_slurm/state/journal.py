"""The action journal: every action is committed as ``pending`` before it is issued.

Why: the controller can die at any instant (a crash, a node reboot, ``kill -9``). With the
action on disk before the cluster is touched, a restarted controller knows every action that
may be half done; backends make each action idempotent (re-applying a half-done action
completes it), so re-applying all ``pending`` actions (:func:`sia_slurm.service.reconcile`)
neither loses nor duplicates a job. After the backend answers, each entry is marked ``done``
or ``failed`` with the backend's message. Dry runs journal what they would do as ``skipped``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

from sia_slurm.cluster import Action
from sia_slurm.state.codec import CodecError, action_from_row, action_kind, action_payload
from sia_slurm.state.store import Store

PENDING = "pending"
DONE = "done"
FAILED = "failed"
SKIPPED = "skipped"  # decided in a dry run, never issued
STATES = (PENDING, DONE, FAILED, SKIPPED)


@dataclass(frozen=True)
class JournalEntry:
    """One journaled action. ``action`` is ``None`` when the stored payload cannot be decoded
    (``error`` says why); such an entry is marked failed rather than guessed at."""

    id: int
    round_index: int
    sia_id: str
    kind: str
    state: str
    message: str
    attempts: int
    created: float
    finished: float | None
    action: Action | None
    error: str = ""


class Journal:
    """The ``actions`` table of a :class:`~sia_slurm.state.store.Store`."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def add(self, actions: Sequence[Action], now: float, *, state: str = PENDING) -> list[int]:
        """Journal ``actions`` (call inside a transaction); returns their ids, in order."""
        if state not in (PENDING, SKIPPED):
            raise ValueError(f"state: new entries are {PENDING} or {SKIPPED}, got {state!r}")
        ids = []
        for action in actions:
            cursor = self.store.conn.execute(
                "INSERT INTO actions (round_index, sia_id, kind, payload, state, message, "
                "created) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    action.round_index,
                    action.sia_id,
                    action_kind(action),
                    json.dumps(action_payload(action), sort_keys=True),
                    state,
                    "dry run: not issued" if state == SKIPPED else "",
                    now,
                ),
            )
            ids.append(int(cursor.lastrowid or 0))
        return ids

    def mark(
        self, entry_id: int, ok: bool, message: str, now: float, *, attempted: bool = True
    ) -> None:
        """Settle one entry as done or failed (call inside a transaction); ``attempted``: the
        result comes from an attempt at it (not from giving it up unapplied)."""
        self.store.conn.execute(
            "UPDATE actions SET state = ?, message = ?, finished = ?, attempts = attempts + ? "
            "WHERE id = ?",
            (DONE if ok else FAILED, message, now, int(attempted), entry_id),
        )

    def count_attempt(self, entry_ids: Sequence[int], message: str) -> None:
        """One more attempt at entries that stay pending (their apply raised); ``message`` is
        why, shown by ``status`` until the entry is settled (call inside a transaction)."""
        for entry_id in entry_ids:
            self.store.conn.execute(
                "UPDATE actions SET attempts = attempts + 1, message = ? WHERE id = ? AND "
                "state = ?",
                (message, entry_id, PENDING),
            )

    def pending(self) -> list[JournalEntry]:
        """Entries not yet settled, oldest first (the order they must be re-applied in)."""
        return self._select("WHERE state = ? ORDER BY id", (PENDING,))

    def given_up(self, limit: int = 10) -> list[JournalEntry]:
        """The newest entries given up after too many attempts (``status`` lists them)."""
        return self._select(
            "WHERE state = ? AND message LIKE 'given up%' ORDER BY id DESC LIMIT ?",
            (FAILED, limit),
        )

    def entries(self, round_index: int | None = None) -> list[JournalEntry]:
        """Every entry (of one round), oldest first."""
        if round_index is None:
            return self._select("ORDER BY id", ())
        return self._select("WHERE round_index = ? ORDER BY id", (round_index,))

    def counts(self) -> dict[tuple[str, str], int]:
        """Entries per (kind, state): the Prometheus counters of actions by kind and result."""
        rows = self.store.conn.execute(
            "SELECT kind, state, COUNT(*) FROM actions GROUP BY kind, state"
        ).fetchall()
        return {(row[0], row[1]): int(row[2]) for row in rows}

    def _select(self, where: str, params: tuple[object, ...]) -> list[JournalEntry]:
        rows = self.store.conn.execute(f"SELECT * FROM actions {where}", params).fetchall()
        entries = []
        for row in rows:
            action, error = None, ""
            where_ = f"{self.store.path}: actions.id={row['id']}"
            try:
                payload = json.loads(row["payload"])
                if not isinstance(payload, dict):
                    raise CodecError(f"{where_}: payload: expected a JSON object")
                action = action_from_row(
                    row["kind"], row["sia_id"], row["round_index"], payload, where_
                )
            except (CodecError, ValueError) as exc:
                error = str(exc)
            entries.append(
                JournalEntry(
                    id=row["id"],
                    round_index=row["round_index"],
                    sia_id=row["sia_id"],
                    kind=row["kind"],
                    state=row["state"],
                    message=row["message"],
                    attempts=row["attempts"],
                    created=row["created"],
                    finished=row["finished"],
                    action=action,
                    error=error,
                )
            )
        return entries
