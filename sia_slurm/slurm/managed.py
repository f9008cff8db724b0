"""Which Slurm jobs are managed, which one is current per sia id, and what phase it is in.

Pure functions over parsed Slurm jobs and the job files, shared by observation (snapshot) and
actuation (apply), so both agree on what a job is.

A managed job carries the Slurm comment ``<managed_marker>:<sia_id>`` exactly. Normally one
Slurm job carries a sia id; after a resubmission (``docs/slurm-actuation.md``) the old and the
new job may briefly both exist. The *current* one is then the job named by the backend's
``slurm.json`` record; without a record, the oldest live job (a newer one can only be an
orphan of a resubmission interrupted before it was recorded). Every other live job of the sia
id is a *stray*: it holds no GPUs (it was submitted held) and the next ``apply`` cancels it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sia_slurm.cluster import JobPhase
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import SIA_ID
from sia_slurm.slurm.jobfiles import SlurmRecord
from sia_slurm.slurm.jsonparse import FINISHED_STATES, SlurmJob

# Slurm states that end a job badly (COMPLETED is the good one).
_FAILED_STATES = FINISHED_STATES - {"COMPLETED"}


@dataclass(frozen=True)
class ManagedJob:
    """The Slurm side of one sia job this round."""

    sia_id: str
    current: SlurmJob
    strays: tuple[SlurmJob, ...] = ()
    record: SlurmRecord | None = None

    @property
    def restarts(self) -> int:
        """Restarts over the job's whole life: Slurm's count of the current job, plus those
        of the jobs it replaced (recorded at resubmission)."""
        base = 0
        if self.record is not None and self.record.slurm_job_id == self.current.job_id:
            base = self.record.restart_base
        return base + self.current.restart_count


def sia_id_of(comment: str, marker: str) -> str | None:
    """The sia id in a managed job's comment, ``None`` for any other comment."""
    prefix = f"{marker}:"
    if not comment.startswith(prefix):
        return None
    sia_id = comment[len(prefix) :]
    return sia_id if SIA_ID.match(sia_id) else None


def group_managed(jobs: tuple[SlurmJob, ...], marker: str) -> dict[str, list[SlurmJob]]:
    """Managed Slurm jobs by sia id, in job id order."""
    groups: dict[str, list[SlurmJob]] = {}
    for job in sorted(jobs, key=_id_key):
        sia_id = sia_id_of(job.comment, marker)
        if sia_id is not None:
            groups.setdefault(sia_id, []).append(job)
    return groups


def resolve(sia_id: str, jobs: list[SlurmJob], record: SlurmRecord | None) -> ManagedJob | None:
    """Pick the current Slurm job of ``sia_id`` (see the module docstring); ``None`` if none
    is left (every job it had was superseded)."""
    superseded = set(record.superseded) if record else set()
    current = None
    if record is not None:
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
    return ManagedJob(sia_id, current, strays, record)


def job_phase(
    job: SlurmJob,
    *,
    has_assignment: bool,
    stop_requested: bool,
    acked: bool,
    latest_report: float | None,
) -> tuple[JobPhase, str]:
    """The :class:`JobPhase` of a managed job and a short reason, from Slurm and the files.

    * pending (held or not) -> PENDING; so is a job whose GPUs are being taken back (completing
      while held) or one that finished after the controller asked it to stop (it waits to be
      requeued: the job side exits on its own after a linger limit);
    * running with an assignment but no metrics report since its latest start -> STARTING
      (restoring its checkpoint); running and reporting, or running without an assignment
      (not started by sia-slurm) -> RUNNING;
    * COMPLETED -> DONE; any other end (failed, cancelled, timeout...) -> FAILED.

    ``acked`` means the job acknowledged the pending stop request (``ack-<its round>``). A job
    that ended *without* acknowledging it did not stop for the controller: one that exited 0
    finished its training in the moment between the request and its next look at the control
    files, and is DONE (requeueing it would run a finished job a second time).
    """
    if job.state == "PENDING":
        held = "held" if job.held else "released"
        return JobPhase.PENDING, f"pending ({held}, reason {job.reason})"
    if job.completing and (job.held or stop_requested):
        return JobPhase.PENDING, "stopping: Slurm is taking its GPUs back"
    if job.holds_gpus:
        if has_assignment and (latest_report is None or latest_report < job.start_time):
            return JobPhase.STARTING, "started; no metrics report since its latest start"
        return JobPhase.RUNNING, "running"
    if job.state == "COMPLETED" and stop_requested and acked:
        return JobPhase.PENDING, "stopped for a move; exited before it was requeued"
    if job.state in _FAILED_STATES and stop_requested and acked:
        return JobPhase.PENDING, f"stopped after its checkpoint, then ended {job.state}"
    if job.state == "COMPLETED":
        return JobPhase.DONE, "completed before it was stopped" if stop_requested else "completed"
    return JobPhase.FAILED, f"ended {job.state} (reason {job.reason})"


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
