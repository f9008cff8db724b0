"""Gavel's worker assignment: GPUs of a type handed out by count, over any of its nodes.

Gavel (and the Sia artifact's Gavel, which Sia's evaluation compares with) schedules a job on a
GPU type when the type has as many free GPUs as the job asks for, wherever they are; it does not
ask for the fewest nodes or an even split. Its workers are then chosen per type, larger jobs
first: a job that ran on this type before keeps its previous GPUs when all of them are still
free, every other job takes free GPUs node by node in the cluster's node order. A job may so end
up spread unevenly over several nodes (``2 + 1 + 1``), which the goodput model and the simulated
ground truth price by its node count.

That is the ``any`` rule (``GavelPolicyConfig.workers``), the simulator's default. One Slurm job
asks for the same number of GPUs on each of its nodes, so on Slurm the rule is ``even``
(:func:`even_shares`): a job is scheduled only where its GPUs split evenly over free nodes,
checked as jobs are scheduled, in priority order.

Counting GPUs per type instead of fitting shapes on nodes is what keeps Gavel work-conserving:
with fewest-node shapes a job waits while its type has enough free GPUs scattered over nodes.
The assignment always succeeds when the GPUs handed out on a type do not exceed its usable GPUs
(:func:`assign_workers` checks it). The result travels to placement as the allocation's node
hints (:mod:`sia_slurm.policy.placement`), so placement itself stays one module for all policies.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sia_slurm.policy.base import ClusterView, NodeShare


@dataclass(frozen=True)
class WorkerRequest:
    """One job scheduled on ``gpu_type`` for ``gpus`` GPUs; ``previous`` are the node shares
    it holds now (empty if it holds none)."""

    job_id: str
    gpu_type: str
    gpus: int
    previous: tuple[NodeShare, ...] = ()


class WorkerAssignmentError(ValueError):
    """More GPUs of a type were scheduled than its nodes offer."""


def assign_workers(
    cluster: ClusterView, requests: Sequence[WorkerRequest]
) -> dict[str, tuple[NodeShare, ...]]:
    """Node shares per job, type by type; ``requests`` in the order the jobs were scheduled.

    Per type, jobs go by GPU count, largest first (the order of scheduling among equals); within
    each count, the jobs that can keep their previous shares keep them before the others fill
    free GPUs node by node.
    """
    free = {node.name: node.usable_gpus for node in cluster.nodes}
    assigned: dict[str, tuple[NodeShare, ...]] = {}
    for gpu_type in cluster.gpu_types:
        nodes = [node.name for node in cluster.nodes if node.gpu_type == gpu_type]
        on_type = [r for r in requests if r.gpu_type == gpu_type]
        asked = sum(r.gpus for r in on_type)
        if asked > sum(free[n] for n in nodes):
            raise WorkerAssignmentError(
                f"GPU type {gpu_type!r}: {asked} GPUs scheduled, only "
                f"{sum(free[n] for n in nodes)} usable"
            )
        for gpus in sorted({r.gpus for r in on_type}, reverse=True):
            group = [r for r in on_type if r.gpus == gpus]
            for request in group:
                if _can_keep(request, free, nodes):
                    assigned[request.job_id] = request.previous
                    for share in request.previous:
                        free[share.node] -= share.gpus
            for request in group:
                if request.job_id not in assigned:
                    assigned[request.job_id] = _fill(request.gpus, nodes, free)
    return assigned


def even_shares(
    free: dict[str, int], nodes: list[str], gpus: int, previous: tuple[NodeShare, ...] = ()
) -> tuple[NodeShare, ...] | None:
    """``gpus`` GPUs as the same count on each of the fewest nodes that have it free (first fit
    in ``nodes`` order), the job's ``previous`` shares if still free; ``None`` if no such set.

    This is the ``even`` rule: one Slurm job asks for the same GPUs on every node
    (``TresPerNode``), so an uneven split could not be started there.
    """
    if (
        previous
        and len({s.gpus for s in previous}) == 1
        and _can_keep_shares(previous, gpus, free, nodes)
    ):
        return previous
    for count in range(1, len(nodes) + 1):
        if gpus % count:
            continue
        per_node = gpus // count
        chosen = [node for node in nodes if free[node] >= per_node][:count]
        if len(chosen) == count:
            return tuple(NodeShare(node, per_node) for node in chosen)
    return None


def _can_keep_shares(
    previous: tuple[NodeShare, ...], gpus: int, free: dict[str, int], nodes: list[str]
) -> bool:
    return sum(s.gpus for s in previous) == gpus and all(
        s.node in nodes and free[s.node] >= s.gpus for s in previous
    )


def _can_keep(request: WorkerRequest, free: dict[str, int], nodes: list[str]) -> bool:
    previous = request.previous
    return (
        bool(previous)
        and sum(share.gpus for share in previous) == request.gpus
        and all(share.node in nodes and free[share.node] >= share.gpus for share in previous)
    )


def _fill(gpus: int, nodes: list[str], free: dict[str, int]) -> tuple[NodeShare, ...]:
    """Take ``gpus`` free GPUs node by node in ``nodes`` order (first fit, split as needed)."""
    shares = []
    left = gpus
    for node in nodes:
        if left == 0:
            break
        take = min(free[node], left)
        if take > 0:
            shares.append(NodeShare(node, take))
            free[node] -= take
            left -= take
    return tuple(shares)
