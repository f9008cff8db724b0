"""What a round leaves in the ``rounds`` table and the Prometheus file, summarised from the
round's snapshot and outcome.

The summaries are computed here, where the round is recorded, so that the state store
(:meth:`sia_slurm.state.Store.record_round`) only writes the plain values it is given and
imports neither the controller nor its outcome.
"""

from __future__ import annotations

from sia_slurm.cluster import ClusterSnapshot
from sia_slurm.controller import RoundOutcome
from sia_slurm.state import RoundRow, Store


def gpus_by_type(snapshot: ClusterSnapshot, outcome: RoundOutcome) -> dict[str, dict[str, int]]:
    """Per GPU type: total and usable GPUs, GPUs the round allocated, and GPUs held now."""
    summary: dict[str, dict[str, int]] = {}
    for node in snapshot.nodes:
        entry = summary.setdefault(
            node.gpu_type, {"total": 0, "usable": 0, "allocated": 0, "in_use": 0}
        )
        entry["total"] += node.total_gpus
        entry["usable"] += node.usable_gpus
    empty = {"total": 0, "usable": 0, "allocated": 0, "in_use": 0}
    for gpu_type, gpus in outcome.allocation.gpus_used().items():
        summary.setdefault(gpu_type, dict(empty))["allocated"] += gpus
    for job in snapshot.jobs:
        if job.phase.holds_gpus and job.config is not None:
            summary.setdefault(job.config.gpu_type, dict(empty))["in_use"] += job.config.gpus
    return summary


def jobs_by_phase(snapshot: ClusterSnapshot) -> dict[str, int]:
    counts: dict[str, int] = {}
    for job in snapshot.jobs:
        counts[job.phase.value] = counts.get(job.phase.value, 0) + 1
    return counts


def round_summary(
    outcome: RoundOutcome,
    snapshot: ClusterSnapshot,
    *,
    dry_run: bool,
    wall_time: float,
    timings: dict[str, float],
) -> RoundRow:
    """The ``rounds`` row of one round."""
    info = outcome.allocation.info
    return RoundRow(
        round_index=outcome.round_index,
        time=outcome.time,
        wall_time=wall_time,
        dry_run=dry_run,
        timings=timings,
        solve_status=info.status,
        solve_seconds=info.solve_seconds,
        solve_message=info.message,
        gpus=gpus_by_type(snapshot, outcome),
        jobs_by_phase=jobs_by_phase(snapshot),
        rejected=list(outcome.rejected),
    )


def record_round(
    store: Store,
    outcome: RoundOutcome,
    snapshot: ClusterSnapshot,
    *,
    dry_run: bool,
    wall_time: float,
    timings: dict[str, float],
) -> None:
    """One row of ``rounds`` and one ``decisions`` row per job (replacing a re-run round); call
    inside a transaction."""
    row = round_summary(outcome, snapshot, dry_run=dry_run, wall_time=wall_time, timings=timings)
    store.record_round(row, outcome.decisions)
