"""One service round: reconcile -> snapshot -> decide -> journal -> apply -> mark -> outputs.

The controller's round (:meth:`sia_slurm.controller.Controller.round`) is pure; this module adds
what makes it safe to run against a real cluster:

* **journal before apply**: the round's decisions, the controller's memory and its actions
  (``pending``) are committed in one transaction *before* ``backend.apply`` is called, and each
  action is marked ``done``/``failed`` after. A crash between the two leaves ``pending``
  entries;
* **reconcile**: every round (so also the first round of a restarted process) starts by
  re-applying ``pending`` entries through ``backend.apply`` (backends make every action
  idempotent), or marking them failed if their job is gone. So a crash at any point neither
  loses nor duplicates a job;
* **dry run**: observe and decide, journal the actions as ``skipped`` and log them; ``apply``
  is never called, and earlier ``pending`` entries are reported but not re-applied.

:func:`run_round` takes any :class:`~sia_slurm.cluster.ClusterBackend`, so the Slurm backend,
the simulator and the tests' fake cluster all run the same code.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from sia_slurm.clock import WALL_CLOCK, Clock
from sia_slurm.cluster import Action, ActionResult, ClusterBackend, ClusterSnapshot, JobPhase
from sia_slurm.config import SiaConfig
from sia_slurm.controller import Controller, RoundOutcome
from sia_slurm.controller.idle_waits import as_decided
from sia_slurm.protocol import MetricsReport
from sia_slurm.service.controller_memory import save_memory
from sia_slurm.service.logs import log_action, log_decision, log_event
from sia_slurm.service.prometheus import RoundMetrics, metrics_of, write_textfile
from sia_slurm.service.summary import gpus_by_type, jobs_by_phase, record_round
from sia_slurm.state import PENDING, SKIPPED, Journal, Store, action_kind

logger = logging.getLogger(__name__)

PRUNE_EVERY = 60  # rounds between prunings of old history
# A journaled action whose apply raised this many times is given up (marked failed, logged at
# ERROR, shown by `status`): a poison action must not be retried, or block a round, for ever.
MAX_ATTEMPTS = 3


@dataclass(frozen=True)
class ReconcileReport:
    """What became of the journal's ``pending`` entries at the start of a round.

    ``reports`` are the metrics reports of the snapshot reconcile took: a backend hands each
    report on once, so the round's own snapshot would not see them again; the round adds them
    to its snapshot rather than lose them."""

    reapplied: int = 0
    failed: int = 0
    left_pending: int = 0  # dry run, or reconcile could not run: reported, not touched
    reports: tuple[MetricsReport, ...] = ()


@dataclass(frozen=True)
class RoundReport:
    """What one service round did. ``error`` is set when ``apply`` raised: the round's actions
    then stay ``pending`` and are re-applied by the next round's reconcile."""

    round_index: int
    dry_run: bool
    actions: tuple[Action, ...]
    results: tuple[ActionResult, ...]
    reconcile: ReconcileReport
    timings: dict[str, float] = field(default_factory=dict)
    error: str = ""

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.results)


