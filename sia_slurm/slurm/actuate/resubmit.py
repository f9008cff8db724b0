"""The resubmission fallback: shrink a job's node count under a new Slurm job id.

Slurm 22.05 may refuse to shrink the node count of a job that has run (it sits in
BadConstraints after the update). The job is then submitted again, held, in its new shape, with
the same comment (sia id) and batch script (``scontrol write batch_script``, kept as the
controller's private copy in ``control/<sia_id>/batch-script``); the new id is recorded in
``control/<sia_id>/slurm.json`` and the old job is cancelled. It works from a crash at any
point: the script copy stays, and an unrecorded new job is a stray that the next ``apply``
cancels. Only root may submit for another user (``sbatch --uid``), so a controller under its
service account fails such a shrink and says so (docs/slurm-actuation.md, "Privileges").
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from sia_slurm.protocol import StatePaths
from sia_slurm.safefiles import write_text_atomic
from sia_slurm.slurm import commands
from sia_slurm.slurm.actuate.calls import SlurmCalls
from sia_slurm.slurm.commands import Shape
from sia_slurm.slurm.observe.jsonparse import SlurmJob
from sia_slurm.slurm.observe.managed import ManagedJob

logger = logging.getLogger(__name__)


class ResubmissionError(RuntimeError):
    """The job could not be resubmitted; the message says why."""


def must_resubmit(job: SlurmJob, shape: Shape, always: bool) -> bool:
    """A node-count shrink of a job that has run, when Slurm refused it in place (the job sits
    in BadConstraints), or whenever ``always``."""
    shrink = job.restart_count > 0 and shape.nodes < job.node_count
    return shrink and (always or job.reason == "BadConstraints")


def resubmit(calls: SlurmCalls, paths: StatePaths, managed: ManagedJob, shape: Shape) -> str:
    """Submit ``managed``'s current job again, held, in ``shape``; record the new job as the
    current one and cancel the old. Returns the new Slurm job id."""
    old, sia_id = managed.current, managed.sia_id
    euid = os.geteuid()
    if euid != 0 and old.user_id != euid:
        raise ResubmissionError(
            f"Slurm job {old.job_id} must be resubmitted to shrink it, which needs root "
            f"(it belongs to uid {old.user_id})"
        )
    script = paths.batch_copy(sia_id)  # the controller's own tree: no user can swap it
    if not script.exists():
        text = calls.run(commands.write_batch_script(old.job_id))
        if not text.startswith("#!"):
            raise ResubmissionError(
                f"scontrol write batch_script {old.job_id} gave no script: {text[:80]!r}"
            )
        write_text_atomic(script, text, mode=0o600)
    argv = commands.resubmit(old, shape, script, run_as_owner=euid == 0)
    new_id = commands.parse_parsable(calls.run(argv))
    replace(
        managed.record,
        slurm_job_id=new_id,
        restart_base=managed.restarts,
        superseded=(*managed.record.superseded, old.job_id),
    ).write(paths.slurm_record(sia_id))
    calls.run_quiet(commands.cancel([old.job_id]))
    logger.info(
        "[job=%s] resubmitted Slurm job %s as %s to shrink it to %d node(s)",
        sia_id,
        old.job_id,
        new_id,
        shape.nodes,
    )
    return new_id
