"""Quarantine: one job's failure in a round is that job's alone.

A round reads every job's files, builds and feeds each job's goodput model, evaluates it in the
policy, allocates, places and actuates. A value one user wrote (or a bug one job's data finds)
can make any of these raise; without isolation that exception would fail the round, every
round, for every user. A quarantined job sits the round out: it is not decided (no start, no
stop), the GPUs it holds stay its own and count as taken, and the reason, ``<stage>: <why>``
with stage one of :data:`STAGES`, is its :class:`~sia_slurm.controller.decide.Decision` (so
``status``, ``explain`` and the dashboard show it) and is logged once per change.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sia_slurm.cluster import ClusterSnapshot, JobSnapshot
from sia_slurm.core import NodeView

STAGES = ("read", "fit", "estimate", "allocate", "place", "actuate")
QUARANTINED = "quarantined"  # a Decision's action for a job that sat the round out
# The most jobs one round quarantines for failing the policy or the placement; past that the
# failure is the round's (a bug of the policy, not one job's data) and propagates.
MAX_CULPRITS = 8


@dataclass
class Quarantine:
    """This round's quarantined jobs: why each (``<stage>: <why>``), and the snapshots of
    those the cluster listed (their GPUs)."""

    reasons: dict[str, str] = field(default_factory=dict)
    jobs: dict[str, JobSnapshot] = field(default_factory=dict)

    @classmethod
    def from_snapshot(cls, snapshot: ClusterSnapshot) -> Quarantine:
        """The jobs the backend could not read (``read`` stage)."""
        return cls({sia_id: f"read: {why}" for sia_id, why in snapshot.quarantined.items()})

    def add(self, job: JobSnapshot, stage: str, why: str) -> None:
        assert stage in STAGES, stage
        self.reasons[job.sia_id] = f"{stage}: {why}"
        self.jobs[job.sia_id] = job

    def holds(self, job: JobSnapshot) -> bool:
        """Whether ``job`` is quarantined (remembering its snapshot, for its GPUs)."""
        if job.sia_id not in self.reasons:
            return False
        self.jobs[job.sia_id] = job
        return True

    def nodes_without_holders(self, snapshot: ClusterSnapshot) -> tuple[NodeView, ...]:
        """The snapshot's nodes with the GPUs of quarantined jobs that hold some taken away:
        the policy must neither give them to another job nor stop the job that holds them."""
        taken: dict[str, int] = {}
        for job in self.jobs.values():
            if job.phase.holds_gpus:
                for share in job.placement:
                    taken[share.node] = taken.get(share.node, 0) + share.gpus
        if not taken:
            return snapshot.nodes
        return tuple(
            NodeView(
                node.name,
                node.gpu_type,
                node.total_gpus,
                max(0, node.usable_gpus - taken.get(node.name, 0)),
            )
            for node in snapshot.nodes
        )

    def decisions(self) -> list[tuple[str, str, str, str]]:
        """``(sia id, phase, configuration held, reason)`` per quarantined job, by sia id."""
        rows = []
        for sia_id in sorted(self.reasons):
            job = self.jobs.get(sia_id)
            phase = job.phase.value if job is not None else "-"
            held = str(job.config) if job is not None and job.phase.holds_gpus else "-"
            rows.append((sia_id, phase, held, self.reasons[sia_id]))
        return rows
