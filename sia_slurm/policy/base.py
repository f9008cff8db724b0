"""The policy seam: one input type for every policy, one output type, one method.

A policy is a pure function of a :class:`PolicyInput` (a read-only view of the cluster, the jobs
and the previous :class:`Allocation`) to a new :class:`Allocation`. Whatever a policy must
remember between rounds (Gavel's time received per GPU type, Pollux's previous replica matrix)
travels explicitly in ``Allocation.state`` and comes back as ``PolicyInput.previous``, so a round
can be replayed from its input alone. Placement (node lists) is a separate stage,
:mod:`sia_slurm.policy.placement`.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from types import MappingProxyType
from typing import Protocol

import numpy as np

from sia_slurm.core import (
    Configuration,
    GoodputEstimator,
    GoodputRow,
    JobKind,
    NodeShare,
    NodeView,
)
from sia_slurm.policy.limits import GpuLimit


@dataclass(frozen=True)
class GpuTypeView:
    """Per-GPU-type summary derived from the nodes (what the policies reason about)."""

    gpu_type: str
    gpus_per_node: int  # R_t
    num_nodes: int  # N_t, every node of the type
    usable_per_node: tuple[int, ...]  # usable GPUs of each node of the type, largest first

    @cached_property
    def capacity(self) -> int:
        """Usable GPUs of the type, summed over its nodes (cached: the configuration set asks
        once per configuration, and a 16,384-GPU cluster has thousands of nodes)."""
        return sum(self.usable_per_node)

    @property
    def max_node_gpus(self) -> int:
        """Most usable GPUs on any one node of the type."""
        return self.usable_per_node[0]

    def nodes_with(self, gpus: int) -> int:
        """How many of the type's nodes have at least ``gpus`` usable GPUs (a bisection: the
        counts are sorted, largest first)."""
        return bisect_right(self.usable_per_node, -gpus, key=lambda usable: -usable)


@dataclass(frozen=True)
class ClusterView:
    """The nodes of the cluster; GPU types keep the order in which their nodes are listed."""

    nodes: tuple[NodeView, ...]

    def __post_init__(self) -> None:
        names = [node.name for node in self.nodes]
        if len(set(names)) != len(names):
            raise ValueError(f"cluster: node names must be unique, got {names}")
        for gpu_type in self.gpu_types:
            sizes = {node.total_gpus for node in self.nodes if node.gpu_type == gpu_type}
            if len(sizes) != 1:
                raise ValueError(
                    f"cluster: nodes of GPU type {gpu_type!r} must all have the same number of "
                    f"GPUs, got {sorted(sizes)}; split them into distinct GPU types"
                )

    @cached_property
    def gpu_types(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(node.gpu_type for node in self.nodes))

    @cached_property
    def types(self) -> Mapping[str, GpuTypeView]:
        """A :class:`GpuTypeView` per GPU type, in :attr:`gpu_types` order."""
        views = {}
        for gpu_type in self.gpu_types:
            nodes = [node for node in self.nodes if node.gpu_type == gpu_type]
            views[gpu_type] = GpuTypeView(
                gpu_type=gpu_type,
                gpus_per_node=nodes[0].total_gpus,
                num_nodes=len(nodes),
                usable_per_node=tuple(sorted((node.usable_gpus for node in nodes), reverse=True)),
            )
        return MappingProxyType(views)

    @property
    def total_capacity(self) -> int:
        return sum(view.capacity for view in self.types.values())


@dataclass(frozen=True)
class JobView:
    """What a policy may know about one job this round (read-only).

    ``age`` is seconds since submission; ``max_gpus`` is the job's own limit
    (``max_batch_size / min_local_bsz``, or the requested count for rigid jobs), ``None`` for no
    limit; ``max_gpus_seen`` the largest GPU count it has run on so far (0 before its first
    run), which drives the growth cap. ``requested_*`` are what the user asked for: the size of
    rigid, pinned, FIFO and Gavel jobs. ``restoring`` marks a job in the middle of a
    checkpoint-restore: it keeps its current configuration. ``gpu_types`` limits the types it
    may run on.
    """

    job_id: str
    kind: JobKind
    estimator: GoodputEstimator
    age: float = 0.0
    submit_time: float = 0.0
    restarts: int = 0
    # Of ``restarts``, those the cluster made on its own (Slurm requeued the job after a node
    # failure or a preemption), not asked for by the controller.
    requeues: int = 0
    restart_cost: float | None = (
        None  # S in seconds (sia-sbatch --restart-cost); None: the policy's
    )
    current: Configuration | None = None
    placement: tuple[NodeShare, ...] = ()
    min_gpus: int = 1
    max_gpus: int | None = None
    max_gpus_seen: int = 0
    requested_gpus: int = 1
    requested_gpu_type: str | None = None
    restoring: bool = False
    # The GPU types the job may run on (None: any): a job still profiling may run only on a
    # type it has not measured yet (docs/profiling.md).
    gpu_types: frozenset[str] | None = None
    # The job is measuring its profile where it runs: placement never evicts it (a move would
    # start its sweep on that type again).
    profiling: bool = False

    def __post_init__(self) -> None:
        if self.min_gpus < 1 or self.requested_gpus < 1:
            raise ValueError(
                f"job {self.job_id}: min_gpus and requested_gpus must be >= 1, "
                f"got min_gpus={self.min_gpus} requested_gpus={self.requested_gpus}"
            )
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise ValueError(
                f"job {self.job_id}: max_gpus={self.max_gpus} is below min_gpus={self.min_gpus}"
            )
        if self.restoring and self.current is None:
            raise ValueError(f"job {self.job_id}: restoring=True needs a current configuration")


@dataclass(frozen=True)
class JobAllocation:
    """A job's share for the next round: a configuration and the batch size to run it with."""

    config: Configuration
    batch_size: int
    local_bsz: int
    accum_steps: int
    goodput: float  # predicted, samples per second; used by placement to rank evictions
    # The predicted raw samples per second of ``config`` at this batch (``goodput`` is this
    # times the statistical efficiency of the round's gradient statistics). Kept apart so the
    # dashboard can set a prediction against a measurement with the *same* statistics: a job's
    # statistics move between the round that decided and its last report (report/goodput.py).
    throughput: float = 0.0