def run_round(
    config: SiaConfig,
    backend: ClusterBackend,
    store: Store,
    controller: Controller,
    dry_run: bool,
    *,
    clock: Clock = WALL_CLOCK,
) -> RoundReport:
    """Run one round against ``backend``; see the module docstring for the order of things.

    An exception from ``backend.snapshot()`` propagates (nothing can be decided without it:
    the loop logs it and runs the next round on schedule); one from reconciling is logged and
    leaves the earlier entries pending; one from applying this round's actions is reported in
    :attr:`RoundReport.error`.
    """
    started = time.perf_counter()
    timings: dict[str, float] = {}
    journal = Journal(store)
    try:
        reconciled = reconcile(store, backend, dry_run=dry_run, clock=clock)
    except Exception as exc:  # e.g. Slurm unreachable: the entries wait for the next round
        left = len(journal.pending())
        logger.error(
            "reconciling %d pending action(s) failed: %s: %s; they stay pending and are "
            "re-applied by the next round",
            left, type(exc).__name__, exc,
        )  # fmt: skip
        reconciled = ReconcileReport(left_pending=left)
    timings["reconcile_s"] = time.perf_counter() - started

    mark = time.perf_counter()
    snapshot = backend.snapshot()
    if reconciled.reports:
        reports = (*reconciled.reports, *snapshot.reports)
        snapshot = dataclasses.replace(snapshot, reports=reports)
    snapshot = only_new_reports(snapshot, controller)
    timings["snapshot_s"] = time.perf_counter() - mark
    for message in snapshot.rejected:
        logger.warning("[round=%d] rejected input: %s", controller.round_index, message)

    modelled = set(controller.jobs)
    outcome = controller.round(snapshot)
    _log_endings(outcome.round_index, snapshot, modelled)
    timings.update({f"decide_{k}": v for k, v in outcome.timings.items()})
    for message in outcome.rejected[len(snapshot.rejected) :]:
        logger.warning("[round=%d] %s", outcome.round_index, message)

    mark = time.perf_counter()
    ids = _record(config, store, journal, controller, snapshot, outcome, dry_run, timings, clock)
    timings["journal_s"] = time.perf_counter() - mark
    for decision in outcome.decisions:
        log_decision(outcome.round_index, decision, dry_run)

    results: list[ActionResult] = []
    error = ""
    mark = time.perf_counter()
    if dry_run:
        for action, entry_id in zip(outcome.actions, ids, strict=True):
            log_action(action, "dry-run", "not issued", journal_id=entry_id)
    else:
        # Called with no actions too: the backend enforces its grants every round.
        results, error = _apply(store, journal, backend, outcome.actions, ids, clock)
    timings["apply_s"] = time.perf_counter() - mark
    timings["round_s"] = time.perf_counter() - started

    _finish(config, store, journal, snapshot, outcome, dry_run, results, timings, clock)
    failed = sum(not r.ok for r in results)
    log_event(
        logging.ERROR if error else logging.INFO,
        f"[round={outcome.round_index}] {len(snapshot.jobs)} jobs, {len(outcome.actions)} "
        f"action(s): {len(results) - failed} done, {failed} failed"
        + (" (dry run)" if dry_run else "")
        + (f"; {error}" if error else ""),
        event="round",
        round=outcome.round_index,
        dry_run=dry_run,
        jobs=len(snapshot.jobs),
        actions=len(outcome.actions),
        done=len(results) - failed,
        failed=failed,
        solve_status=outcome.allocation.info.status,
        seconds=round(timings["round_s"], 6),
        error=error,
    )
    return RoundReport(
        round_index=outcome.round_index,
        dry_run=dry_run,
        actions=outcome.actions,
        results=tuple(results),
        reconcile=reconciled,
        timings=timings,
        error=error,
    )


def _log_endings(round_index: int, snapshot: ClusterSnapshot, modelled: set[str]) -> None:
    """One line per job that ended since the last round (the controller modelled it until
    now): DONE at INFO, FAILED at ERROR with why (whose failure, which budget)."""
    for job in snapshot.jobs:
        if job.phase.finished and job.sia_id in modelled:
            log_event(
                logging.INFO if job.phase is JobPhase.DONE else logging.ERROR,
                f"[round={round_index} job={job.sia_id}] {job.phase.value}: {job.message}",
                event="finished",
                round=round_index,
                job=job.sia_id,
                phase=job.phase.value,
                slurm_job_id=job.slurm_job_id,
                result_message=job.message,
            )


def only_new_reports(snapshot: ClusterSnapshot, controller: Controller) -> ClusterSnapshot:
    """``snapshot`` without the reports the controller has already ingested.

    A backend remembers which metrics reports it handed on only while its process lives; under
    ``--once`` every round is a new process and would hand the latest report of every job
    again, counting one measurement many times. The controller's ``last_report_time`` per job
    is persisted, so a report not newer than it is a repeat.
    """
    fresh = []
    for report in snapshot.reports:
        record = controller.jobs.get(report.sia_id)
        if record is None or report.time > record.last_report_time:
            fresh.append(report)
    if len(fresh) == len(snapshot.reports):
        return snapshot
    logger.debug("dropped %d repeated metrics report(s)", len(snapshot.reports) - len(fresh))
    return dataclasses.replace(snapshot, reports=tuple(fresh))


def _record(
    config: SiaConfig,
    store: Store,
    journal: Journal,
    controller: Controller,
    snapshot: ClusterSnapshot,
    outcome: RoundOutcome,
    dry_run: bool,
    timings: dict[str, float],
    clock: Clock,
) -> list[int]:
    """The one commit that must precede ``apply``: jobs, round, decisions, the controller's
    memory and the journaled actions."""
    now = clock.now()
    with store.transaction():
        store.record_jobs(snapshot)
        record_round(store, outcome, snapshot, dry_run=dry_run, wall_time=now, timings=timings)
        save_memory(
            store, controller, config.policy.name, outcome.reports_taken, outcome.round_index, now
        )
        return journal.add(outcome.actions, now, state=SKIPPED if dry_run else PENDING)


