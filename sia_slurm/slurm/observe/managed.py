"""Which Slurm jobs are managed, which one is current per sia id, and what phase it is in.

Pure functions over parsed Slurm jobs and the job files, shared by observation (snapshot) and
actuation (apply), so both agree on what a job is.

A Slurm job is managed when it carries the comment ``<managed_marker>:<sia_id>`` and belongs
to the job's user, or when the controller's record names it (a user who rewrites the comment
of a running job does not make it unmanaged). The job's user is fixed at first sight: the
Slurm user id of its oldest Slurm job whose user also owns ``jobs/<sia_id>/`` (a job of another
user that copies the comment is *foreign*: not managed, its GPUs count as taken).

Normally one Slurm job carries a sia id; after a resubmission (``docs/slurm-actuation.md``)
the old and the new job may briefly both exist. The *current* one is then the job named by the
controller's ``slurm.json`` record; failing that, the oldest live job (a newer one can only be
an orphan of a resubmission interrupted before it was recorded). Every other live job of the
sia id is a *stray*: it holds no GPUs (it was submitted held) and the next ``apply`` cancels it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sia_slurm.cluster import JobPhase
from sia_slurm.core import Configuration, NodeShare
from sia_slurm.protocol import SIA_ID, Assignment, ExitCause, ProtocolError, RunExit, RunRefusal
from sia_slurm.slurm.observe.jobfiles import RunId, SlurmRecord
from sia_slurm.slurm.observe.jsonparse import FINISHED_STATES, SlurmJob

# Hold reasons a job's own user can release (``scontrol release`` as the user), whoever set
# the hold: a requeuehold is one too (``docs/slurm-actuation.md``, "Privileges").
USER_HOLD_REASONS = frozenset({"JobHeldUser"})

# Slurm states that end a job badly (COMPLETED is the good one).
_FAILED_STATES = FINISHED_STATES - {"COMPLETED"}
# Ends someone chose (a cancel, the job's time limit or deadline): never brought back.
INTENDED_ENDS = frozenset({"CANCELLED", "TIMEOUT", "DEADLINE"})
# Ends that are the job's own doing whatever its launcher recorded.
OWN_ENDS = frozenset({"OUT_OF_MEMORY"})


@dataclass(frozen=True)
class ManagedJob:
    """The Slurm side of one sia job this round."""

    sia_id: str
    current: SlurmJob
    record: SlurmRecord
    strays: tuple[SlurmJob, ...] = ()
    first_sight: bool = False  # ``record`` is new: the controller persists it when it acts

    @property
    def user_id(self) -> int:
        return self.record.user_id

    @property
    def run(self) -> RunId:
        """The current Slurm run (job id and Slurm's restart count)."""
        return RunId(self.current.job_id, self.current.restart_count)

    @property
    def restarts(self) -> int:
        """Restarts over the job's whole life: Slurm's count of the current job, plus those
        of the jobs it replaced (recorded at resubmission)."""
        base = 0
        if self.record.slurm_job_id == self.current.job_id:
            base = self.record.restart_base
        return base + self.current.restart_count


def sia_id_of(comment: str, marker: str) -> str | None:
    """The sia id in a managed job's comment, ``None`` for any other comment."""
    prefix = f"{marker}:"
    if not comment.startswith(prefix):
        return None
    sia_id = comment[len(prefix) :]
    return sia_id if SIA_ID.fullmatch(sia_id) else None


def group_managed(
    jobs: tuple[SlurmJob, ...], marker: str, known: Mapping[str, str] | None = None
) -> dict[str, list[SlurmJob]]:
    """Candidate managed Slurm jobs by sia id, in job id order: those whose comment carries
    the marker, and those ``known`` (Slurm job id -> sia id, from the controller's records)."""
    known = known or {}
    groups: dict[str, list[SlurmJob]] = {}
    for job in sorted(jobs, key=_id_key):
        sia_id = known.get(job.job_id) or sia_id_of(job.comment, marker)
        if sia_id is not None:
            groups.setdefault(sia_id, []).append(job)
    return groups


def first_record(jobs: list[SlurmJob], owner: int | None) -> SlurmRecord | None:
    """The record of a job seen for the first time: its oldest Slurm job of the user who owns
    its job directory (``owner``; ``None``: there is no such directory)."""
    if owner is None:
        return None
    mine = [j for j in jobs if j.user_id == owner]
    if not mine:
        return None
    first = next((j for j in mine if not j.finished), mine[0])
    return SlurmRecord(first.job_id, owner, first.submit_time, time_limit_min=first.time_limit_min)


def resolve(sia_id: str, jobs: list[SlurmJob], record: SlurmRecord) -> ManagedJob | None:
    """Pick the current Slurm job of ``sia_id`` among the jobs of the record's user (see the
    module docstring); ``None`` if none is left (every job it had was superseded)."""
    jobs = [j for j in jobs if j.user_id == record.user_id]
    superseded = set(record.superseded)
    current = next((j for j in jobs if j.job_id == record.slurm_job_id), None)
    if current is None:
        candidates = [j for j in jobs if j.job_id not in superseded]
        live = [j for j in candidates if not j.finished]
        if live:
            current = live[0]
        elif candidates:
            current = candidates[-1]
    if current is None:
        return None
    strays = tuple(j for j in jobs if j is not current and not j.finished)
    return ManagedJob(sia_id, current, record, strays)


def foreign_jobs(jobs: list[SlurmJob], record: SlurmRecord) -> list[SlurmJob]:
    """Live jobs that carry the sia id but belong to another user than the job's."""
    return [j for j in jobs if j.user_id != record.user_id and not j.finished]


def job_phase(
    job: SlurmJob,
    *,
    has_assignment: bool,
    stop_requested: bool,
    acked: bool,
    reported: bool,
) -> tuple[JobPhase, str]:
    """The :class:`JobPhase` of a managed job and a short reason, from Slurm and the files.

    * pending (held or not) -> PENDING; so is a job whose GPUs are being taken back (completing
      while held) or one that finished after the controller asked it to stop (it waits to be
      requeued: the job side exits on its own after a linger limit);
    * running with an assignment but no metrics report from this Slurm run (``reported``) ->
      STARTING (restoring its checkpoint); running and reporting -> RUNNING (a run without
      an assignment of its own never gets here: :func:`unauthorized` stops it first);
    * COMPLETED -> DONE; any other end (failed, cancelled, timeout...) -> FAILED.

    ``acked`` means this run acknowledged the pending stop request (``ack-<round>.<run>``). A
    job that ended *without* acknowledging it did not stop for the controller: one that exited 0
    finished its training in the moment between the request and its next look at the control
    files, and is DONE (requeueing it would run a finished job a second time).
    """
    if job.state == "PENDING":
        held = "held" if job.held else "released"
        return JobPhase.PENDING, f"pending ({held}, reason {job.reason})"
    if job.completing and (job.held or stop_requested):
        return JobPhase.PENDING, "stopping: Slurm is taking its GPUs back"
    if job.holds_gpus:
        if has_assignment and not reported:
            return JobPhase.STARTING, "started; no metrics report from this run yet"
        return JobPhase.RUNNING, "running"
    if job.state == "COMPLETED" and stop_requested and acked:
        return JobPhase.PENDING, "stopped for a move; exited before it was requeued"
    if job.state in _FAILED_STATES and stop_requested and acked:
        return JobPhase.PENDING, f"stopped after its checkpoint, then ended {job.state}"
    if job.state == "COMPLETED":
        return JobPhase.DONE, "completed before it was stopped" if stop_requested else "completed"
    return JobPhase.FAILED, f"ended {job.state} (reason {job.reason})"


@dataclass(frozen=True)
class FailedRun:
    """A run that Slurm reports ended badly, and what becomes of the job: brought back from
    its checkpoint (``again``) or ended FAILED. ``users_fault``: its own code failed (it spends
    the job's ``max_failures``), else Slurm or the controller ended it (``max_slurm_failures``)."""

    run: RunId
    users_fault: bool
    again: bool
    message: str


def failed_run(
    job: SlurmJob,
    record: SlurmRecord,
    exit_record: RunExit | None,
    *,
    max_failures: int,
    max_slurm_failures: int,
) -> FailedRun | None:
    """Who ended a finished run that did not complete, and whether the job comes back.

    ``None`` for a run that did not end badly, or that someone ended on purpose (cancelled,
    timed out: :data:`INTENDED_ENDS`), or that stopped for the controller (its launcher says
    so; :func:`job_phase` handles those). The run's own ``exit_record`` (written by its
    launcher as it exits, :class:`~sia_slurm.protocol.RunExit`) tells a job whose code failed
    from one Slurm ended: a run that left none, or one that says it was refused or signalled,
    did not fail by itself (a launch Slurm refused, a node that failed under it, a prolog, a
    batch step killed from outside). Each failed run is counted once, in ``record``.
    """
    if job.state not in _FAILED_STATES or job.state in INTENDED_ENDS:
        return None
    run = RunId(job.job_id, job.restart_count)
    mine = exit_record is not None and (
        (exit_record.slurm_job_id, exit_record.slurm_restart_count)
        == (job.job_id, job.restart_count)
    )
    cause = exit_record.exit_cause if mine and exit_record is not None else None
    if cause in (ExitCause.STOPPED, ExitCause.COMPLETED):
        return None
    users_fault = job.state in OWN_ENDS or (cause is not None and cause.users_fault)
    counted = record.with_failure(run, users_fault)
    where = f"Slurm job {job.job_id} run {job.restart_count}"
    if users_fault:
        used, budget = len(counted.failed_runs), max_failures
        said = exit_record.message if mine and exit_record is not None else ""
        what = f"its own code failed in {where} ({job.state}{': ' + said if said else ''})"
        limit = f"failure {used} of --max-failures {budget}"
    else:
        used, budget = len(counted.slurm_failed_runs), max_slurm_failures
        side = f"its launcher {cause.value}" if cause is not None else "no exit of its own"
        what = f"Slurm ended {where} {job.state} (reason {job.reason}; {side})"
        limit = f"Slurm failure {used} of restart.max_slurm_failures {budget}"
    if used <= budget:
        return FailedRun(run, users_fault, True, f"{what}; brought back from its checkpoint "
                         f"({limit})")  # fmt: skip
    return FailedRun(run, users_fault, False, f"{what}; ended FAILED ({limit})")


def under_controller_hold(job: SlurmJob) -> bool:
    """Whether a pending job is held so that its user cannot release it (an admin hold):
    the one state a managed job may wait in, unless the controller has just released it."""
    return job.held and job.reason not in USER_HOLD_REASONS


def unauthorized(
    job: SlurmJob, assignment: Assignment | None, partition_types: Mapping[str, str]
) -> str | None:
    """Why a managed job that runs does so on GPUs the controller did not grant it (``None``
    when it runs as assigned).

    The controller writes an assignment for exactly one Slurm run (job id and restart count)
    before it releases the job. A run without one was started by someone else: the user's own
    ``scontrol release`` or ``requeue``, Slurm's requeue after a node failure, an update of
    partition, GPUs or nodes after the controller's. Only RUNNING jobs are judged: a
    completing one is already giving its GPUs back.
    """
    if job.state != "RUNNING":
        return None
    if assignment is None:
        return "no assignment from the controller"
    run = (assignment.slurm_job_id, assignment.slurm_restart_count)
    if run != (job.job_id, job.restart_count):
        return (
            f"its assignment (round {assignment.round_index}) is for Slurm job "
            f"{assignment.slurm_job_id} run {assignment.slurm_restart_count}, this is job "
            f"{job.job_id} run {job.restart_count}"
        )
    problems = []
    if job.partition != assignment.partition:
        problems.append(f"partition {job.partition} (assigned {assignment.partition})")
    if len(job.nodes) != assignment.nodes:
        problems.append(f"{len(job.nodes)} node(s) (assigned {assignment.nodes})")
    elif assignment.node_list and set(job.nodes) != set(assignment.node_list):
        problems.append(f"nodes {','.join(job.nodes)} (assigned {','.join(assignment.node_list)})")
    gpus = [job.gpus_on(node) for node in job.nodes]
    if any(g != assignment.gpus_per_node for g in gpus):
        problems.append(f"GPUs per node {gpus} (assigned {assignment.gpus_per_node})")
    if (gpu_type := partition_types.get(job.partition)) and gpu_type != assignment.gpu_type:
        problems.append(f"GPU type {gpu_type} (assigned {assignment.gpu_type})")
    return "; ".join(problems) or None


def refused(job: SlurmJob, assignment: Assignment | None, refusal: RunRefusal) -> str | None:
    """Why a run that Slurm shows RUNNING as granted is not running as granted, by its
    launcher's ``refusal`` (``None``: the job is not such a run, nothing to judge).

    The launcher saw an allocation other than the one ``scontrol`` shows (a batch step started
    with ``SLURM_GPUS_ON_NODE=0`` after a slurmd restart), which :func:`unauthorized` cannot
    see. The record is the user's: it counts only for the run Slurm runs now under the
    assignment written for it (job id, restart count, nodes); one naming another run raises
    :class:`ProtocolError` saying so. At worst a user requeues their own job.
    """
    if job.state != "RUNNING" or assignment is None:
        return None
    if (assignment.slurm_job_id, assignment.slurm_restart_count) != (
        job.job_id,
        job.restart_count,
    ):
        return None
    named = (refusal.sia_id, refusal.slurm_job_id, refusal.slurm_restart_count)
    if named != (assignment.sia_id, job.job_id, job.restart_count) or sorted(
        refusal.node_list
    ) != sorted(job.nodes):
        raise ProtocolError(
            f"names job {refusal.sia_id} Slurm job {refusal.slurm_job_id} run "
            f"{refusal.slurm_restart_count} on {','.join(refusal.node_list) or '-'}, but "
            f"Slurm runs job {job.job_id} run {job.restart_count} on {','.join(job.nodes)}"
        )
    said = "".join(c if c.isprintable() else " " for c in refusal.message)
    said = " ".join(said.split())[:400]
    return (
        f"its launcher refused to train in Slurm job {job.job_id} run {job.restart_count} "
        f"(assignment of round {refusal.round_index}): {said or 'no reason given'}"
    )


def allocation_of(
    job: SlurmJob, partition_types: Mapping[str, str]
) -> tuple[Configuration, tuple[NodeShare, ...]] | None:
    """The configuration and node shares a job holds, ``None`` when it holds no GPUs of a
    configured type (not running, unknown partition, or no GPUs)."""
    gpu_type = partition_types.get(job.partition)
    if gpu_type is None or not job.holds_gpus or not job.nodes:
        return None
    shares = tuple(NodeShare(node, job.gpus_on(node)) for node in job.nodes)
    gpus = sum(share.gpus for share in shares)
    if any(share.gpus < 1 for share in shares):
        return None
    return Configuration(gpu_type, len(shares), gpus), shares


def _id_key(job: SlurmJob) -> tuple[int, str]:
    head = job.job_id.split("_")[0]
    return (int(head) if head.isdigit() else -1, job.job_id)
