"""Enforcement: what a snapshot found the controller did not grant, undone before it acts.

Every ``apply`` (every round, with or without actions) first

* requeues and holds a managed run that holds GPUs the controller did not grant it (its
  user's own release or requeue, Slurm's requeue, an update the controller did not make);
* holds a pending job that someone else released, or that only its user holds (a user can
  release their own hold; the controller's hold is an admin hold);
* brings back a run that failed without its own code failing, or within its
  ``--max-failures`` (:func:`sia_slurm.slurm.observe.managed.failed_run`): ``scontrol requeuehold``
  of the finished job, then ``scontrol hold``, after the failure is counted in the
  controller's record.

Each step is batched (one command for all jobs, then one per job only if that fails), and a
failure is logged and met again at the next snapshot: enforcement never raises.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from sia_slurm.slurm import commands
from sia_slurm.slurm.actuate.calls import SlurmCalls
from sia_slurm.slurm.observe.managed import FailedRun, ManagedJob

logger = logging.getLogger(__name__)


@dataclass
class Enforcement:
    """What the last snapshot saw that the controller did not grant, for ``apply`` to undo
    before it acts: runs to requeue and hold (by sia id, with the reason), pending jobs to
    put under the controller's hold, records seen for the first time, to persist, and failed
    runs to bring back (requeued and held, their failure counted in the record)."""

    requeue: dict[str, tuple[ManagedJob, str]] = field(default_factory=dict)
    hold: dict[str, tuple[ManagedJob, str]] = field(default_factory=dict)
    new_records: dict[str, ManagedJob] = field(default_factory=dict)
    revive: dict[str, tuple[ManagedJob, FailedRun]] = field(default_factory=dict)


def enforce(calls: SlurmCalls, enforcement: Enforcement) -> None:
    """Carry out ``enforcement`` (records are the backend's to persist first)."""
    if enforcement.revive:
        _revive(calls, enforcement.revive)
    for verb, build, jobs in (
        ("requeued and held", commands.requeue_hold, enforcement.requeue),
        ("held by the controller", commands.hold, enforcement.hold),
    ):
        if not jobs:
            continue
        ids = {managed.current.job_id: sia_id for sia_id, (managed, _) in jobs.items()}
        failures = calls.batched(build, list(ids))
        for job_id, sia_id in ids.items():
            reason = jobs[sia_id][1]
            if job_id in failures:
                logger.warning(
                    "[job=%s] Slurm job %s: %s, but it could not be %s: %s",
                    sia_id, job_id, reason, verb, failures[job_id],
                )  # fmt: skip
            else:
                # A user's hold (sia-sbatch submits with one) is routine; anything else
                # (a release, a run without a grant) is not.
                level = logging.INFO if jobs[sia_id][0].current.held else logging.WARNING
                logger.log(level, "[job=%s] Slurm job %s: %s: %s", sia_id, job_id, reason, verb)


def _revive(calls: SlurmCalls, revive: dict[str, tuple[ManagedJob, FailedRun]]) -> None:
    """Requeue finished runs (Slurm keeps a finished job for ``MinJobAge``, 300 s by
    default) and put them under the controller's hold at once: a finished job goes straight
    to PENDING, so its user has no window to release it."""
    ids = {managed.current.job_id: sia_id for sia_id, (managed, _) in revive.items()}
    failures = calls.batched(commands.requeue_hold, list(ids))
    failures.update(calls.batched(commands.hold, [j for j in ids if j not in failures]))
    for job_id, sia_id in ids.items():
        failure = revive[sia_id][1]
        if job_id in failures:
            logger.error("[job=%s] %s, but it could not be requeued: %s",
                         sia_id, failure.message, failures[job_id])  # fmt: skip
        else:
            logger.warning("[job=%s] %s", sia_id, failure.message)
