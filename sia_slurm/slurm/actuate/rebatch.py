"""Rebatch: a running job's new batch size, carried by its ``assignment.json`` alone.

Nothing changes in Slurm: the job keeps its run, nodes and GPUs, and its trainer adopts the
batch at the step after it reads the rewritten file (docs/protocol.md, "Rebatch"). Deciding
what to write is kept apart from writing it, so the rules read in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sia_slurm.cluster import Rebatch
from sia_slurm.protocol import Assignment, ProtocolError
from sia_slurm.slurm.observe.jsonparse import SlurmJob


@dataclass(frozen=True)
class RebatchOutcome:
    """Whether the rebatch stands, what to say, and the assignment to write (if any)."""

    ok: bool
    message: str
    assignment: Assignment | None = None


def rebatch(current: Assignment | None, action: Rebatch, job: SlurmJob) -> RebatchOutcome:
    """The outcome of ``action`` for a job whose assignment is ``current`` and whose Slurm
    job is ``job``. A later round's assignment wins (the action is stale); the same batch of
    the same round is already set (a replay after a crash); only a job holding GPUs has a
    trainer to adopt a batch."""
    if current is None:
        return RebatchOutcome(
            False, "no assignment to change: the job was not started by sia-slurm"
        )
    if current.round_index > action.round_index:
        return RebatchOutcome(False, f"superseded by the assignment of round {current.round_index}")
    batch = (action.batch.batch_size, action.batch.local_bsz, action.batch.accum_steps)
    if current.round_index == action.round_index and batch == (
        current.batch_size,
        current.local_bsz,
        current.accum_steps,
    ):
        return RebatchOutcome(True, "batch already set")
    if not job.holds_gpus:
        return RebatchOutcome(False, f"Slurm job {job.job_id} is {job.state}")
    try:
        updated = replace(
            current,
            round_index=action.round_index,
            batch_size=batch[0],
            local_bsz=batch[1],
            accum_steps=batch[2],
        )
    except ProtocolError as exc:
        return RebatchOutcome(False, f"bad batch: {exc}")
    message = f"batch {batch[0]} ({batch[1]} per GPU, {batch[2]} extra micro-batches)"
    return RebatchOutcome(True, message, updated)