def _apply(
    store: Store,
    journal: Journal,
    backend: ClusterBackend,
    actions: Sequence[Action],
    ids: Sequence[int],
    clock: Clock,
) -> tuple[list[ActionResult], str]:
    """Issue the journaled ``actions`` and settle their entries from the backend's results.

    If applying them together raises, they are applied one by one, so that one job's poison
    action (the ``actuate`` stage of a quarantine) neither blocks the others nor fails the
    round: the one that raises stays pending with one more attempt, its job named."""
    try:
        results = list(backend.apply(actions))
    except Exception as exc:
        if not actions:
            logger.exception("applying no actions (enforcement only) failed: %s", exc)
            return [], f"apply failed: {type(exc).__name__}: {exc}"
        logger.warning(
            "[round=%d] applying %d action(s) raised (%s: %s); applying them one by one",
            actions[0].round_index, len(actions), type(exc).__name__, exc,
        )  # fmt: skip
        results = _one_by_one(store, journal, backend, actions, ids, give_up_after=3)
    settled = _match(actions, ids, results)
    with store.transaction():
        for entry_id, result in settled:
            journal.mark(entry_id, result.ok, result.message, clock.now())
    for entry_id, result in settled:
        log_action(
            result.action, "done" if result.ok else "failed", result.message, journal_id=entry_id
        )
    unanswered = len(actions) - len(settled)
    if unanswered:
        message = f"the backend answered {len(settled)} of {len(actions)} actions"
        logger.error("[round=%d] %s; the rest stay pending", actions[0].round_index, message)
        return [r for _, r in settled], message
    return [r for _, r in settled], ""


def _match(
    actions: Sequence[Action], ids: Sequence[int], results: Sequence[ActionResult]
) -> list[tuple[int, ActionResult]]:
    """Pair each result with its journal entry by the action it answers (backends may answer
    in another order, or fewer than asked)."""
    open_ids = list(zip(ids, actions, strict=True))
    pairs = []
    for result in results:
        for i, (entry_id, action) in enumerate(open_ids):
            if action == result.action:
                pairs.append((entry_id, result))
                del open_ids[i]
                break
    return pairs


def reconcile(
    store: Store, backend: ClusterBackend, *, dry_run: bool, clock: Clock = WALL_CLOCK
) -> ReconcileReport:
    """Settle the journal's ``pending`` entries left by a crash or a failed ``apply``.

    Each is re-applied (oldest first) if its job is still live in a fresh snapshot, else marked
    failed. In a dry run they are only reported.
    """
    journal = Journal(store)
    pending = journal.pending()
    if not pending:
        return ReconcileReport()
    if dry_run:
        for entry in pending:
            logger.warning(
                "[round=%d job=%s] %s from an earlier run is still pending; a dry run does not "
                "re-apply it",
                entry.round_index,
                entry.sia_id,
                entry.kind,
            )
        return ReconcileReport(left_pending=len(pending))
    snapshot = backend.snapshot()
    seen = snapshot.reports
    live = {job.sia_id for job in snapshot.jobs if not job.phase.finished}
    retry = []
    now = clock.now()
    with store.transaction():
        for entry in pending:
            if entry.action is None:
                journal.mark(entry.id, False, f"cannot be re-applied: {entry.error}", now)
            elif entry.attempts >= MAX_ATTEMPTS:
                why = f"given up after {entry.attempts} attempts; last: {entry.message}"
                journal.mark(entry.id, False, why, now, attempted=False)
                logger.error("[round=%d job=%s] %s %s", entry.round_index, entry.sia_id,
                             entry.kind, why)  # fmt: skip
            elif entry.sia_id not in live:
                journal.mark(entry.id, False, "job gone (finished or removed) before the "
                             "action was confirmed; not re-applied", now)  # fmt: skip
            else:
                retry.append(entry)
    for entry in pending:
        if entry not in retry:
            log_event(
                logging.WARNING,
                f"[round={entry.round_index} job={entry.sia_id}] pending {entry.kind} dropped",
                event="action",
                round=entry.round_index,
                job=entry.sia_id,
                kind=entry.kind,
                result="failed",
                result_message=entry.error
                or ("given up" if entry.attempts >= MAX_ATTEMPTS else "job gone"),
                journal_id=entry.id,
                recovered=True,
            )
    if not retry:
        return ReconcileReport(failed=len(pending), reports=seen)
    actions = [entry.action for entry in retry if entry.action is not None]
    ids = [entry.id for entry in retry]
    results = _reapply(store, journal, backend, actions, ids)
    settled = _match(actions, ids, results)
    with store.transaction():
        for entry_id, result in settled:
            journal.mark(entry_id, result.ok, f"re-applied: {result.message}".strip(), clock.now())
    for entry_id, result in settled:
        log_action(
            result.action,
            "done" if result.ok else "failed",
            f"re-applied after an interrupted round: {result.message}".rstrip(": "),
            journal_id=entry_id,
        )
    ok = sum(result.ok for _, result in settled)
    logger.info("reconciled %d pending action(s): %d re-applied", len(pending), ok)
    return ReconcileReport(reapplied=ok, failed=len(pending) - ok, reports=seen)


