"""``SlurmBackend``: the cluster interface on a real Slurm, through its command-line tools.

``snapshot()`` issues three commands whatever the cluster size (``scontrol -d -o show node``,
``scontrol -o show reservation``, ``squeue --json``) and reads the job files under
``state_dir`` (the users' through :mod:`sia_slurm.userfiles` only); ``apply(actions)`` first
enforces the controller's grants (:class:`Enforcement`: a managed job runs only as assigned,
waits only under the controller's hold), then carries out the controller's actions with
``scontrol``, ``scancel`` and ``sbatch`` (:mod:`sia_slurm.slurm.actuate.actuator`). Everything
Slurm-specific that was verified on the real daemons is in ``docs/slurm-actuation.md``; the
threat model in ``docs/security.md``.

A failed observation raises :class:`~sia_slurm.slurm.runner.CommandError` (the round cannot
be decided without it); a bad job file never does: it is skipped and reported in
``ClusterSnapshot.rejected``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from sia_slurm.clock import Clock, WallClock
from sia_slurm.cluster import (
    Action,
    ActionResult,
    BatchChoice,
    ClusterSnapshot,
    JobPhase,
    JobSnapshot,
)
from sia_slurm.config import SiaConfig
from sia_slurm.core import Configuration, NodeShare
from sia_slurm.protocol import (
    PROFILED_FILE,
    Assignment,
    JobSpec,
    MetricsReport,
    ProtocolError,
    RunExit,
    RunRefusal,
    StatePaths,
    StopRequest,
    ack_name,
    exit_name,
    refusal_name,
)
from sia_slurm.slurm import commands
from sia_slurm.slurm.actuate.actuator import Actuator
from sia_slurm.slurm.actuate.enforce import Enforcement, enforce
from sia_slurm.slurm.observe.capacity import gpus_held, node_views, phantom_gpus, phantom_message
from sia_slurm.slurm.observe.inventory import parse_nodes
from sia_slurm.slurm.observe.jobfiles import (
    DocumentCache,
    LostSubmissions,
    MetricsInbox,
    RecordBook,
)
from sia_slurm.slurm.observe.jobs_view import JobsView, build_view
from sia_slurm.slurm.observe.jsonparse import SlurmJob, parse_reservations, parse_squeue_json
from sia_slurm.slurm.observe.managed import (
    FailedRun,
    ManagedJob,
    allocation_of,
    failed_run,
    job_phase,
    refused,
    unauthorized,
    under_controller_hold,
)
from sia_slurm.slurm.observe.sacct import AccountingReader, user_name
from sia_slurm.slurm.runner import CommandRunner, SubprocessRunner
from sia_slurm.userfiles import JobDirectory

logger = logging.getLogger(__name__)


# A released job Slurm has not started after this many rounds is pending again.
RELEASE_GRACE_ROUNDS = 3


class SlurmBackend:
    """:class:`~sia_slurm.cluster.ClusterBackend` for Slurm (22.05 and later)."""

    def __init__(
        self,
        config: SiaConfig,
        runner: CommandRunner,
        clock: Clock | None = None,
        *,
        resubmit_shrinks: bool = False,
    ) -> None:
        """``resubmit_shrinks``: shrink a job's node count by resubmitting it rather than by
        ``scontrol update`` (which works on 22.05 with ``NumCPUs``; the resubmission is the
        fallback for a job Slurm left in BadConstraints)."""
        self.config = config
        self.runner = runner
        self.clock = clock or WallClock()
        self.paths = StatePaths(config.state_dir)
        self.partition_types = {p.name: p.gpu_type for p in config.partitions}
        self.documents = DocumentCache()
        gpu_types = tuple(dict.fromkeys(p.gpu_type for p in config.partitions))
        self.inbox = MetricsInbox(gpu_types)
        self.lost = LostSubmissions(self.paths.jobs_dir)
        self.records = RecordBook(self.paths.control_dir)
        self.enforcement = Enforcement()  # from the latest snapshot, for the next apply
        self._reported: set[str] = set()  # job-file problems already reported once
        self.accounting = AccountingReader(runner)  # associations and QOS (issue 20)
        self.actuator = Actuator(
            config=config,
            runner=runner,
            clock=self.clock,
            paths=self.paths,
            documents=self.documents,
            observe=self.observe_jobs,
            resubmit_shrinks=resubmit_shrinks,
        )

    def describe(self) -> list[str]:
        """What the controller says about this Slurm when its loop starts: the release, then
        any warning about its settings (:mod:`sia_slurm.slurm.slurm_conf`)."""
        settings = self.actuator.calls.settings()
        return [
            f"Slurm {settings.version or '(version not shown)'}",
            *settings.warnings(self.config.round_seconds),
        ]

    # ------------------------------------------------------------------------------------------
    # Observe

    def observe_jobs(self) -> JobsView:
        """One ``squeue --json``: every job Slurm knows, managed ones resolved per sia id."""
        result = parse_squeue_json(self.runner.run(list(commands.SQUEUE_JSON)).stdout)
        return build_view(self, result.jobs, list(result.problems))

    def snapshot(self) -> ClusterSnapshot:
        now = self.clock.now()
        nodes = parse_nodes(self.runner.run(list(commands.SHOW_NODES)).stdout)
        reservations = parse_reservations(self.runner.run(list(commands.SHOW_RESERVATIONS)).stdout)
        view = self.observe_jobs()
        rejected: list[str] = list(view.identity)
        enforcement = Enforcement()
        jobs: list[JobSnapshot] = []
        reports: list[MetricsReport] = []
        current_ids: set[str] = set()
        quarantined: dict[str, str] = {}
        for sia_id, managed in view.managed.items():
            if managed.first_sight:
                enforcement.new_records[sia_id] = managed
            try:
                observed = self._observe_job(managed, enforcement, rejected, quarantined)
            except Exception as exc:  # one job's files: that job's failure alone
                why = f"{type(exc).__name__}: {exc}"
                logger.debug("job %s: reading it raised", sia_id, exc_info=True)
                rejected.append(f"job {sia_id}: not scheduled: {why}")
                quarantined[sia_id] = why
                observed = None
            if observed is None:
                continue
            snapshot, report = observed
            jobs.append(snapshot)
            if report is not None:
                reports.append(report)
            if sia_id not in enforcement.requeue:
                current_ids.add(managed.current.job_id)
        self.inbox.keep_only(view.managed)
        self.enforcement = enforcement
        reserved = {node for r in reservations if r.active for node in r.nodes}
        unmanaged = [job for job in view.jobs if job.job_id not in current_ids]
        phantom = phantom_gpus(nodes, gpus_held(view.jobs))
        rejected += [phantom_message(node, *counts) for node, counts in phantom.items()]
        rejected += self.lost.scan(set(view.known_ids), time.time(), self._lost_after_s)
        return ClusterSnapshot(
            time=now,
            nodes=node_views(nodes, self.partition_types, reserved, unmanaged, phantom),
            jobs=tuple(jobs),
            reports=tuple(reports),
            rejected=tuple(self._once(rejected)),
            site=self.accounting.read(now),
            quarantined=quarantined,
        )

    def _observe_job(
        self,
        managed: ManagedJob,
        enforcement: Enforcement,
        rejected: list[str],
        quarantined: dict[str, str],
    ) -> tuple[JobSnapshot, MetricsReport | None] | None:
        """The job as the controller sees it, and its new metrics report; ``None`` when it
        cannot be scheduled (said in ``rejected`` and ``quarantined``, unless it is finished:
        its GPUs then count as taken, as an unmanaged job's)."""
        job, sia_id = managed.current, managed.sia_id
        assignment = self._read_own(
            Assignment, self.paths.assignment(sia_id), "assignment", rejected
        )
        stop = self._read_own(
            StopRequest, self.paths.stop_request(sia_id), "stop request", rejected
        )
        try:
            with JobDirectory(self.paths.jobs_dir, sia_id, managed.user_id) as directory:
                spec = self.documents.read_spec(directory)
                if spec is None:
                    raise ProtocolError(f"{directory.where('spec.json')}: does not exist")
                if spec.sia_id != sia_id:
                    raise ProtocolError(
                        f"{directory.where('spec.json')}: sia_id is {spec.sia_id!r}"
                    )
                profile = self.documents.read_profile(directory)
                profiled = self._profiled(directory)
                report, reported = self.inbox.read(
                    sia_id, directory, managed.run, rejected, managed.current.nodes
                )
                acked = stop is not None and directory.has_own_file(
                    ack_name(stop.round_index, job.job_id, job.restart_count)
                )
                failure = self._failure(managed, spec, directory, stop is not None and acked)
                refusal = self._refusal(managed, assignment, directory, rejected)
        except ProtocolError as exc:
            if not job.finished:
                rejected.append(f"job {sia_id}: not scheduled: {exc}")
                quarantined[sia_id] = str(exc)
            return None
        # Identity and age come from Slurm (the record), never from the user's file.
        spec = replace(spec, submit_time=managed.record.submit_time, owner_uid=managed.user_id)
        reason = unauthorized(job, assignment, self.partition_types)
        if reason is not None or refusal is not None:
            enforcement.requeue[sia_id] = (managed, reason or refusal or "")
            message = f"runs on GPUs the controller did not grant ({reason}); being requeued"
            if reason is None:
                message = f"not running as granted: {refusal}; being requeued"
            job_view = self._job(
                managed,
                spec,
                JobPhase.PENDING,
                message,
                assignment,
                profile=profile,
                profiled=profiled,
            )
            return job_view, None
        if job.completing and not _granted_run(job, assignment):
            # Requeued by someone else (its user, Slurm): back to PENDING once Slurm has its
            # GPUs back, so it must not be kept where it was as if it ran there.
            message = "requeued outside the controller; Slurm is taking its GPUs back"
            job_view = self._job(
                managed,
                spec,
                JobPhase.PENDING,
                message,
                assignment,
                profile=profile,
                profiled=profiled,
            )
            return job_view, None
        phase, message = job_phase(
            job,
            has_assignment=assignment is not None,
            stop_requested=stop is not None,
            # The ack answers the stop request's round (not the assignment's, which is older).
            acked=acked,
            reported=reported,
        )
        if failure is not None:
            phase = JobPhase.PENDING if failure.again else JobPhase.FAILED
            message = failure.message
            if failure.again:
                enforcement.revive[sia_id] = (managed, failure)
        released, differs = self._released_to(job, assignment, phase, stop is not None)
        if job.state == "PENDING" and self._needs_hold(job, released):
            why = "released without a grant" if not job.held else f"held by its user ({job.reason})"
            if differs:
                why = f"released, but its request is not its assignment ({differs})"
            enforcement.hold[sia_id] = (managed, why)
        config, placement = None, ()
        if released:
            assert assignment is not None
            per_node = assignment.gpus_per_node
            config = Configuration(assignment.gpu_type, assignment.nodes, assignment.gpus)
            placement = tuple(NodeShare(node, per_node) for node in assignment.node_list)
            phase = JobPhase.STARTING
            message = f"released with its assignment; Slurm starting it (reason {job.reason})"
        elif phase.holds_gpus:
            allocation = allocation_of(job, self.partition_types)
            if allocation is None:
                rejected.append(
                    f"job {sia_id}: not scheduled: Slurm job {job.job_id} runs in partition "
                    f"{job.partition!r}, which maps to no configured GPU type; its GPUs count "
                    "as unmanaged"
                )
                return None
            config, placement = allocation
        snapshot = self._job(
            managed,
            spec,
            phase,
            message,
            assignment,
            config,
            placement,
            profile=profile,
            profiled=profiled,
        )
        return snapshot, report

    def _job(
        self,
        managed: ManagedJob,
        spec: JobSpec,
        phase: JobPhase,
        message: str,
        assignment: Assignment | None,
        config: Configuration | None = None,
        placement: tuple[NodeShare, ...] = (),
        *,
        profile: Mapping[str, Any] | None = None,
        profiled: tuple[Mapping[str, Any] | None, str, str] = (None, "", ""),
    ) -> JobSnapshot:
        job = managed.current
        return JobSnapshot(
            spec=spec,
            phase=phase,
            config=config,
            placement=placement,
            batch=_batch_of(assignment) if assignment is not None else None,
            restarts=managed.restarts,
            finish_time=job.end_time if phase.finished else None,
            slurm_job_id=job.job_id,
            message=message,
            user=user_name(job.user_id),
            account=job.account,
            qos=job.qos,
            profile_document=profile,
            profiled_document=profiled[0],
            profiled_version=profiled[1],
            profiled_problem=profiled[2],
        )

    def _profiled(self, directory: JobDirectory) -> tuple[dict[str, Any] | None, str, str]:
        """The job's ``profiled.json``, which write of it that is, and why it could not be
        read (``""``): a bad one is the profiling's to refuse (docs/profiling.md), not a
        reason to leave the job out."""
        try:
            return (*self.documents.read_profiled(directory), "")
        except ProtocolError as exc:
            info = directory.stat(PROFILED_FILE)
            version = "" if info is None else f"{info.st_mtime_ns}-{info.st_size}-{info.st_ino}"
            return None, version, str(exc)

    def _failure(
        self, managed: ManagedJob, spec: JobSpec, directory: JobDirectory, stopped: bool
    ) -> FailedRun | None:
        """The current run's failure, if it ended badly other than by stopping for the
        controller (a stopped run that then ended is :func:`job_phase`'s to read)."""
        job = managed.current
        if stopped or not job.finished or job.state == "COMPLETED":
            return None
        try:
            exit_record = directory.read_document(RunExit, exit_name(job.job_id, job.restart_count))
        except ProtocolError as exc:
            logger.warning("job %s: %s; read as no exit record", managed.sia_id, exc)
            exit_record = None
        return failed_run(
            job,
            managed.record,
            exit_record,
            max_failures=spec.max_failures,
            max_slurm_failures=self.config.restart.max_slurm_failures,
        )

    def _refusal(
        self,
        managed: ManagedJob,
        assignment: Assignment | None,
        directory: JobDirectory,
        rejected: list[str],
    ) -> str | None:
        """Why the current run's launcher refused to train in it (:func:`refused`), if Slurm
        runs it as granted; a record that is malformed or names another run is ignored, and
        said once in ``rejected``."""
        job = managed.current
        if job.state != "RUNNING" or not _granted_run(job, assignment):
            return None
        name = refusal_name(job.job_id, job.restart_count)
        try:
            refusal = directory.read_document(RunRefusal, name)
            return None if refusal is None else refused(job, assignment, refusal)
        except ProtocolError as exc:
            where = directory.where(name)
            said = str(exc) if str(exc).startswith(where) else f"{where}: {exc}"
            rejected.append(f"job {managed.sia_id}: launcher's refusal ignored: {said}")
            return None

    def _read_own(
        self, cls: type[Assignment] | type[StopRequest], path: Path, what: str, rejected: list[str]
    ) -> Assignment | StopRequest | None:
        """One of the controller's own files (``control/``); a bad one is ignored and said."""
        try:
            return self.documents.read(cls, path)  # type: ignore[return-value]
        except ProtocolError as exc:
            rejected.append(f"job {path.parent.name}: {what} ignored: {exc}")
            return None

    def _released_to(
        self, job: SlurmJob, assignment: Assignment | None, phase: JobPhase, stopping: bool
    ) -> tuple[bool, str]:
        """Whether a pending job was just released by the controller, for this Slurm run
        (and if not only because Slurm's request differs from the assignment: how).

        Slurm starts a released job a few seconds later; until then it reads PENDING. Reporting
        it as STARTING (on its assigned nodes) keeps the controller from deciding it afresh
        every round. An assignment older than ``RELEASE_GRACE_ROUNDS`` rounds no longer counts:
        a job Slurm has not started by then is held again and decided anew, so it can never
        start later on GPUs the plan has since given to another job.
        """
        if phase is not JobPhase.PENDING or job.state != "PENDING" or job.held or stopping:
            return False, ""
        if assignment is None or len(assignment.node_list) != assignment.nodes:
            return False, ""
        if not _granted_run(job, assignment):
            return False, ""
        shape = commands.Shape(
            assignment.partition, assignment.nodes, assignment.gpus_per_node, assignment.node_list
        )
        differences = shape.matches(job)
        if differences:
            # Not what the controller released (an update lost in a slurmctld restart, or
            # changed by someone else): held again and decided anew, which updates every field.
            return False, "; ".join(differences)
        try:
            written = os.stat(self.paths.assignment(assignment.sia_id)).st_mtime
        except OSError:
            return False, ""
        age = time.time() - written  # the controller's own clock on both sides
        return age < RELEASE_GRACE_ROUNDS * self.config.round_seconds, ""

    @staticmethod
    def _needs_hold(job: SlurmJob, released: bool) -> bool:
        """A pending managed job waits under the controller's hold, unless the controller has
        just released it: a job released by anyone else (its user, Slurm's own requeue) or
        held by its user (who could release it) is held by the controller."""
        return not released and not under_controller_hold(job)

    @property
    def _lost_after_s(self) -> float:
        """How old a spec must be, its Slurm job unseen, to be a lost submission: sia-sbatch
        writes it just before sbatch, and a pending job shows in squeue at once."""
        return max(3 * self.config.round_seconds, 30.0)

    def _once(self, messages: list[str]) -> list[str]:
        """Messages not reported in an earlier round (a bad file stays bad for a while)."""
        fresh = [m for m in dict.fromkeys(messages) if m not in self._reported]
        for message in fresh:
            logger.warning("%s", message)
        self._reported = set(messages) | (self._reported & set(messages))
        return fresh

    # ------------------------------------------------------------------------------------------
    # Actuate

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        """Enforce the grants the last snapshot found broken, then carry out ``actions``
        (each idempotent; see :mod:`sia_slurm.slurm.actuate.actuator`). Called every round, with no
        actions too, so enforcement never waits for a decision."""
        enforcement, self.enforcement = self.enforcement, Enforcement()
        self._persist_records(enforcement)
        self._count_failures(enforcement)
        enforce(self.actuator.calls, enforcement)
        return self.actuator.apply(actions)

    def _count_failures(self, enforcement: Enforcement) -> None:
        """Record each failed run before it is brought back, so a budget is spent once per
        run whatever happens after (a crash, a requeue that fails and is tried again)."""
        for sia_id, (managed, failure) in list(enforcement.revive.items()):
            record = managed.record.with_failure(failure.run, failure.users_fault)
            if record == managed.record:
                continue
            try:
                record.write(self.paths.slurm_record(sia_id))
            except OSError as exc:
                logger.error("job %s: cannot record its failed run (%s); not brought back "
                             "this round", sia_id, exc)  # fmt: skip
                del enforcement.revive[sia_id]

    def _persist_records(self, enforcement: Enforcement) -> None:
        for sia_id, managed in enforcement.new_records.items():
            path = self.paths.slurm_record(sia_id)
            if path.exists():
                continue  # written meanwhile (by a resubmission): that one is newer
            managed.record.write(path)
            logger.info(
                "job %s: first seen as Slurm job %s of uid %d",
                sia_id,
                managed.record.slurm_job_id,
                managed.user_id,
            )


def build_backend(
    config: SiaConfig, runner: CommandRunner | None = None, clock: Clock | None = None
) -> SlurmBackend:
    """The backend the config names (``slurm.backend``), with Slurm's commands found in
    ``slurm.bin_dir`` (or on PATH). pyslurm is imported only when chosen."""
    if runner is None:
        bin_dir = Path(config.slurm.bin_dir) if config.slurm.bin_dir else None
        runner = SubprocessRunner(bin_dir=bin_dir)
    if config.slurm.backend == "pyslurm":
        from sia_slurm.slurm.pyslurm_backend import PyslurmBackend

        return PyslurmBackend(config, runner, clock)
    return SlurmBackend(config, runner, clock)


def _granted_run(job: SlurmJob, assignment: Assignment | None) -> bool:
    """Whether ``assignment`` was written for ``job``'s current Slurm run."""
    if assignment is None:
        return False
    return (assignment.slurm_job_id, assignment.slurm_restart_count) == (
        job.job_id,
        job.restart_count,
    )


def _batch_of(assignment: Assignment) -> BatchChoice:
    return BatchChoice(assignment.batch_size, assignment.local_bsz, assignment.accum_steps)
