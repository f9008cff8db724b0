"""Carry out the controller's actions on Slurm: Stop, Move, Start, Rebatch.

Sequences (verified on Slurm 22.05.8; ``docs/slurm-actuation.md``):

* **Stop** a running job: write ``control/<id>/stop.json``, ``scancel --batch
  --signal=USR1``, wait for the job's ``jobs/<id>/ack-<round>.<run>`` (a regular file of the job's
  user; up to ``restart.checkpoint_timeout_s``; then go on and say so), ``scontrol
  requeuehold``, wait until Slurm has taken the GPUs back (COMPLETING -> PENDING), remove
  ``stop.json``. The signal goes to every stopping job first, then all are awaited
  together, so the waits overlap. A job that exits 0 without an ack finished its training
  instead: it is not requeued. Every stop half runs before any start half, so a move may take
  GPUs that another move of the same call frees (tests/e2e checks it on real Slurm).
* **Start** a pending job: ``scontrol hold`` (if released), ``scontrol update Partition=P
  TresPerNode=gres:gpu:K NumNodes=N-N NumTasks=N ReqNodeList=...``, read the job back (an
  update that exits 0 may not have taken), write ``assignment.json`` for that Slurm run (job id
  and restart count; for a requeued run also ``not_before``, its BeginTime - cred_expire + 1:
  a requeue delays it by cred_expire + 1 s, and ``now`` could meet the credential revoked in
  the kill's second, :func:`commands.relaunch_floor`), set that ``StartTime`` while the job is
  still held, then ``scontrol release``.
  A node-count shrink normally takes in place (``NumNodes`` with ``NumCPUs``); where Slurm
  leaves the job in ``BadConstraints`` (or ``resubmit_shrinks``) the job is resubmitted
  under a new Slurm job id with the same comment (sia id) and batch script
  (``scontrol write batch_script``, kept in ``control/<sia_id>/``), recorded in
  ``control/<sia_id>/slurm.json``, and the old job is cancelled. Only root can submit for
  another user, so a controller under a service account fails such a shrink and says so.
* **Move** = the stop half, then the start half.
* **Rebatch**: rewrite ``assignment.json`` with the new round and batch; nothing in Slurm.

Before the actions, every ``apply`` enforces the controller's grants
(:mod:`sia_slurm.slurm.actuate.enforce`).

The controller writes only under ``control/``, its own tree; the job's directory is read
through :mod:`sia_slurm.userfiles`.

Every action is idempotent, because the service replays unfinished ones after a crash: each
step looks at where the job already is (an assignment written for this round, a job already
held or requeued, an acknowledgement already there) and does only what is left.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from sia_slurm.clock import Clock
from sia_slurm.cluster import Action, ActionResult, Move, Rebatch, Start, Stop
from sia_slurm.config import SiaConfig
from sia_slurm.protocol import (
    PROTOCOL_VERSION,
    Assignment,
    ProtocolError,
    StatePaths,
    StopRequest,
    read_document,
    write_document,
)
from sia_slurm.slurm import commands
from sia_slurm.slurm.actuate import timelimit
from sia_slurm.slurm.actuate.calls import SlurmCalls
from sia_slurm.slurm.actuate.rebatch import rebatch
from sia_slurm.slurm.actuate.resubmit import ResubmissionError, must_resubmit, resubmit
from sia_slurm.slurm.actuate.waits import Waits
from sia_slurm.slurm.commands import Shape
from sia_slurm.slurm.observe.jobfiles import DocumentCache
from sia_slurm.slurm.observe.jobs_view import JobsView
from sia_slurm.slurm.observe.jsonparse import SlurmJob
from sia_slurm.slurm.observe.managed import ManagedJob, under_controller_hold
from sia_slurm.slurm.observe.sacct import AccountingReader
from sia_slurm.slurm.runner import CommandError, CommandRunner
from sia_slurm.userfiles import JobDirectory

logger = logging.getLogger(__name__)

PlacedAction = Start | Move


class ActuationError(RuntimeError):
    """One action could not be carried out; the message says what and why."""


@dataclass
class _Round:
    """Book-keeping of one ``apply`` call: results so far and notes per action."""

    results: dict[int, ActionResult] = field(default_factory=dict)
    details: dict[int, dict[str, str]] = field(default_factory=dict)

    def ok(self, action: Action, message: str) -> None:
        details = self.details.get(id(action), {})
        self.results[id(action)] = ActionResult(action, True, message, details)
        logger.info("[round=%d job=%s] %s", action.round_index, action.sia_id, message)

    def fail(self, action: Action, message: str) -> None:
        details = self.details.get(id(action), {})
        self.results[id(action)] = ActionResult(action, False, message, details)
        logger.warning("[round=%d job=%s] failed: %s", action.round_index, action.sia_id, message)

    def note(self, action: Action, key: str, value: str) -> None:
        self.details.setdefault(id(action), {})[key] = value

    def done(self, action: Action) -> bool:
        return id(action) in self.results


@dataclass
class _Placement:
    """A Start (or the start half of a Move) on its way through the steps."""

    action: PlacedAction
    shape: Shape
    assignment: Assignment  # validated up front; round, restarts and Slurm id filled in later
    job: ManagedJob
    slurm_job_id: str = ""
    restarts: int = 0
    slurm_restart_count: int = 0  # Slurm's count of the run the job is released into
    begin_time: float = 0.0  # Slurm's BeginTime of the pending job, 0 once it has passed
    resubmitted: bool = False


def _left_elsewhere(killed: Assignment | None, step: _Placement) -> bool:
    """Whether ``step`` starts its job on none of the nodes of the run Slurm requeued just
    before it, as that run's assignment names them (the previous restart of the same Slurm
    job; a run the controller did not start, or one of another job id, proves nothing): only
    those nodes revoked the job's credential, so the relaunch need not wait out the kill's
    second (:func:`commands.kill_second`; a profiling run's every move, most moves across
    types)."""
    if killed is None or not killed.node_list:
        return False
    if (killed.slurm_job_id, killed.slurm_restart_count + 1) != (
        step.slurm_job_id,
        step.slurm_restart_count,
    ):
        return False
    return not set(killed.node_list) & set(step.shape.node_list)


class Actuator:
    """Applies actions through ``runner``; ``observe`` is one ``squeue`` (the backend's)."""

    def __init__(
        self,
        config: SiaConfig,
        runner: CommandRunner,
        clock: Clock,
        paths: StatePaths,
        documents: DocumentCache,
        observe: Callable[[], JobsView],
        resubmit_shrinks: bool = False,
    ) -> None:
        self.config = config
        self.resubmit_shrinks = resubmit_shrinks
        self.runner = runner
        self.clock = clock
        self.paths = paths
        self.documents = documents
        self.observe = observe
        self.calls = SlurmCalls(runner)
        # Time limits over a job's whole life (issue 20); sacct only for jobs restarted.
        self.life = timelimit.LifeLimits(runner, AccountingReader(runner), config.managed_marker)
        self.waits = Waits(config.restart.checkpoint_timeout_s, clock, paths, observe, runner)

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        """Apply one round's actions, each job as soon as it can go.

        A Start is placed first: it needs nothing from the round's stops, and Slurm holds it
        until the GPUs it names are free. A Move is placed as soon as its own Slurm job is back
        to PENDING, not when every job stopped this round is: one job with a slow checkpoint
        or a slow exit must not delay every other restart of the round.
        """
        if not actions:
            return []
        book = _Round()
        view = self.observe()
        self._cancel_strays(view)
        starts = [a for a in actions if isinstance(a, Start)]
        if starts:
            self._place(starts, view, book)
        stoppers = [a for a in actions if isinstance(a, Stop | Move)]
        if stoppers:
            requeued, changed = self._stop(stoppers, view, book)
            if changed:
                view = self.observe()
            self._finish_stoppers(stoppers, requeued, view, book)
        for action in actions:
            if isinstance(action, Rebatch):
                self._rebatch(action, view, book)
        return [book.results[id(a)] for a in actions]

    # ------------------------------------------------------------------------------------------
    # Stop (and the first half of Move)

    def _stop(
        self, actions: list[Stop | Move], view: JobsView, book: _Round
    ) -> tuple[dict[str, Stop | Move], bool]:
        """Checkpoint and requeue (held) the running jobs among ``actions``, hold the pending
        ones. Returns the requeued Slurm jobs' actions by job id (to wait for), and whether
        Slurm was changed at all."""
        running: dict[str, tuple[Stop | Move, SlurmJob]] = {}
        to_requeue: list[tuple[Stop | Move, SlurmJob]] = []
        to_hold: list[tuple[Stop | Move, SlurmJob]] = []
        completing: list[tuple[Stop | Move, SlurmJob]] = []
        for action in actions:
            managed = self._managed(action, view, book)
            if managed is None:
                continue
            job = managed.current
            book.note(action, "slurm_job_id", job.job_id)
            if isinstance(action, Move) and self._already_placed(action, managed):
                self._bring_forward(action, job, book)
                book.ok(action, f"already moved (Slurm job {job.job_id})")
            elif job.completing:
                # Giving its GPUs back: requeued (by this action before the controller was
                # restarted, or by Slurm) or ending by itself. Signalling or requeueing it
                # now is refused ("Job can not be altered now"); wait until it settles.
                completing.append((action, job))
                book.note(action, "checkpoint", f"job was completing ({job.state})")
            elif job.state == "PENDING":
                if not job.held:
                    to_hold.append((action, job))
                book.note(action, "checkpoint", "job was not running")
            elif job.finished:
                if self.waits.ended_unasked(action.sia_id, job):
                    self._settle_ended(action, job, book)
                else:  # stopped for this action (acknowledged), then ended: requeue it
                    to_requeue.append((action, job))
                    book.note(action, "checkpoint", f"job had ended ({job.state})")
            else:
                self._request_stop(action, managed)
                running[action.sia_id] = (action, job)
        if running:
            ids = [job.job_id for _, job in running.values()]
            self.calls.run_quiet(commands.signal_checkpoint(ids))
            outcomes, ended = self.waits.acks(running)
            for sia_id, outcome in outcomes.items():
                book.note(running[sia_id][0], "checkpoint", outcome)
            for sia_id, job in ended.items():
                self._settle_ended(running[sia_id][0], job, book)
            to_requeue += [entry for entry in running.values() if not book.done(entry[0])]
        failures = self.calls.batched(commands.requeue_hold, [job.job_id for _, job in to_requeue])
        failures.update(self.calls.batched(commands.hold, [job.job_id for _, job in to_hold]))
        for action, job in [*to_requeue, *to_hold]:
            if job.job_id in failures:
                book.fail(action, f"could not hold Slurm job {job.job_id}: {failures[job.job_id]}")
        requeued = {job.job_id: action for action, job in to_requeue if not book.done(action)}
        requeued.update({job.job_id: action for action, job in completing})
        return requeued, bool(to_requeue or to_hold or completing)

    def _finish_stoppers(
        self,
        actions: list[Stop | Move],
        requeued: dict[str, Stop | Move],
        view: JobsView,
        book: _Round,
    ) -> None:
        """Complete each Stop and place each Move once its Slurm job is PENDING (its GPUs
        free); a requeued job that ends instead, or is still not PENDING after
        :data:`~sia_slurm.slurm.actuate.waits.COMPLETING_TIMEOUT_S`, fails its action. ``view`` is
        Slurm as it is now."""

        def settle(ready: Sequence[Stop | Move], view: JobsView) -> None:
            stopped = [a for a in ready if isinstance(a, Stop) and not book.done(a)]
            job_ids = [book.details.get(id(a), {}).get("slurm_job_id", "") for a in stopped]
            # A requeuehold is a *user* hold whoever issues it (its owner could release the
            # job); the controller's own hold is an admin hold (docs/slurm-actuation.md).
            failures = self.calls.batched(commands.hold, [j for j in job_ids if j])
            for action, job_id in zip(stopped, job_ids, strict=True):
                self._clean_stop_files(action)
                if job_id in failures:
                    book.note(action, "hold", f"not held by the controller: {failures[job_id]}")
                book.ok(action, f"stopped (Slurm job {job_id} requeued and held)")
            moves = [a for a in ready if isinstance(a, Move) and not book.done(a)]
            if moves:
                self._place(moves, view, book)

        waited = {id(action) for action in requeued.values()}
        settle([a for a in actions if id(a) not in waited], view)
        left = self.waits.until_pending(
            list(requeued), view, lambda ids, now: settle([requeued[i] for i in ids], now)
        )
        for job_id, state in left.items():
            book.fail(requeued[job_id], f"Slurm job {job_id} is {state}, not PENDING after requeue")

    def _request_stop(self, action: Stop | Move, managed: ManagedJob) -> None:
        """Write ``stop.json`` for this round unless it is already there (a replay), in the
        protocol the job speaks."""
        path = self.paths.stop_request(action.sia_id)
        try:
            existing = read_document(StopRequest, path) if path.exists() else None
        except ProtocolError:
            existing = None
        if existing is None or existing.round_index != action.round_index:
            request = StopRequest(
                action.sia_id,
                action.round_index,
                self.clock.now(),
                version=self._protocol_of(managed),
            )
            write_document(path, request)

    def _settle_ended(self, action: Stop | Move, job: SlurmJob, book: _Round) -> None:
        """A job that ended by itself instead of stopping: nothing to requeue. One that
        completed its training: a Stop is done, a Move cannot be (nothing is left to run).
        One that failed: neither; the next snapshot judges the failed run (its own code's or
        Slurm's, and the budgets: :func:`managed.failed_run`), as if no stop had been asked.
        The stop request goes, so the job reads DONE or failed from now on."""
        self._clean_stop_files(action)
        if job.state != "COMPLETED":
            book.fail(
                action,
                f"Slurm job {job.job_id} ended {job.state} by itself before it could be "
                "stopped; not requeued: the failed-run rules decide whether it comes back",
            )
            return
        message = f"Slurm job {job.job_id} completed its training before it could be stopped"
        if isinstance(action, Stop):
            book.ok(action, message)
        else:
            book.fail(action, f"{message}; not moved")

    # ------------------------------------------------------------------------------------------
    # Start (and the second half of Move)

    def _place(self, actions: list[PlacedAction], view: JobsView, book: _Round) -> None:
        steps: list[_Placement] = []
        for action in actions:
            managed = self._managed(action, view, book)
            if managed is None:
                continue
            try:
                step = self._prepare(action, managed)
            except (ActuationError, CommandError, ProtocolError, KeyError, ValueError) as exc:
                book.fail(action, str(exc))
                continue
            if step is not None:
                steps.append(step)
            else:
                self._bring_forward(action, managed.current, book)
                book.ok(action, f"already started (Slurm job {managed.current.job_id})")
        self._reshape(steps, book)
        ready = [s for s in steps if not book.done(s.action)]
        for step in ready:
            assignment = replace(
                step.assignment,
                restarts=step.restarts,
                slurm_job_id=step.slurm_job_id,
                slurm_restart_count=step.slurm_restart_count,
                not_before=self._not_before(step),
            )
            path = self.paths.assignment(step.action.sia_id)
            write_document(path, assignment)
            self.documents.forget(path)
            self._clean_stop_files(step.action)  # the restarted job must not see the old request
            step.assignment = assignment
            if not step.resubmitted:
                self._bring_forward(step.action, step.job.current, book, assignment)
        ready = [s for s in ready if self._limit_life(s, book)]
        failures = self.calls.batched(commands.release, [s.slurm_job_id for s in ready])
        for step in ready:
            action = step.action
            book.note(action, "slurm_job_id", step.slurm_job_id)
            if step.slurm_job_id in failures:
                book.fail(action, f"could not release: {failures[step.slurm_job_id]}")
                continue
            verb = "moved" if isinstance(action, Move) else "started"
            where = ",".join(step.shape.node_list)
            said = f"{verb} to {step.shape.partition} {where} (Slurm job {step.slurm_job_id})"
            late = book.details.get(id(action), {}).get("start_time")
            book.ok(action, f"{said}; its StartTime was {late}" if late else said)

    def _limit_life(self, step: _Placement, book: _Round) -> bool:
        """Set the run's TimeLimit to what is left of the job's limit over all its runs
        (:mod:`.timelimit`); a job with nothing left is cancelled, not started. False when
        the step is done with."""
        record = step.job.record
        left = self.life.left(
            step.action.sia_id, record.time_limit_min, record.submit_time, step.restarts
        )
        if left is None:
            return True
        try:
            if left.seconds <= 0:
                self.calls.run(timelimit.cancel(step.slurm_job_id))
                book.fail(
                    step.action,
                    f"its time limit of {left.limit_min} min is used up over its runs "
                    f"({left.used_s:.0f} s): cancelled, as Slurm would end it",
                )
                return False
            self.calls.run(timelimit.set_time_limit(step.slurm_job_id, left))
        except CommandError as exc:
            book.fail(step.action, f"could not set the time left: {exc}")
            return False
        book.note(step.action, "time_left_s", f"{left.seconds:.0f}")
        return True

    def _not_before(self, step: _Placement) -> float:
        """The earliest second (slurmctld's clock) the run may start: 0 for a job that was
        never requeued (or was resubmitted); for a requeued one, the floor its assignment for
        the same run already holds (a start replayed after a crash: the BeginTime it reads now
        may be the floor already set), else :func:`commands.relaunch_floor` of its BeginTime
        (``eligible_time``: ``start_time`` may be the backfill scheduler's estimate), or the
        kill's second itself where the run goes to other nodes than the one requeued under it
        (:func:`_left_elsewhere`). Slurm reports ``start_time`` 0 for a held job whose
        BeginTime has passed: no floor."""
        if step.resubmitted or step.slurm_restart_count == 0:
            return 0.0
        previous = self._assignment(step.action.sia_id)
        run = (step.slurm_job_id, step.slurm_restart_count)
        same_run = previous is not None and (
            (previous.slurm_job_id, previous.slurm_restart_count) == run
        )
        if previous is not None and same_run and previous.not_before > 0:
            return previous.not_before
        if step.begin_time <= 0:
            return 0.0
        if _left_elsewhere(previous, step):
            return commands.kill_second(step.begin_time, self.calls.cred_expire())
        return commands.relaunch_floor(step.begin_time, self.calls.cred_expire())

    def _bring_forward(
        self,
        action: PlacedAction,
        job: SlurmJob,
        book: _Round,
        assignment: Assignment | None = None,
    ) -> None:
        """Cut Slurm's requeue delay (BeginTime = kill + cred_expire + 1) of a pending job to
        its run's floor (``assignment.not_before``), before its release or, for a start that
        a crash interrupted after the release, again on the replay. Slurm keeps a StartTime
        set on a held job through the release (verified on 22.05.8). A job already due (or
        running) needs nothing; a refusal only leaves it at Slurm's own BeginTime."""
        assignment = assignment or self._assignment(action.sia_id)
        if assignment is None or assignment.not_before <= 0 or job.state != "PENDING":
            return
        if (assignment.slurm_job_id, assignment.slurm_restart_count) != (
            job.job_id,
            job.restart_count,
        ):
            return
        if job.start_time == 0 or job.eligible_time <= assignment.not_before:
            return  # due already, or brought forward before
        try:
            self.calls.run(commands.start_at(job.job_id, assignment.not_before))
        except CommandError as exc:
            book.note(action, "start_time", f"not brought forward: {exc}")

    def _prepare(self, action: PlacedAction, managed: ManagedJob) -> _Placement | None:
        """Check the action and bring the job to a held PENDING state; ``None`` if it is
        already started for this round."""
        shape = self._shape(action)
        assignment = Assignment(
            sia_id=action.sia_id,
            round_index=action.round_index,
            gpu_type=action.config.gpu_type,
            partition=shape.partition,
            nodes=shape.nodes,
            gpus=action.config.gpus,
            node_list=shape.node_list,
            batch_size=action.batch.batch_size,
            local_bsz=action.batch.local_bsz,
            accum_steps=action.batch.accum_steps,
            profile_sweep=action.profile_sweep,
            version=self._protocol_of(managed),
        )
        if self._already_placed(action, managed):
            return None
        job = managed.current
        if job.holds_gpus:
            raise ActuationError(
                f"Slurm job {job.job_id} is {job.state}: a start needs a stopped job"
            )
        if job.finished:
            if not self.paths.stop_request(action.sia_id).exists():
                raise ActuationError(f"Slurm job {job.job_id} has ended ({job.state})")
            if self.waits.ended_unasked(action.sia_id, job):
                raise ActuationError(
                    f"Slurm job {job.job_id} ended {job.state} by itself before it could be "
                    "stopped: "
                    + (
                        "its training is complete"
                        if job.state == "COMPLETED"
                        else "not requeued; the failed-run rules decide whether it comes back"
                    )
                )
            self.calls.run(commands.requeue_hold([job.job_id]))
            if self.waits.until_pending([job.job_id]):
                raise ActuationError(f"Slurm job {job.job_id} did not return to PENDING")
            requeued = self.observe().managed.get(action.sia_id)
            if requeued is None or requeued.current.job_id != job.job_id:
                raise ActuationError(f"Slurm job {job.job_id} vanished after its requeue")
            managed, job = requeued, requeued.current  # under the requeue's (user) hold
        if not under_controller_hold(job):
            self.calls.run(commands.hold([job.job_id]))  # the controller's hold, not the user's
        return _Placement(
            action,
            shape,
            assignment,
            managed,
            job.job_id,
            managed.restarts,
            job.restart_count,
            job.eligible_time if job.start_time > 0 else 0.0,
        )

    def _reshape(self, steps: list[_Placement], book: _Round) -> None:
        """Update each job to its shape (or resubmit it), then read all back at once: an
        update that exits 0 may not have taken."""
        for step in steps:
            job = step.job.current
            try:
                if must_resubmit(job, step.shape, self.resubmit_shrinks):
                    self._resubmit(step)
                else:
                    self.calls.run(
                        commands.reshape(step.slurm_job_id, step.shape, job.cpus_per_task)
                    )
            except (ActuationError, ResubmissionError, CommandError, ValueError) as exc:
                book.fail(step.action, str(exc))
        to_check = [s for s in steps if not book.done(s.action)]
        if not to_check:
            return
        jobs = {job.job_id: job for job in self.observe().jobs}
        for step in to_check:
            job = jobs.get(step.slurm_job_id)
            if job is None:
                book.fail(step.action, f"Slurm job {step.slurm_job_id} vanished")
                continue
            differences = step.shape.matches(job)
            if differences:
                book.fail(
                    step.action,
                    f"scontrol update of Slurm job {job.job_id} exited 0 but did not take: "
                    + "; ".join(differences),
                )

    def _resubmit(self, step: _Placement) -> None:
        """Shrink by resubmission (:mod:`sia_slurm.slurm.actuate.resubmit`); the step goes on with
        the new Slurm job, whose restart count starts again at 0."""
        step.slurm_job_id = resubmit(self.calls, self.paths, step.job, step.shape)
        step.restarts = step.job.restarts
        step.slurm_restart_count = 0
        step.resubmitted = True

    # ------------------------------------------------------------------------------------------
    # Rebatch

    def _rebatch(self, action: Rebatch, view: JobsView, book: _Round) -> None:
        managed = self._managed(action, view, book)
        if managed is None:
            return
        path = self.paths.assignment(action.sia_id)
        try:
            current = read_document(Assignment, path) if path.exists() else None
        except ProtocolError as exc:
            book.fail(action, f"cannot read the current assignment: {exc}")
            return
        outcome = rebatch(current, action, managed.current)
        if outcome.assignment is not None:
            write_document(path, outcome.assignment)
            self.documents.forget(path)
        (book.ok if outcome.ok else book.fail)(action, outcome.message)

    # ------------------------------------------------------------------------------------------
    # Helpers

    def _protocol_of(self, managed: ManagedJob) -> int:
        """The protocol the job's side speaks, as its ``spec.json`` says (read through the door,
        cached by the snapshot that read it): what its assignment and stop request are written
        in, so a job submitted before an upgrade is told what its launcher can read
        (docs/protocol.md, "Between releases"). A spec that cannot be read now says nothing:
        the current protocol (the snapshot quarantined such a job already)."""
        try:
            with JobDirectory(self.paths.jobs_dir, managed.sia_id, managed.user_id) as directory:
                spec = self.documents.read_spec(directory)
        except (OSError, ProtocolError):
            return PROTOCOL_VERSION
        return PROTOCOL_VERSION if spec is None else spec.version

    def _managed(self, action: Action, view: JobsView, book: _Round) -> ManagedJob | None:
        managed = view.managed.get(action.sia_id)
        if managed is None:
            book.fail(action, "no Slurm job carries this sia id (finished and forgotten?)")
            return None
        assignment = self._assignment(action.sia_id)
        if assignment is not None and assignment.round_index > action.round_index:
            book.fail(action, f"superseded by the assignment of round {assignment.round_index}")
            return None
        return managed

    def _assignment(self, sia_id: str) -> Assignment | None:
        path = self.paths.assignment(sia_id)
        try:
            return read_document(Assignment, path) if path.exists() else None
        except ProtocolError:
            return None

    def _already_placed(self, action: PlacedAction, managed: ManagedJob) -> bool:
        """This round's assignment is written and the job runs (or waits released) with it."""
        assignment = self._assignment(action.sia_id)
        job = managed.current
        return (
            assignment is not None
            and assignment.round_index == action.round_index
            and assignment.slurm_job_id == job.job_id
            and (job.holds_gpus or (job.state == "PENDING" and not job.held))
        )

    def _shape(self, action: PlacedAction) -> Shape:
        config = action.config
        try:
            partition = self.config.partition_of(config.gpu_type).name
        except KeyError:
            raise ActuationError(
                f"GPU type {config.gpu_type!r} has no configured partition"
            ) from None
        per_node = config.gpus // config.nodes
        shares = action.placement
        if len(shares) != config.nodes or any(s.gpus != per_node for s in shares):
            raise ActuationError(
                f"placement {[(s.node, s.gpus) for s in shares]} is not {config.nodes} node(s) "
                f"x {per_node} GPUs ({config})"
            )
        return Shape(partition, config.nodes, per_node, tuple(s.node for s in shares))

    def _clean_stop_files(self, action: Action) -> None:
        """Withdraw the stop request (the controller's file; the job's ack stays: it is the
        user's, and it answers one round only)."""
        self.paths.stop_request(action.sia_id).unlink(missing_ok=True)

    def _cancel_strays(self, view: JobsView) -> None:
        strays = [job.job_id for job in view.strays]
        if strays:
            logger.info("cancelling leftovers of interrupted resubmissions: %s", strays)
            self.calls.run_quiet(commands.cancel(strays))
