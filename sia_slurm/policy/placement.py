"""Placement: turn an allocation (a configuration per job) into node lists.

Rules (reference section 4, "Placement after allocation"):

- a partial-node configuration stays inside one node; a multi-node one spreads its GPUs as evenly
  as possible over distinct nodes (whole nodes for Sia's configuration set);
- a job whose configuration did not change keeps its nodes (no restart), unless the policy's
  hints move jobs (``Allocation.hints_move_jobs``, Gavel's worker assignment) and name others;
- a policy's own node choice (``Allocation.node_hints``, from Pollux and Gavel) is used when it
  fits: any split over the configuration's nodes, not only the even one;
- the other jobs are packed fullest-node-first (best fit), larger shapes first;
- when fragmentation leaves no room, the fewest movable jobs (lowest goodput first) are evicted
  from the best candidate nodes and placed again, as one transaction: if the job or any victim
  then finds no room, nothing moves. A job evicted once is not evicted again. Pinned,
  restoring and profiling jobs are never evicted;
- a job that still finds no room takes the first of the policy's fallbacks
  (``Allocation.fallbacks``, best first) that fits: its current nodes where the fallback is its
  current configuration, else a best fit. Without one it is left unplaced. A job placed at a
  fallback is not evicted afterwards (a victim is placed again at its allocated shape).

Only the GPUs each node offers to managed jobs (``NodeView.usable_gpus``) are used, so nodes that
are down, drained or busy with unmanaged jobs are respected.
"""

from __future__ import annotations

import logging
from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import Allocation, ClusterView, JobAllocation, JobView, NodeShare
from sia_slurm.policy.configs import node_shares

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Placement:
    """Node shares per placed job; ``unplaced`` jobs were allocated but found no room, ``moved``
    jobs were evicted from their nodes to make room for others."""

    assignments: Mapping[str, tuple[NodeShare, ...]]
    unplaced: tuple[str, ...] = ()
    moved: tuple[str, ...] = ()
    # Jobs placed at one of the policy's fallbacks instead of their allocated share, and that
    # share: the round's allocation takes it (sia_slurm/controller/decide.py).
    replaced: Mapping[str, JobAllocation] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "assignments", MappingProxyType(dict(self.assignments)))
        object.__setattr__(self, "replaced", MappingProxyType(dict(self.replaced)))


