"""The controller's memory as it is kept in the state database, so a new process continues
where the last one stopped (``controller run --once`` under cron runs every round in a fresh
process).

This module only stores and loads: it writes a :class:`ControllerMemory` (plain values) and
reads the saved rows back, and knows nothing of the controller, the policies or the goodput
model. Turning a live :class:`~sia_slurm.controller.Controller` into a :class:`ControllerMemory`
and the rows read back into a live controller is :mod:`sia_slurm.service.controller_memory`'s work.

What is kept, and how:

* per job: its spec, ``max_gpus_seen``, report count and time (``jobs`` columns) and the metrics
  reports it ingested (``reports``; the latest :data:`DEFAULT_REPORTS_PER_SHAPE` per job and
  shape, so the file stays small), from which its goodput model is rebuilt;
* per job that brought its own profile: the checked ``profile.json`` its model was built from,
  in ``meta`` under ``profile_document:<sia id>`` (the job's directory is never read here), and
  the restarts its profiling took, under ``profiling_restarts:<sia id>``;
* per job whose reports are being checked: the first report taken on its shape (the pace check
  of :mod:`sia_slurm.controller.reports`) and why it is distrusted, under ``pace:<sia id>``
  (a release that knows no such key ignores it, and checks from the next report), and the
  restarts the controller asked of it, under ``chosen_restarts:<sia id>`` (Sia need not charge
  the others, docs/concepts/restart-factor.md);
* the previous :class:`~sia_slurm.policy.base.Allocation`, including the policy's own ``state``,
  in ``controller.allocation`` with the memory format, the sia-slurm version and the policy
  name. Format 3 (:data:`MEMORY_FORMAT`) is a documented JSON document
  (:mod:`sia_slurm.policy.allocation_json`, which makes it; this module stores the text and never
  reads inside it), so it outlives an upgrade of sia-slurm. Format 2 (before) is a pickle: it is
  read once, whatever release wrote it, and converted; the next save writes format 3. Format 1
  and any format newer than this code are not read. A previous allocation that is not read
  (another policy, format 1 or newer, a damaged document) starts the policy fresh, and the
  controller says why;
* the profilings under way (:mod:`sia_slurm.controller.profiling_state`), as JSON in ``meta`` under
  ``profilings``;
* the round index;
* the fair-share usage ledger (:class:`~sia_slurm.policy.shares.UsageLedger`), as JSON in
  ``meta`` under ``usage``.

A format-2 pickle is only unpickled from a database that nobody but its owner can write, and
only classes from sia-slurm, numpy's array reconstruction and plain builtins are accepted. A
pickle names :func:`_mapping_proxy` by this module's path (``sia_slurm.state.memory``), so both
stay here: moving them would make every format-2 allocation unloadable.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import pickle
import sqlite3
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sia_slurm import __version__
from sia_slurm.protocol import MetricsReport, ProtocolError, from_json, to_json
from sia_slurm.state.store import Store

logger = logging.getLogger(__name__)

# The previous allocation's format in controller.allocation: 1 a pickle (GavelState counted time
# run), 2 a pickle (GavelState credits time per type, type_time; Allocation.hints_move_jobs),
# 3 the JSON document of sia_slurm.policy.allocation_json (read by any later release). A new
# format comes with a new schema version (sia_slurm/state/schema.py), so that the releases
# that cannot read it refuse the database instead of starting their policy fresh on it.
MEMORY_FORMAT = 3
PICKLE_FORMAT = 2  # the one pickled format still read, and converted
UPGRADING = "docs/operations.md, Upgrading"
DEFAULT_REPORTS_PER_SHAPE = 16
USAGE_KEY = "usage"  # meta key of the usage ledger
PROFILING_RESTARTS_KEY = "profiling_restarts:"  # + sia id: the restarts its profiling took
# meta key of the profilings under way (controller/profiling_state.py)
PROFILINGS_KEY = "profilings"
PROFILE_KEY = "profile_document:"  # + sia id: a remembered job's own profile document
CHOSEN_RESTARTS_KEY = "chosen_restarts:"  # + sia id: the restarts the controller asked for
PACE_KEY = "pace:"  # + sia id: {"pace": first report on its shape or None, "distrusted": why}

_SAFE_BUILTINS = frozenset(
    {"dict", "list", "tuple", "set", "frozenset", "int", "float", "complex", "str", "bytes"}
    | {"bytearray", "bool", "slice", "range"}
)
_SAFE_NUMPY = frozenset({"_frombuffer", "_reconstruct", "scalar", "dtype", "ndarray"})


@dataclass(frozen=True)
class RestoreNote:
    """Why part of the memory was not restored (logged, and shown by ``status``)."""

    what: str
    reason: str


@dataclass(frozen=True)
class JobMemory:
    """What is kept of one remembered job, besides its ``jobs`` row and its reports."""

    max_gpus_seen: int
    reports: int  # reports ingested
    last_report_time: float  # -inf: none yet
    profile_document: Mapping[str, Any] | None  # the job's own checked profile.json
    profiling_restarts: int
    pace: Any = None  # the pace check's first report on the job's shape, as JSON (None: none)
    distrusted: str = ""  # why its last report was a lie ("" when believed)
    chosen_restarts: int = 0  # the restarts the controller asked for after profiling


@dataclass(frozen=True)
class ControllerMemory:
    """What is saved of the controller after a round, as plain values."""

    round_index: int  # the controller's next round
    jobs: Mapping[str, JobMemory]  # by sia id, the jobs it remembers
    usage: Any  # the usage ledger's JSON
    profilings: list[Any] | None  # each profiling under way, as JSON (None: no profiler)
    previous: Any  # the previous allocation's JSON document (format 3), or None


@dataclass(frozen=True)
class SavedAllocation:
    """A previous allocation as stored, for :mod:`sia_slurm.service.controller_memory` to decode."""

    format: int  # MEMORY_FORMAT: ``document`` is set; PICKLE_FORMAT: ``pickled`` is
    sia_version: str  # the sia-slurm that wrote it
    document: Any = None  # the parsed JSON document
    pickled: bytes | None = None  # the pickle (read with load_pickle, then converted)


# ----------------------------------------------------------------------------------------------
# Saving


def write_memory(
    store: Store,
    memory: ControllerMemory,
    policy_name: str,
    reports: Iterable[MetricsReport],
    round_index: int,
    now: float,
    *,
    keep_per_shape: int = DEFAULT_REPORTS_PER_SHAPE,
) -> None:
    """Write ``memory`` after round ``round_index`` (call inside a transaction, after
    :meth:`Store.record_jobs`, so every remembered job has its row).

    Of ``reports`` (the snapshot's), those of remembered jobs are kept.
    """
    conn = store.conn
    remembered = memory.jobs
    conn.execute("UPDATE jobs SET remembered = 0 WHERE remembered = 1")
    for sia_id, job in remembered.items():
        last = job.last_report_time
        conn.execute(
            "UPDATE jobs SET remembered = 1, admitted_round = COALESCE(admitted_round, ?), "
            "max_gpus_seen = ?, reports_seen = ?, last_report_time = ? WHERE sia_id = ?",
            (
                round_index,
                job.max_gpus_seen,
                job.reports,
                last if math.isfinite(last) else None,
                sia_id,
            ),
        )
    conn.execute("UPDATE jobs SET admitted_round = NULL WHERE remembered = 0")
    shapes: set[tuple[str, str]] = set()
    for report in reports:
        if report.sia_id not in remembered:
            continue
        shape = _shape(report)
        shapes.add((report.sia_id, shape))
        conn.execute(
            "INSERT INTO reports (sia_id, round_index, shape, report) VALUES (?, ?, ?, ?)",
            (report.sia_id, round_index, shape, json.dumps(to_json(report), sort_keys=True)),
        )
    for sia_id, shape in shapes:
        conn.execute(
            "DELETE FROM reports WHERE sia_id = ? AND shape = ? AND id NOT IN ("
            "SELECT id FROM reports WHERE sia_id = ? AND shape = ? ORDER BY id DESC LIMIT ?)",
            (sia_id, shape, sia_id, shape, keep_per_shape),
        )
    conn.execute(
        "DELETE FROM reports WHERE sia_id NOT IN (SELECT sia_id FROM jobs WHERE remembered = 1)"
    )
    for sia_id, job in remembered.items():
        if job.profile_document is not None:  # written once: a job's document never changes
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                (PROFILE_KEY + sia_id, json.dumps(job.profile_document)),
            )
        if job.profiling_restarts:  # written once, when its profiling ended
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                (PROFILING_RESTARTS_KEY + sia_id, json.dumps(job.profiling_restarts)),
            )
        if job.chosen_restarts:
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                (CHOSEN_RESTARTS_KEY + sia_id, json.dumps(job.chosen_restarts)),
            )
        if job.pace is not None or job.distrusted:  # changes round by round
            conn.execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                (PACE_KEY + sia_id, json.dumps({"pace": job.pace, "distrusted": job.distrusted})),
            )
        else:
            conn.execute("DELETE FROM meta WHERE key = ?", (PACE_KEY + sia_id,))
    for key in (PROFILE_KEY, PROFILING_RESTARTS_KEY, PACE_KEY, CHOSEN_RESTARTS_KEY):
        conn.execute(
            "DELETE FROM meta WHERE key LIKE ? AND substr(key, ?) NOT IN "
            "(SELECT sia_id FROM jobs WHERE remembered = 1)",
            (key + "%", len(key) + 1),
        )
    store.set_meta(USAGE_KEY, memory.usage)
    if memory.profilings is not None:
        store.set_meta(PROFILINGS_KEY, memory.profilings)
    # The document keeps its keys' order (not sorted): a policy may read its memory in order.
    conn.execute(
        "INSERT OR REPLACE INTO controller VALUES (1, ?, ?, ?, ?, ?, ?)",
        (
            MEMORY_FORMAT,
            __version__,
            policy_name,
            memory.round_index,
            None if memory.previous is None else json.dumps(memory.previous),
            now,
        ),
    )


def _shape(report: MetricsReport) -> str:
    return f"{report.gpu_type}/{report.nodes}/{report.gpus}/{report.local_bsz}"


# ----------------------------------------------------------------------------------------------
# Reading back


def controller_row(store: Store) -> sqlite3.Row | None:
    """The saved ``controller`` row (round index, previous allocation), or ``None``: nothing was
    saved yet."""
    row: sqlite3.Row | None = store.conn.execute("SELECT * FROM controller WHERE id = 1").fetchone()
    return row


def saved_usage(store: Store) -> Any:
    """The usage ledger's JSON (``{}`` when none was saved)."""
    return store.meta(USAGE_KEY, {})


def saved_profilings(store: Store) -> list[Any]:
    """Each profiling under way, as JSON."""
    profilings: list[Any] = store.meta(PROFILINGS_KEY, [])
    return profilings


def profile_document(store: Store, sia_id: str) -> Any:
    """The profile document job ``sia_id`` brought, or ``None``."""
    return store.meta(PROFILE_KEY + sia_id)


def profiling_restarts(store: Store, sia_id: str) -> int:
    """The restarts job ``sia_id``'s profiling took (0: none, or still profiling)."""
    return int(store.meta(PROFILING_RESTARTS_KEY + sia_id, 0) or 0)


def chosen_restarts(store: Store, sia_id: str) -> int:
    """The restarts the controller asked of job ``sia_id`` after its profiling (0: none, or
    a database older than the count: every restart is then charged as before)."""
    value = store.meta(CHOSEN_RESTARTS_KEY + sia_id, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def saved_pace(store: Store, sia_id: str) -> Any:
    """Job ``sia_id``'s pace-check state as :func:`write_memory` stored it, or ``None``."""
    return store.meta(PACE_KEY + sia_id)


def stored_reports(
    store: Store, notes: list[RestoreNote]
) -> dict[str, list[tuple[int, MetricsReport]]]:
    """Per job, the kept reports with the round each was ingested in, oldest first; one that
    cannot be read is left out and noted in ``notes``."""
    by_job: dict[str, list[tuple[int, Any]]] = {}
    rows = store.conn.execute("SELECT id, sia_id, round_index, report FROM reports ORDER BY id")
    for row in rows:
        where = f"{store.path}: reports.id={row['id']}"
        try:
            report = from_json(MetricsReport, json.loads(row["report"]), where)
        except (ProtocolError, ValueError) as exc:
            notes.append(RestoreNote(f"report of {row['sia_id']}", str(exc)))
            continue
        by_job.setdefault(row["sia_id"], []).append((int(row["round_index"]), report))
    return by_job


def saved_allocation(
    store: Store, row: Any, policy_name: str
) -> tuple[SavedAllocation | None, str]:
    """The previous allocation in ``row`` if this process may read it, else ``None`` and why
    (``""``: none was saved)."""
    stored = row["allocation"]
    if stored is None:
        return None, ""
    written, version = int(row["format"]), str(row["sia_version"])
    if written > MEMORY_FORMAT:
        return None, (
            f"saved in memory format {written} by a newer sia-slurm ({version}); this one "
            f"({__version__}) reads up to {MEMORY_FORMAT}, so the policy starts fresh. To keep "
            f"it, run that release, or restore the database copy taken before the upgrade "
            f"({UPGRADING})"
        )
    if row["policy"] != policy_name:
        return None, f"saved by policy {row['policy']!r}, the configured policy is {policy_name!r}"
    if written == MEMORY_FORMAT:
        text = stored.decode() if isinstance(stored, bytes) else stored
        try:
            document = json.loads(text)
        except (TypeError, ValueError) as exc:
            return None, f"cannot be read (memory format {written}: {exc})"
        return SavedAllocation(written, version, document=document), ""
    if written != PICKLE_FORMAT:
        return None, (
            f"saved in memory format {written} by sia-slurm {version}, which is not converted "
            f"(its Gavel state counted time run, not time credited); the policy starts fresh"
        )
    unsafe = _unsafe_file(store)
    if unsafe:
        return None, unsafe
    return SavedAllocation(written, version, pickled=bytes(stored)), ""


def _unsafe_file(store: Store) -> str:
    """Why the database is not trusted with pickles (writable by others), or ``""``."""
    try:
        info = os.stat(store.path)
    except OSError as exc:
        return f"cannot stat {store.path}: {exc.strerror}"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{store.path} is writable by group or others (chmod 600 it)"
    if info.st_uid != os.geteuid():
        return f"{store.path} is owned by uid {info.st_uid}, not this process's {os.geteuid()}"
    return ""


def log_restore_notes(notes: Iterable[RestoreNote]) -> None:
    for note in notes:
        logger.warning("restoring the controller: %s: %s; left out", note.what, note.reason)


# ----------------------------------------------------------------------------------------------
# Pickling (an Allocation's mappings are read-only proxies, which pickle cannot handle)


def _mapping_proxy(mapping: dict[Any, Any]) -> MappingProxyType[Any, Any]:
    return MappingProxyType(mapping)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, MappingProxyType):
            return _mapping_proxy, (dict(obj),)
        return NotImplemented


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if module == __name__ and name == "_mapping_proxy":
            return _mapping_proxy
        if module == "builtins" and name in _SAFE_BUILTINS:
            return super().find_class(module, name)
        if (module == "numpy" or module.startswith("numpy.")) and name in _SAFE_NUMPY:
            return super().find_class(module, name)
        if module.startswith("sia_slurm."):
            found = super().find_class(module, name)
            if isinstance(found, type):
                return found
        raise pickle.UnpicklingError(f"refusing to load {module}.{name}")


def dump_pickle(obj: object) -> bytes:
    """``obj`` pickled (read-only mappings included), as memory format 2 stored it (kept so
    tests can write a format-2 row)."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(obj)
    return buffer.getvalue()


def load_pickle(blob: bytes) -> Any:
    """What :func:`dump_pickle` wrote; refuses any callable but sia-slurm's classes, numpy's
    array reconstruction and plain builtins (:class:`pickle.UnpicklingError`)."""
    return _Unpickler(io.BytesIO(blob)).load()
