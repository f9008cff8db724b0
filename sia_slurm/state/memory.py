"""The controller's memory in the state database, so a new process continues where the last
one stopped (``controller run --once`` under cron runs every round in a fresh process).

What a :class:`~sia_slurm.controller.Controller` remembers, and how it is kept:

* per job: its spec, ``max_gpus_seen``, report count and time (``jobs`` columns) and the metrics
  reports it ingested (``reports``; the latest :data:`DEFAULT_REPORTS_PER_SHAPE` per job and
  shape, so the file stays small). A job's goodput model is rebuilt by re-feeding those reports
  to a fresh estimator through :meth:`JobRecord.ingest`, round by round, refitting after each
  round exactly as the live controller's policy evaluation does, so the rebuilt model equals
  the live one (until a shape has more reports than are kept: then the mean is over the
  latest ones);
* per job that brought its own profile: the checked ``profile.json`` its model was built from,
  in ``meta`` under ``profile_document:<sia id>`` (the job's directory is never read here);
* the quarantine reasons of the last round (from its decisions), so that each is logged once
  however many processes the rounds take;
* the previous :class:`~sia_slurm.policy.base.Allocation`, including the policy's own ``state``
  (an arbitrary object): pickled into a BLOB with a format number, the sia-slurm version and the
  policy name. If any of them differs, or the BLOB cannot be loaded, the controller starts
  fresh (no previous allocation) and says why;
* the profilings under way (:mod:`sia_slurm.controller.profiling`: the types measured, what
  each job was given, the documents refused), as JSON in ``meta`` under ``profilings``; a job
  still profiling is re-admitted into its profiling at the next round;
* the round index;
* the fair-share usage ledger (:class:`~sia_slurm.policy.shares.UsageLedger`: each account's
  decayed GPU time held and owed), as JSON in ``meta`` under ``usage``: without it a
  restarted controller, and ``--once`` under cron every round, would start every account's
  usage factor afresh.

The BLOB is only unpickled from a database that nobody but its owner can write, and only
classes from sia-slurm, numpy's array reconstruction and plain builtins are accepted.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import os
import pickle
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sia_slurm import __version__
from sia_slurm.controller import Controller, JobRecord
from sia_slurm.controller.profiling import Profiler, Profiling
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.core import Configuration
from sia_slurm.model import JobGoodputEstimator
from sia_slurm.policy.base import Allocation, Policy
from sia_slurm.policy.shares import EQUAL_USERS, SharesConfig
from sia_slurm.protocol import JobSpec, MetricsReport, ProtocolError, from_json, to_json
from sia_slurm.state.store import Store

logger = logging.getLogger(__name__)

MEMORY_FORMAT = 2  # 2: GavelState credits time per type (type_time); Allocation.hints_move_jobs
DEFAULT_REPORTS_PER_SHAPE = 16
USAGE_KEY = "usage"  # meta key of the usage ledger
PROFILING_RESTARTS_KEY = "profiling_restarts:"  # + sia id: the restarts its profiling took
PROFILINGS_KEY = "profilings"  # meta key of the profilings under way (controller/profiling.py)
PROFILE_KEY = "profile_document:"  # + sia id: a remembered job's own profile document

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


# ----------------------------------------------------------------------------------------------
# Saving


def save_memory(
    store: Store,
    controller: Controller,
    policy_name: str,
    reports: Iterable[MetricsReport],
    round_index: int,
    now: float,
    *,
    keep_per_shape: int = DEFAULT_REPORTS_PER_SHAPE,
) -> None:
    """Persist ``controller``'s memory after round ``round_index`` (call inside a transaction,
    after :meth:`Store.record_jobs`, so every remembered job has its row).

    ``reports`` are the snapshot's reports; those of jobs the controller remembers are the ones
    it ingested (one it rejected is rejected again when re-fed, with the same effect).
    """
    conn = store.conn
    remembered = controller.jobs
    conn.execute("UPDATE jobs SET remembered = 0 WHERE remembered = 1")
    for sia_id, record in remembered.items():
        last = record.last_report_time
        conn.execute(
            "UPDATE jobs SET remembered = 1, admitted_round = COALESCE(admitted_round, ?), "
            "max_gpus_seen = ?, reports_seen = ?, last_report_time = ? WHERE sia_id = ?",
            (
                round_index,
                record.max_gpus_seen,
                record.reports,
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
    for sia_id, record in remembered.items():
        if record.profile_document is not None:  # written once: a job's document never changes
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                (PROFILE_KEY + sia_id, json.dumps(record.profile_document)),
            )
        if record.profiling_restarts:  # written once, when its profiling ended
            conn.execute(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                (PROFILING_RESTARTS_KEY + sia_id, json.dumps(record.profiling_restarts)),
            )
    for key in (PROFILE_KEY, PROFILING_RESTARTS_KEY):
        conn.execute(
            "DELETE FROM meta WHERE key LIKE ? AND substr(key, ?) NOT IN "
            "(SELECT sia_id FROM jobs WHERE remembered = 1)",
            (key + "%", len(key) + 1),
        )
    store.set_meta(USAGE_KEY, controller.usage.to_json())
    if controller.profiler is not None:
        profilings = controller.profiler.profilings.values()
        store.set_meta(PROFILINGS_KEY, [p.to_json() for p in profilings])
    conn.execute(
        "INSERT OR REPLACE INTO controller VALUES (1, ?, ?, ?, ?, ?, ?)",
        (
            MEMORY_FORMAT,
            __version__,
            policy_name,
            controller.round_index,
            None if controller.previous is None else dump_allocation(controller.previous),
            now,
        ),
    )


def _shape(report: MetricsReport) -> str:
    return f"{report.gpu_type}/{report.nodes}/{report.gpus}/{report.local_bsz}"


# ----------------------------------------------------------------------------------------------
# Loading


def load_memory(
    store: Store,
    policy: Policy,
    policy_name: str,
    estimator_for: Callable[[JobSpec], JobGoodputEstimator],
    shares: SharesConfig = EQUAL_USERS,
    profiler: Profiler | None = None,
) -> tuple[Controller, list[RestoreNote]]:
    """A :class:`Controller` with the site's ``shares`` holding the memory saved in ``store``
    (fresh if there is none).

    Parts that cannot be restored are left out and listed in the returned notes; a job left out
    is simply re-admitted as new at the next round.
    """
    controller = Controller(policy, estimator_for, shares, profiler)
    notes: list[RestoreNote] = []
    row = store.conn.execute("SELECT * FROM controller WHERE id = 1").fetchone()
    if row is None:
        return controller, notes
    try:
        controller.usage.restore(store.meta(USAGE_KEY, {}), f"{store.path}: meta.{USAGE_KEY}")
    except ValueError as exc:
        notes.append(RestoreNote("usage ledger", str(exc)))
    if profiler is not None:
        _restore_profilings(store, profiler, notes)
    controller.round_index = int(row["round_index"])
    previous, why = _previous_allocation(store, row, policy_name)
    controller.previous = previous
    if why:
        notes.append(RestoreNote("previous allocation", why))
    reports = _stored_reports(store, notes)
    for job in store.jobs():
        if not job.remembered:
            continue
        where = f"{store.path}: jobs.{job.sia_id}.spec"
        try:
            spec = from_json(JobSpec, job.spec, where)
            document = store.meta(PROFILE_KEY + job.sia_id)
            if document is None and profiler is not None and _profiling(spec, profiler):
                continue  # re-admitted next round, into its profiling (restored above)
            if document is None:
                record = JobRecord(spec, estimator_for(spec))
            else:
                estimator = estimator_for(spec, document)  # type: ignore[call-arg]
                record = JobRecord(spec, estimator, document)
            _replay(record, job.admitted_round, reports.get(job.sia_id, []))
        except (ProtocolError, ValueError) as exc:
            notes.append(RestoreNote(f"job {job.sia_id}", str(exc)))
            continue
        record.profiling_restarts = int(store.meta(PROFILING_RESTARTS_KEY + job.sia_id, 0) or 0)
        record.max_gpus_seen = job.max_gpus_seen
        record.reports = job.reports_seen
        if job.last_report_time is not None:
            record.last_report_time = job.last_report_time
        controller.jobs[job.sia_id] = record
    last = store.last_round()
    if last is not None:
        decided = store.decisions(last.round_index).items()
        controller.quarantine_said = {s: d.note for s, d in decided if d.action == QUARANTINED}
    for note in notes:
        logger.warning("restoring the controller: %s: %s; left out", note.what, note.reason)
    return controller, notes


def _profiling(spec: JobSpec, profiler: Profiler) -> bool:
    """Whether a job was profiling (no profile of its own, no shipped app)."""
    return not spec.profile and spec.app not in profiler.factory.profiles.apps


def _restore_profilings(store: Store, profiler: Profiler, notes: list[RestoreNote]) -> None:
    for data in store.meta(PROFILINGS_KEY, []):
        try:
            profiling = Profiling.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            notes.append(RestoreNote("a profiling", f"{type(exc).__name__}: {exc}"))
            continue
        profiler.profilings[profiling.key] = profiling


def _stored_reports(store: Store, notes: list[RestoreNote]) -> dict[str, list[tuple[int, Any]]]:
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


def _replay(
    record: JobRecord, admitted_round: int | None, reports: list[tuple[int, MetricsReport]]
) -> None:
    """Re-feed ``reports`` as the live controller fed them: per round, then a policy-like
    evaluation that refits what changed (the estimator refits lazily, and *when* it refits
    decides which measurements a fit sees)."""
    rounds = sorted({r for r, _ in reports})
    if not rounds or admitted_round is None or rounds[0] != admitted_round:
        _evaluate_once(record.estimator)  # the admission round's evaluation, before any report
    for round_index in rounds:
        for r, report in reports:
            if r == round_index:
                # One the live controller rejected (and logged) is rejected again here.
                with contextlib.suppress(ValueError):
                    record.ingest(report)
        _evaluate_once(record.estimator)


def _evaluate_once(estimator: JobGoodputEstimator) -> None:
    """Evaluating any configuration refits every type with new measurements (see
    :meth:`JobGoodputEstimator.evaluate`); the type named does not matter."""
    estimator.evaluate([Configuration("-", 1, 1)])


def _previous_allocation(store: Store, row: Any, policy_name: str) -> tuple[Allocation | None, str]:
    if row["allocation"] is None:
        return None, ""
    if row["format"] != MEMORY_FORMAT:
        return None, f"saved in memory format {row['format']}, this code reads {MEMORY_FORMAT}"
    if row["sia_version"] != __version__:
        return None, f"saved by sia-slurm {row['sia_version']}, this is {__version__}"
    if row["policy"] != policy_name:
        return None, f"saved by policy {row['policy']!r}, the configured policy is {policy_name!r}"
    unsafe = _unsafe_file(store)
    if unsafe:
        return None, unsafe
    try:
        return load_allocation(row["allocation"]), ""
    except Exception as exc:  # any unpickling failure means: start fresh
        return None, f"cannot be loaded ({type(exc).__name__}: {exc})"


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


# ----------------------------------------------------------------------------------------------
# Pickling an Allocation (its mappings are read-only proxies, which pickle cannot handle)


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


def dump_allocation(allocation: Allocation) -> bytes:
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=5).dump(allocation)
    return buffer.getvalue()


def load_allocation(blob: bytes) -> Allocation:
    loaded = _Unpickler(io.BytesIO(blob)).load()
    if not isinstance(loaded, Allocation):
        raise pickle.UnpicklingError(f"expected an Allocation, got {type(loaded).__name__}")
    return loaded