@dataclass
class _State:
    """Mutable bookkeeping of one placement run (never escapes :func:`place`).

    Besides each node's free GPUs it keeps, per GPU type, the nodes bucketed by free GPUs (each
    bucket sorted by node position) and the jobs on each node, so that a best fit or an eviction
    plan looks at one type's buckets instead of sorting every node: at 16,384 GPUs that sort,
    once per job, was most of a round.
    """

    free: dict[str, int]
    order: dict[str, int]  # node name -> position, for deterministic ties
    node_type: dict[str, str]
    assignments: dict[str, tuple[NodeShare, ...]] = field(default_factory=dict)
    names: list[str] = field(default_factory=list)  # position -> node name
    of_type: dict[str, list[str]] = field(default_factory=dict)  # in position order
    buckets: dict[str, dict[int, list[int]]] = field(default_factory=dict)
    on_node: dict[str, dict[str, None]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.names = sorted(self.order, key=self.order.__getitem__)
        for name in self.names:
            gpu_type = self.node_type[name]
            self.of_type.setdefault(gpu_type, []).append(name)
            bucket = self.buckets.setdefault(gpu_type, {}).setdefault(self.free[name], [])
            bucket.append(self.order[name])  # names are in position order: stays sorted

    def _move(self, node: str, gpus: int) -> None:
        """Change a node's free GPUs by ``gpus``, keeping its type's buckets in step."""
        buckets = self.buckets.get(self.node_type.get(node, ""))
        if buckets is not None:
            bucket = buckets[self.free[node]]
            del bucket[bisect_left(bucket, self.order[node])]
            insort(buckets.setdefault(self.free[node] + gpus, []), self.order[node])
        self.free[node] += gpus

    def take(self, job_id: str, shares: tuple[NodeShare, ...]) -> None:
        for share in shares:
            self._move(share.node, -share.gpus)
            self.on_node.setdefault(share.node, {})[job_id] = None
        self.assignments[job_id] = shares

    def release(self, job_id: str) -> None:
        for share in self.assignments.pop(job_id):
            self._move(share.node, share.gpus)
            self.on_node[share.node].pop(job_id, None)

    def fitting(self, gpu_type: str, gpus: int) -> Iterator[str]:
        """The type's nodes with at least ``gpus`` free GPUs, fullest first, then by position
        (the order of ``sorted(nodes, key=(free, position))``)."""
        buckets = self.buckets.get(gpu_type, {})
        for free in sorted(f for f in buckets if f >= gpus):
            for position in buckets[free]:
                yield self.names[position]


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


def moved_by_hint(allocation: Allocation, job: JobView | None) -> bool:
    """Whether the policy's binding hint puts a running job on other nodes than it holds."""
    if not allocation.hints_move_jobs or job is None or not job.placement:
        return False
    hint = allocation.node_hints.get(job.job_id)
    if hint is None:
        return False
    return sorted((s.node, s.gpus) for s in hint) != sorted((s.node, s.gpus) for s in job.placement)


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
    used: set[str] = set()
    shares = []
    for gpus in node_shares(config):
        node = next((n for n in state.fitting(config.gpu_type, gpus) if n not in used), None)
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
    per_share = []
    for gpus in node_shares(config):
        options = []
        for node in state.of_type.get(config.gpu_type, ()):
            victims: list[str] = []
            free = state.free[node]
            on_node = [j for j in state.on_node.get(node, ()) if j in movable]
            for job_id in sorted(on_node, key=lambda j: (movable[j], j)):
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


class _Movable(Mapping[str, float]):
    """Placed jobs that may still be evicted, with their goodput: a view, not a copy per
    unplaced job (building that dict was O(jobs) each time)."""

    def __init__(self, state: _State, allocation: Allocation, kept: set[str], evicted: list[str]):
        self._state, self._allocation, self._kept, self._evicted = state, allocation, kept, evicted

    def __contains__(self, job_id: object) -> bool:
        return (
            job_id in self._state.assignments
            and job_id not in self._kept
            and job_id not in self._evicted
        )

    def __getitem__(self, job_id: str) -> float:
        if job_id not in self:
            raise KeyError(job_id)
        return self._allocation.jobs[job_id].goodput

    def __iter__(self) -> Iterator[str]:
        return (j for j in self._state.assignments if j in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


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


def take_current_nodes(
    state: _State, job_id: str, job: JobView | None, config: Configuration
) -> bool:
    """Give ``job_id`` the nodes it holds if ``config`` is what it runs there and they are
    still free in ``state`` (no restart); whether it took them."""
    if not keeps_nodes(job, config, state.node_type) or not all(
        state.free[s.node] >= s.gpus
        for s in job.placement  # type: ignore[union-attr]
    ):
        return False
    state.take(job_id, job.placement)  # type: ignore[union-attr]
    return True


def place_fallback(
    state: _State, job_id: str, job: JobView | None, fallbacks: Sequence[JobAllocation]
) -> JobAllocation | None:
    """Place ``job_id`` at the first of ``fallbacks`` that fits (its current nodes where the
    fallback is its current configuration); that fallback, or ``None``."""
    for fallback in fallbacks:
        if take_current_nodes(state, job_id, job, fallback.config):
            return fallback
        shares = best_fit(state, fallback.config)
        if shares is not None:
            state.take(job_id, shares)
            return fallback
    return None


def share_types(state: _State, shares: tuple[NodeShare, ...]) -> set[str]:
    """The GPU types of the nodes ``shares`` are on."""
    return {state.node_type[share.node] for share in shares}


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
        # a job the hints move, or whose nodes are not what it keeps, is placed below
        if moved_by_hint(allocation, job) or not take_current_nodes(
            state, job_id, job, share.config
        ):
            pending.append(job_id)
    fixed = {
        job_id
        for job_id in allocation.jobs
        if job_id in views
        and (
            views[job_id].restoring
            or views[job_id].profiling
            or views[job_id].kind is JobKind.PINNED
        )
    }
    evicted: list[str] = []
    unplaced: list[str] = []
    replaced: dict[str, JobAllocation] = {}

    def size(job_id: str) -> tuple[bool, int, int, str]:
        config = allocation.jobs[job_id].config
        return (job_id not in allocation.node_hints, -config.nodes, -config.gpus, job_id)

    # Best fit and eviction are deterministic in the state of the shape's GPU type, which
    # changes only when a job is placed there (victims too stay on their type): a shape that
    # found no room needs no new search until then (at 16,384 GPUs a fragmented type sent
    # hundreds of same-shape jobs through the same failed eviction).
    placed: Counter[str] = Counter()
    no_room: dict[Configuration, int] = {}
    for job_id in sorted(pending, key=size):
        config = allocation.jobs[job_id].config
        hint = allocation.node_hints.get(job_id)
        shares = hinted(state, config, hint) if hint else None
        searched = no_room.get(config) == placed[config.gpu_type]
        if shares is None and not searched:
            shares = best_fit(state, config)
        if shares is not None:
            state.take(job_id, shares)
            placed.update(share_types(state, shares))
            continue
        if not searched:
            victims = eviction_plan(state, config, _Movable(state, allocation, fixed, evicted))
            if victims is not None and evict_and_place(state, job_id, config, victims, allocation):
                evicted.extend(victims)
                placed[config.gpu_type] += 1
                continue
            no_room[config] = placed[config.gpu_type]
        fallbacks = allocation.fallbacks.get(job_id, ())
        fallback = place_fallback(state, job_id, views.get(job_id), fallbacks)
        if fallback is not None:
            logger.info(
                "[round=%d job=%s] no room for %s; placed at %s instead",
                allocation.round_index,
                job_id,
                config,
                fallback.config,
            )
            replaced[job_id] = fallback
            fixed.add(job_id)  # an eviction would place it again at ``config``
            # Not counted in ``placed``: a fallback only takes free GPUs and is never a victim,
            # so a shape that found no room finds none after it either (counted, every one of
            # hundreds of same-shape misses at 16,384 GPUs searched and evicted again: 2 s).
            continue
        logger.warning(
            "[round=%d job=%s] no room for %s; left unplaced",
            allocation.round_index,
            job_id,
            config,
        )
        unplaced.append(job_id)
    return Placement(state.assignments, tuple(unplaced), tuple(evicted), replaced)
