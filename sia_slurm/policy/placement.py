"""Placement: turn an allocation (a configuration per job) into node lists.

Rules (reference section 4, "Placement after allocation"):

- a partial-node configuration stays inside one node; a multi-node one spreads its GPUs as evenly
  as possible over distinct nodes (whole nodes for Sia's configuration set);
- a job whose configuration did not change keeps its nodes (no restart);
- a policy's own node choice (``Allocation.node_hints``, from Pollux) is used when it fits;
- the other jobs are packed fullest-node-first (best fit), larger shapes first;
- when fragmentation leaves no room, the fewest movable jobs (lowest goodput first) are evicted
  from the best candidate nodes and placed again, as one transaction: if the job or any victim
  then finds no room, nothing moves and the job is left unplaced. A job evicted once is not
  evicted again. Pinned and restoring jobs are never evicted.

Only the GPUs each node offers to managed jobs (``NodeView.usable_gpus``) are used, so nodes that
are down, drained or busy with unmanaged jobs are respected.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import Allocation, ClusterView, JobView, NodeShare
from sia_slurm.policy.configs import node_shares

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Node shares per placed job; ``unplaced`` jobs were allocated but found no room, ``moved``
    jobs were evicted from their nodes to make room for others."""

    assignments: Mapping[str, tuple[NodeShare, ...]]
    unplaced: tuple[str, ...] = ()
    moved: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignments", MappingProxyType(dict(self.assignments)))


@dataclass
class _State:
    """Mutable bookkeeping of one placement run (never escapes :func:`place`)."""

    free: dict[str, int]
    order: dict[str, int]  # node name -> position, for deterministic ties
    node_type: dict[str, str]
    assignments: dict[str, tuple[NodeShare, ...]] = field(default_factory=dict)

    def take(self, job_id: str, shares: tuple[NodeShare, ...]) -> None:
        for share in shares:
            self.free[share.node] -= share.gpus
        self.assignments[job_id] = shares

    def release(self, job_id: str) -> None:
        for share in self.assignments.pop(job_id):
            self.free[share.node] += share.gpus


def keeps_nodes(job: JobView | None, config: Configuration, cluster_types: dict[str, str]) -> bool:
    """Whether a job runs ``config`` already, on nodes that still exist and have its type."""
    if job is None or job.current != config or not job.placement:
        return False
    nodes = [share.node for share in job.placement]
    return (
        len(set(nodes)) == config.nodes
        and sum(share.gpus for share in job.placement) == config.gpus
        and all(cluster_types.get(node) == config.gpu_type for node in nodes)
    )


def hinted(
    state: _State, config: Configuration, hint: tuple[NodeShare, ...]
) -> tuple[NodeShare, ...] | None:
    """The policy's own node shares if they match ``config`` and still fit, else ``None``."""
    nodes = [share.node for share in hint]
    valid = (
        len(set(nodes)) == config.nodes
        and sum(share.gpus for share in hint) == config.gpus
        and all(state.node_type.get(node) == config.gpu_type for node in nodes)
        and all(share.gpus >= 1 and state.free[share.node] >= share.gpus for share in hint)
    )
    return hint if valid else None


def best_fit(state: _State, config: Configuration) -> tuple[NodeShare, ...] | None:
    """Shares on the fullest nodes that fit, largest share first, or ``None``."""
    candidates = sorted(
        (node for node, gpu_type in state.node_type.items() if gpu_type == config.gpu_type),
        key=lambda node: (state.free[node], state.order[node]),
    )
    used: set[str] = set()
    shares = []
    for gpus in node_shares(config):
        node = next((n for n in candidates if n not in used and state.free[n] >= gpus), None)
        if node is None:
            return None
        used.add(node)
        shares.append(NodeShare(node, gpus))
    return tuple(shares)


