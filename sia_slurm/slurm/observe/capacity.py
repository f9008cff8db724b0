"""What a node's GPUs can give the policy: its total, net of what no grant may use.

The snapshot's nodes are Slurm's, but the GPUs the policy may grant are fewer: a node that is
down or reserved gives none, and GPUs held by jobs that are not the controller's current runs,
or counted allocated by Slurm though no job holds them (phantom GPUs), are taken. Pure
functions of the parsed ``scontrol show node``, reservations and ``squeue`` records.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sia_slurm.core import NodeView
from sia_slurm.slurm.observe.inventory import NodeInfo
from sia_slurm.slurm.observe.jsonparse import SlurmJob


def node_views(
    nodes: tuple[NodeInfo, ...],
    partition_types: Mapping[str, str],
    reserved: set[str],
    unmanaged: list[SlurmJob],
    phantom: Mapping[str, tuple[int, int]] | None = None,
) -> tuple[NodeView, ...]:
    """Nodes of configured partitions (``partition_types``: partition -> GPU type); usable
    GPUs net of state, reservations, the GPUs held by jobs that are not current managed jobs
    (``unmanaged``), and phantom ones (Slurm counts them used, no job holds them:
    :func:`phantom_gpus`)."""
    taken = gpus_held(unmanaged)
    for node, (used, held) in (phantom or {}).items():
        taken[node] = taken.get(node, 0) + used - held
    views = []
    for node in nodes:
        gpu_type = next(
            (partition_types[p] for p in node.partitions if p in partition_types),
            None,
        )
        if gpu_type is None:
            continue
        total = node.gpus(gpu_type) or node.gpus()
        if total < 1:
            continue
        usable = 0
        if node.usable and node.name not in reserved:
            usable = max(0, total - taken.get(node.name, 0))
        views.append(NodeView(node.name, gpu_type, total, usable))
    return tuple(views)


def gpus_held(jobs: Sequence[SlurmJob]) -> dict[str, int]:
    """GPUs the ``jobs`` hold, by node (one pass over the jobs, whatever the node count)."""
    held: dict[str, int] = {}
    for job in jobs:
        for node in job.nodes:
            held[node] = held.get(node, 0) + job.gpus_on(node)
    return held


def phantom_gpus(nodes: Sequence[NodeInfo], held: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """Nodes where Slurm counts more GPUs as allocated (``GresUsed``) than its jobs hold
    (``held``, from :func:`gpus_held`), with both counts: Slurm will not start a job on them,
    so they are no capacity for the policy (which would otherwise grant them round after round
    to a job that never starts).

    Seen on 22.05.8: after a slurmd that died alone came back beside its job's new run
    ("Registered JobId=J StepId=J.batch on wrong node"), the job's later requeue left
    ``GresUsed=gpu:a100:2`` on an idle node. A job ending between the two reads of a snapshot
    shows as phantom for one round, which only errs on the safe side."""
    return {
        node.name: (node.gpus_used, held.get(node.name, 0))
        for node in nodes
        if node.gpus_used > held.get(node.name, 0)
    }


def phantom_message(node: str, used: int, held: int) -> str:
    """What the snapshot says, once, of a node with phantom GPUs."""
    return (
        f"node {node}: Slurm counts {used} GPU(s) allocated, its jobs hold {held}; "
        f"{used - held} left out until Slurm frees them (restarting slurmctld rebuilds its GPU "
        "accounting from the jobs)"
    )