@dataclass(frozen=True)
class SolveInfo:
    """How the allocation was obtained, for logs and benchmarks."""

    status: str  # "optimal", "time-limit", "fallback", "kept", "heuristic"
    solve_seconds: float = 0.0
    message: str = ""


@dataclass(frozen=True)
class Allocation:
    """Per job a :class:`JobAllocation`; a job absent from ``jobs`` gets no GPUs this round."""

    jobs: Mapping[str, JobAllocation]
    time: float = 0.0
    round_index: int = 0
    state: object | None = None  # policy-specific memory, handed back via PolicyInput.previous
    info: SolveInfo = field(default_factory=lambda: SolveInfo("optimal"))
    # Node shares a policy that decides at node level (Pollux) would like; placement tries them
    # first and falls back to its own rules when they do not fit.
    node_hints: Mapping[str, tuple[NodeShare, ...]] = field(default_factory=dict)
    # True when the hints are the policy's own worker assignment (Gavel): a running job whose
    # hint names other nodes moves there instead of keeping its nodes. Pollux's hints are
    # wishes (False): a job whose configuration did not change keeps its nodes.
    hints_move_jobs: bool = False
    # Per job, other shares placement may give it when it cannot place the chosen one, best
    # first (Sia's repair: :class:`sia_slurm.policy.sia.Fallbacks`, built on demand); none: such
    # a job is left unplaced. Not kept in the policy's memory: it is the round's alone.
    fallbacks: Mapping[str, tuple[JobAllocation, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "jobs", MappingProxyType(dict(self.jobs)))
        object.__setattr__(self, "node_hints", MappingProxyType(dict(self.node_hints)))

    def get(self, job_id: str) -> JobAllocation | None:
        return self.jobs.get(job_id)

    def gpus_used(self) -> dict[str, int]:
        """GPUs allocated per GPU type."""
        used: dict[str, int] = {}
        for share in self.jobs.values():
            used[share.config.gpu_type] = used.get(share.config.gpu_type, 0) + share.config.gpus
        return used


@dataclass(frozen=True)
class PolicyInput:
    """Everything a policy sees in one round. ``now`` is the round's time in seconds (wall or
    simulated clock) and ``round_index`` its number; both make solves reproducible."""

    cluster: ClusterView
    jobs: tuple[JobView, ...]
    previous: Allocation | None = None
    now: float = 0.0
    round_index: int = 0
    # Per job, its weight in the objective from the site's shares (:mod:`.shares`); absent: 1.
    weights: Mapping[str, float] = field(default_factory=dict)
    # Per job, its groups in the shares' hierarchy, outermost first: (account, user). Gavel's
    # hierarchical max-min fairness hands a frozen job's weight to its groups (.gavel_fill).
    groups: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    # GPU limits from Slurm's associations and QOS (:mod:`.limits`): shared caps on sets of jobs.
    limits: tuple[GpuLimit, ...] = ()

    def __post_init__(self) -> None:
        ids = [job.job_id for job in self.jobs]
        if len(set(ids)) != len(ids):
            raise ValueError("policy input: job ids must be unique")
        object.__setattr__(self, "weights", MappingProxyType(dict(self.weights)))
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        bad = {k: w for k, w in self.weights.items() if not 0 < w < float("inf")}
        if bad:
            raise ValueError(f"policy input: weights must be finite and > 0, got {bad}")

    def weight(self, job_id: str) -> float:
        """``job_id``'s weight in the objective (1 when the shares give it none)."""
        return self.weights.get(job_id, 1.0)


class Policy(Protocol):
    """An allocation policy: a pure function of its input (and its configuration)."""

    def solve(self, policy_input: PolicyInput) -> Allocation: ...


def allocation_from_row(config: Configuration, row: GoodputRow, index: int) -> JobAllocation:
    """The :class:`JobAllocation` for entry ``index`` of a job's :class:`GoodputRow`."""
    return JobAllocation(
        config=config,
        batch_size=int(row.batch_size[index]),
        local_bsz=int(row.local_bsz[index]),
        accum_steps=int(row.accum_steps[index]),
        goodput=float(row.goodput[index]),
        throughput=float(row.throughput[index]),
    )


def restart_factor(age: float, restarts: int, restart_cost: float) -> float:
    """Sia's restart factor ``max(age - restarts * S, 0) / (age + S)``, 1 while ``age < S``.

    It discounts every configuration but the current one by the fraction of the job's life not
    spent restarting, so young or often-restarted jobs are moved less.
    """
    return float(
        restart_factors(np.array([age]), np.array([restarts]), np.array([restart_cost]))[0]
    )


def restart_factors(age: np.ndarray, restarts: np.ndarray, restart_cost: np.ndarray) -> np.ndarray:
    """:func:`restart_factor` of many jobs at once, element-wise (one numpy pass for the
    thousands of jobs of a large round)."""
    age = np.asarray(age, dtype=np.float64)
    cost = np.asarray(restart_cost, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        factor = np.maximum(age - np.asarray(restarts, dtype=np.float64) * cost, 0.0) / (age + cost)
    return np.where((cost <= 0) | (age < cost), 1.0, factor)