def eviction_plan(
    state: _State,
    config: Configuration,
    movable: Mapping[str, float],
) -> list[str] | None:
    """The fewest movable jobs (then lowest total goodput) whose eviction makes room for
    ``config``, or ``None`` if no eviction helps."""
    on_node: dict[str, list[str]] = {}
    for job_id, shares in state.assignments.items():
        if job_id in movable:
            for share in shares:
                on_node.setdefault(share.node, []).append(job_id)
    per_share = []
    for gpus in node_shares(config):
        options = []
        for node, gpu_type in state.node_type.items():
            if gpu_type != config.gpu_type:
                continue
            victims: list[str] = []
            free = state.free[node]
            for job_id in sorted(on_node.get(node, []), key=lambda j: (movable[j], j)):
                if free >= gpus:
                    break
                victims.append(job_id)
                free += sum(s.gpus for s in state.assignments[job_id] if s.node == node)
            if free >= gpus:
                cost = (len(victims), sum(movable[j] for j in victims), state.order[node])
                options.append((cost, node, victims))
        per_share.append(sorted(options))
    chosen_nodes: set[str] = set()
    evict: list[str] = []
    for options in per_share:
        pick = next((opt for opt in options if opt[1] not in chosen_nodes), None)
        if pick is None:
            return None
        chosen_nodes.add(pick[1])
        evict.extend(j for j in pick[2] if j not in evict)
    return evict or None


def evict_and_place(
    state: _State,
    job_id: str,
    config: Configuration,
    victims: list[str],
    allocation: Allocation,
) -> bool:
    """Evict ``victims``, place the job, then re-place every victim elsewhere, all or nothing.

    Eviction is a transaction: if the job or any victim finds no room afterwards, every share
    is restored and nothing moves. Without this a victim that no longer fits would evict
    others in turn, and the cascade could leave the job unplaced while jobs swap nodes (and
    pay a restart) every round.
    """
    before = {victim: state.assignments[victim] for victim in victims}
    for victim in victims:
        state.release(victim)
    shares = best_fit(state, config)
    if shares is not None:
        state.take(job_id, shares)
        placed: list[str] = []
        order = sorted(victims, key=lambda v: (-allocation.jobs[v].config.gpus, v))
        for victim in order:
            again = best_fit(state, allocation.jobs[victim].config)
            if again is None:
                break
            state.take(victim, again)
            placed.append(victim)
        if len(placed) == len(victims):
            return True
        for victim in placed:
            state.release(victim)
        state.release(job_id)
    for victim, original in before.items():
        state.take(victim, original)
    return False


def place(cluster: ClusterView, allocation: Allocation, jobs: Sequence[JobView]) -> Placement:
    """Place every allocated job on nodes; see the module docstring for the rules."""
    views = {job.job_id: job for job in jobs}
    state = _State(
        free={node.name: node.usable_gpus for node in cluster.nodes},
        order={node.name: i for i, node in enumerate(cluster.nodes)},
        node_type={node.name: node.gpu_type for node in cluster.nodes},
    )
    pending = []
    for job_id, share in sorted(allocation.jobs.items()):
        job = views.get(job_id)
        if keeps_nodes(job, share.config, state.node_type) and all(
            state.free[s.node] >= s.gpus
            for s in job.placement  # type: ignore[union-attr]
        ):
            state.take(job_id, job.placement)  # type: ignore[union-attr]
        else:
            pending.append(job_id)
    fixed = {
        job_id
        for job_id in allocation.jobs
        if job_id in views and (views[job_id].restoring or views[job_id].kind is JobKind.PINNED)
    }
    evicted: list[str] = []
    unplaced: list[str] = []

    def size(job_id: str) -> tuple[bool, int, int, str]:
        config = allocation.jobs[job_id].config
        return (job_id not in allocation.node_hints, -config.nodes, -config.gpus, job_id)

    for job_id in sorted(pending, key=size):
        config = allocation.jobs[job_id].config
        hint = allocation.node_hints.get(job_id)
        shares = hinted(state, config, hint) if hint else None
        shares = shares or best_fit(state, config)
        if shares is not None:
            state.take(job_id, shares)
            continue
        movable = {
            j: allocation.jobs[j].goodput
            for j in state.assignments
            if j not in fixed and j not in evicted
        }
        victims = eviction_plan(state, config, movable)
        if victims is not None and evict_and_place(state, job_id, config, victims, allocation):
            evicted.extend(victims)
            continue
        logger.warning(
            "[round=%d job=%s] no room for %s; left unplaced",
            allocation.round_index,
            job_id,
            config,
        )
        unplaced.append(job_id)
    return Placement(state.assignments, tuple(unplaced), tuple(evicted))
