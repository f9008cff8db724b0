"""The controller's memory between processes: a live :class:`~sia_slurm.controller.Controller`
to the plain values :mod:`sia_slurm.state.memory` stores, and the stored values back to a
controller that continues where the last process stopped.

Why here, in the service: the service is what persists the controller. Every round it opens
the controller from the state database (:func:`sia_slurm.service.build.open_controller`; with
``controller run --once`` under cron every round is a fresh process) and saves its memory in
the round's one commit (:mod:`sia_slurm.service.journaled_round`). The controller itself does no
I/O and the simulator never persists it, and :mod:`sia_slurm.state` only stores and loads, so
the code that needs both the controller and the store lives with their one user.

What is rebuilt:

* a remembered job's goodput model, by re-feeding its kept reports to a fresh estimator through
  :meth:`JobRecord.ingest`, round by round, refitting after each round exactly as the live
  controller's policy evaluation does, so the rebuilt model equals the live one (until a shape
  has more reports than are kept: then the mean is over the latest ones); a job that brought
  its own profile is rebuilt from the document kept with it;
* the quarantine reasons of the last round (from its decisions), so that each is logged once
  however many processes the rounds take;
* the previous :class:`~sia_slurm.policy.base.Allocation`, when it may be loaded: encoded
  and decoded here as the JSON document of :mod:`sia_slurm.policy.allocation_json` (memory
  format 3, which outlives an upgrade); a format-2 row (a pickle, from a release before) is
  unpickled once, converted to that document and decoded by the same strict reader, and the
  round's save writes it back as format 3;
* the profilings under way (:mod:`sia_slurm.controller.profiling_state`: the types measured,
  what each job was given, the documents refused); a job still profiling is re-admitted into its
  profiling at the next round;
* the round index and the fair-share usage ledger (without it a restarted controller, and
  ``--once`` under cron every round, would start every account's usage factor afresh).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterable
from typing import Any

from sia_slurm.controller import Controller, JobRecord
from sia_slurm.controller.profiling import Profiler
from sia_slurm.controller.profiling_state import Profiling
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.controller.reports import Pace
from sia_slurm.core import Configuration
from sia_slurm.model import JobGoodputEstimator
from sia_slurm.policy.allocation_json import (
    allocation_from_json,
    allocation_to_json,
    legacy_document,
)
from sia_slurm.policy.base import Allocation, Policy
from sia_slurm.policy.shares import EQUAL_USERS, SharesConfig
from sia_slurm.protocol import JobSpec, MetricsReport, ProtocolError, from_json
from sia_slurm.state import Store
from sia_slurm.state.memory import (
    DEFAULT_REPORTS_PER_SHAPE,
    MEMORY_FORMAT,
    USAGE_KEY,
    ControllerMemory,
    JobMemory,
    RestoreNote,
    SavedAllocation,
    chosen_restarts,
    controller_row,
    load_pickle,
    log_restore_notes,
    profile_document,
    profiling_restarts,
    saved_allocation,
    saved_pace,
    saved_profilings,
    saved_usage,
    stored_reports,
    write_memory,
)

logger = logging.getLogger(__name__)

# ----------------------------------------------------------------------------------------------
# Saving


def memory_of(controller: Controller) -> ControllerMemory:
    """What is saved of ``controller``."""
    return ControllerMemory(
        round_index=controller.round_index,
        jobs={
            sia_id: JobMemory(
                max_gpus_seen=record.max_gpus_seen,
                reports=record.reports,
                last_report_time=record.last_report_time,
                profile_document=record.profile_document,
                profiling_restarts=record.profiling_restarts,
                pace=None if record.pace is None else record.pace.to_json(),
                distrusted=record.distrusted,
                chosen_restarts=record.chosen_restarts,
            )
            for sia_id, record in controller.jobs.items()
        },
        usage=controller.usage.to_json(),
        profilings=(
            None
            if controller.profiler is None
            else [p.to_json() for p in controller.profiler.profilings.values()]
        ),
        previous=None if controller.previous is None else allocation_to_json(controller.previous),
    )


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
    write_memory(
        store,
        memory_of(controller),
        policy_name,
        reports,
        round_index,
        now,
        keep_per_shape=keep_per_shape,
    )


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
    row = controller_row(store)
    if row is None:
        return controller, notes
    try:
        controller.usage.restore(saved_usage(store), f"{store.path}: meta.{USAGE_KEY}")
    except ValueError as exc:
        notes.append(RestoreNote("usage ledger", str(exc)))
    if profiler is not None:
        _restore_profilings(store, profiler, notes)
    controller.round_index = int(row["round_index"])
    previous, why = _previous_allocation(store, row, policy_name)
    controller.previous = previous
    if why:
        notes.append(RestoreNote("previous allocation", why))
    reports = stored_reports(store, notes)
    for job in store.jobs():
        if not job.remembered:
            continue
        where = f"{store.path}: jobs.{job.sia_id}.spec"
        try:
            spec = from_json(JobSpec, job.spec, where)
            document = profile_document(store, job.sia_id)
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
        record.profiling_restarts = profiling_restarts(store, job.sia_id)
        record.chosen_restarts = chosen_restarts(store, job.sia_id)
        record.max_gpus_seen = job.max_gpus_seen
        record.reports = job.reports_seen
        if job.last_report_time is not None:
            record.last_report_time = job.last_report_time
        _restore_pace(record, saved_pace(store, job.sia_id), job.sia_id, notes)
        controller.jobs[job.sia_id] = record
    last = store.last_round()
    if last is not None:
        decided = store.decisions(last.round_index).items()
        controller.quarantine_said = {s: d.note for s, d in decided if d.action == QUARANTINED}
    log_restore_notes(notes)
    return controller, notes


def _restore_pace(record: JobRecord, saved: Any, sia_id: str, notes: list[RestoreNote]) -> None:
    """The pace check where the last process left it (under ``--once`` every round is a new
    process: without this a lie about the pace was never judged, and a liar held at its
    minimum was free again next round). One that cannot be read starts the check afresh."""
    if saved is None:
        return
    try:
        if not isinstance(saved, dict) or not isinstance(saved.get("distrusted"), str):
            raise ValueError(f"not a pace record: {saved!r:.200}")
        pace = saved.get("pace")
        record.pace = None if pace is None else Pace.from_json(pace)
        record.distrusted = saved["distrusted"]
    except ValueError as exc:
        notes.append(RestoreNote(f"job {sia_id}'s pace check", str(exc)))


def _profiling(spec: JobSpec, profiler: Profiler) -> bool:
    """Whether a job was profiling (no profile of its own, no shipped app)."""
    return not spec.profile and spec.app not in profiler.factory.profiles.apps


def _restore_profilings(store: Store, profiler: Profiler, notes: list[RestoreNote]) -> None:
    for data in saved_profilings(store):
        try:
            profiling = Profiling.from_json(data)
        except (KeyError, TypeError, ValueError) as exc:
            notes.append(RestoreNote("a profiling", f"{type(exc).__name__}: {exc}"))
            continue
        profiler.profilings[profiling.key] = profiling


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
    saved, why = saved_allocation(store, row, policy_name)
    if saved is None:
        return None, why
    try:
        allocation = decode_allocation(saved, f"{store.path}: controller.allocation")
    except Exception as exc:  # any unpickling or decoding failure means: start fresh
        return None, f"cannot be loaded ({type(exc).__name__}: {exc})"
    if saved.pickled is not None:
        logger.info(
            "previous allocation: converted from memory format %d (sia-slurm %s); "
            "the next save writes format %d",
            saved.format, saved.sia_version, MEMORY_FORMAT,
        )  # fmt: skip
    return allocation, ""


# ----------------------------------------------------------------------------------------------
# The previous allocation as stored (sia_slurm.state.memory keeps the text or the pickle)


def decode_allocation(saved: SavedAllocation, where: str = "allocation") -> Allocation:
    """The :class:`Allocation` of a stored row: its JSON document (format 3), or its pickle
    (format 2) converted to that document first, so both pass the same strict checks
    (:class:`ValueError` naming the field, :class:`pickle.UnpicklingError`)."""
    if saved.pickled is not None:
        return allocation_from_json(legacy_document(load_pickle(saved.pickled)), where)
    return allocation_from_json(saved.document, where)