def _reapply(
    store: Store,
    journal: Journal,
    backend: ClusterBackend,
    actions: Sequence[Action],
    ids: Sequence[int],
) -> list[ActionResult]:
    """Re-apply ``actions`` together; if that raises, one by one, so that one poison action
    neither blocks the others nor stops the round. An action whose apply raised stays pending
    with one more attempt (given up at :data:`MAX_ATTEMPTS`)."""
    try:
        return list(backend.apply(actions))
    except Exception as exc:
        logger.warning("re-applying %d pending action(s) raised (%s); one by one", len(ids), exc)
    return _one_by_one(store, journal, backend, actions, ids)


def _one_by_one(
    store: Store,
    journal: Journal,
    backend: ClusterBackend,
    actions: Sequence[Action],
    ids: Sequence[int],
    *,
    give_up_after: int | None = None,
) -> list[ActionResult]:
    """Apply each action alone; one whose apply raises stays pending with one more attempt
    (given up at :data:`MAX_ATTEMPTS`), and its job is said to be quarantined at actuation.

    ``give_up_after``: when that many actions in a row raise before any succeeds, the failure
    is not one job's (Slurm unreachable, say) and the rest stay pending untried, rather than
    each waiting out the same timeout."""
    results: list[ActionResult] = []
    failed_in_a_row = 0
    for action, entry_id in zip(actions, ids, strict=True):
        if give_up_after is not None and not results and failed_in_a_row >= give_up_after:
            with store.transaction():
                journal.count_attempt([entry_id], "not tried: the actions before it all raised")
            continue
        try:
            results += backend.apply([action])
        except Exception as exc:
            failed_in_a_row += 1
            message = f"apply raised: {type(exc).__name__}: {exc}"
            logger.warning(
                "[round=%d job=%s] quarantined: actuate: %s",
                action.round_index, action.sia_id, message,
            )  # fmt: skip
            with store.transaction():
                journal.count_attempt([entry_id], message)
    return results


def _finish(
    config: SiaConfig,
    store: Store,
    journal: Journal,
    snapshot: ClusterSnapshot,
    outcome: RoundOutcome,
    dry_run: bool,
    results: Sequence[ActionResult],
    timings: dict[str, float],
    clock: Clock,
) -> None:
    """Round timings into the database, the Prometheus file, and occasional pruning."""
    with store.transaction():
        store.conn.execute(
            "UPDATE rounds SET timings = ? WHERE round_index = ?",
            (json.dumps(timings, sort_keys=True), outcome.round_index),
        )
        if outcome.round_index % PRUNE_EVERY == 0:
            store.prune()
    this_round: dict[tuple[str, str], int] = {}
    if dry_run:
        for action in outcome.actions:
            key = (action_kind(action), "dry-run")
            this_round[key] = this_round.get(key, 0) + 1
    for result in results:
        key = (action_kind(result.action), "done" if result.ok else "failed")
        this_round[key] = this_round.get(key, 0) + 1
    metrics = RoundMetrics(
        round_index=outcome.round_index,
        round_time=clock.now(),
        dry_run=dry_run,
        timings=timings,
        solve_seconds=outcome.allocation.info.solve_seconds,
        solve_status=outcome.allocation.info.status,
        jobs_by_phase=jobs_by_phase(snapshot),
        gpus=gpus_by_type(snapshot, outcome),
        actions_this_round=this_round,
        actions_total=journal.counts(),
        pending_actions=len(journal.pending()),
        rejected=len(outcome.rejected),
        unplaced=len(outcome.placement.unplaced),
        placed_at_fallback=len(outcome.placement.replaced),
        waiting_beside_free=as_decided(snapshot, outcome).by_cause(),
    )
    try:
        write_textfile(config.state_dir / "metrics", metrics_of(metrics))
    except OSError as exc:
        logger.warning("[round=%d] cannot write the metrics file: %s", outcome.round_index, exc)
