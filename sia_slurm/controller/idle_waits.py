"""Jobs that wait beside GPUs they could use, and allocations placement could not honour.

Issue 38 ("no job waits beside GPUs it can use") needs a measure: how often, under a policy, a
job holds nothing while GPUs it could run on lie free. This module counts that per round, from
the controller's own :class:`~sia_slurm.controller.RoundOutcome`, in two places (one code
path): the simulator counts what its cluster holds *after* the round's actions were applied (a
grant the cluster refused counts as well as one the controller never made;
:func:`sia_slurm.sim.waits_after_actions.after_actions`), the Slurm controller what the round
decided (:func:`as_decided`: Slurm starts the jobs after the round, so the round cannot see
them held), for the Prometheus textfile:

* an **idle wait** is a job-round where an active (submitted, unfinished) job holds no GPUs
  while some GPU type it may use has free GPUs where its smallest run fits
  (:func:`smallest_run`, :func:`fits_free`);
* an **unplaced allocation** is a job the policy gave GPUs and placement found no room for
  (:attr:`~sia_slurm.policy.placement.Placement.unplaced`, the jobs the controller logs as
  "no room for ...; left unplaced"), read from the controller's own
  :class:`~sia_slurm.controller.RoundOutcome`, never placed again here.

Each idle wait carries its :class:`WaitCause`: where in the round the job was left out. The
smallest run is the job's own (its ``min_gpus``, or the size a rigid or pinned job asked for),
not what the policy chooses to give it: FIFO and Gavel run every job at its requested size, so
a job that could start on one GPU waits beside three free ones there, and that is what the
count is for.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum

from sia_slurm.cluster import ClusterSnapshot, JobSnapshot
from sia_slurm.controller.decide import RoundOutcome
from sia_slurm.core import Configuration, JobKind, NodeView
from sia_slurm.policy.base import JobView
from sia_slurm.policy.configs import node_shares, nodes_needed


class WaitCause(StrEnum):
    """Where the round left a waiting job out, in the order the round decides."""

    NOT_DECIDED = "not_decided"  # kept out of the decision: profiling wait, quarantine, refused
    NOT_ALLOCATED = "not_allocated"  # the policy gave it no GPUs
    UNPLACED = "unplaced"  # allocated, but placement found no room
    REFUSED = "refused"  # placed, but the cluster refused the grant


@dataclass(frozen=True)
class SmallestRun:
    """The fewest GPUs a job can run on, and the types it may run on (``None``: any)."""

    gpus: int
    gpu_types: frozenset[str] | None = None

    def allows(self, gpu_type: str) -> bool:
        return self.gpu_types is None or gpu_type in self.gpu_types


@dataclass(frozen=True)
class RoundWaits:
    """One round's count: the waiting jobs with their causes, and the unplaced allocations."""

    waits: Mapping[str, WaitCause]  # sia id -> why it waits beside free GPUs
    unplaced: tuple[str, ...]  # sia ids the policy allocated and placement left out

    def by_cause(self) -> dict[str, int]:
        """Idle waits per cause (causes with none left out)."""
        return dict(sorted(Counter(cause.value for cause in self.waits.values()).items()))


def smallest_run(
    kind: JobKind,
    min_gpus: int,
    requested_gpus: int,
    requested_gpu_type: str | None = None,
    gpu_types: frozenset[str] | None = None,
) -> SmallestRun:
    """A job's smallest run by its own limits: rigid and pinned jobs run at the count they
    asked for (a pinned one on its type, if it named one); elastic ones from ``min_gpus``.
    ``gpu_types`` is what the controller let it run on this round (a job still profiling)."""
    if kind in (JobKind.RIGID, JobKind.PINNED):
        types = gpu_types
        if kind is JobKind.PINNED and requested_gpu_type is not None:
            named = frozenset({requested_gpu_type})
            types = named if types is None else types & named
        return SmallestRun(requested_gpus, types)
    return SmallestRun(min_gpus, gpu_types)


def smallest_run_of_view(view: JobView) -> SmallestRun:
    """:func:`smallest_run` of a job the policy saw this round (its limits as the controller
    set them: a job still profiling may use one GPU of the types it has not measured)."""
    return smallest_run(
        view.kind, view.min_gpus, view.requested_gpus, view.requested_gpu_type, view.gpu_types
    )


def smallest_run_of_job(job: JobSnapshot) -> SmallestRun:
    """:func:`smallest_run` of a job the controller kept out of its decision, from its spec."""
    spec = job.spec
    return smallest_run(spec.kind, spec.min_gpus, spec.requested_gpus, spec.requested_gpu_type)


def fits_free(free: Iterable[int], gpus: int, gpus_per_node: int) -> bool:
    """Whether ``gpus`` GPUs fit in one type's free GPUs (``free``: per node) the way placement
    would place them: inside one node when a node holds that many, else spread as evenly as
    possible over the fewest distinct nodes that hold them (:func:`node_shares`)."""
    if gpus < 1:
        return False
    ordered = sorted(free, reverse=True)
    nodes = 1 if gpus <= gpus_per_node else nodes_needed(gpus, gpus_per_node)
    shares = node_shares(Configuration("-", nodes, gpus))
    # Largest share on the node with most free GPUs, and so on: if that matching fails, none
    # does (both lists are sorted the same way).
    return len(ordered) >= len(shares) and all(
        have >= need for have, need in zip(ordered, shares, strict=False)
    )


@dataclass(frozen=True)
class FreeGpus:
    """Free GPUs per node, grouped by GPU type (each type's largest first), after a round's
    actions. Answers are kept per smallest run: a round asks once per waiting job, and a
    large workload's waiting jobs share a handful of smallest runs."""

    per_type: Mapping[str, tuple[int, ...]]
    gpus_per_node: Mapping[str, int]
    _answers: dict[SmallestRun, bool] = field(default_factory=dict, compare=False, repr=False)

    @staticmethod
    def of(nodes: Sequence[NodeView], free: Mapping[str, int]) -> FreeGpus:
        """From the cluster's nodes and each node's free GPUs (a node not in ``free``: none;
        never more than the node offers to managed jobs)."""
        per_type: dict[str, list[int]] = {}
        size: dict[str, int] = {}
        for node in nodes:
            per_type.setdefault(node.gpu_type, []).append(
                min(free.get(node.name, 0), node.usable_gpus)
            )
            size[node.gpu_type] = node.total_gpus
        return FreeGpus({t: tuple(sorted(f, reverse=True)) for t, f in per_type.items()}, size)

    def room_for(self, run: SmallestRun) -> bool:
        """Whether some type ``run`` may use has free GPUs where it fits."""
        answer = self._answers.get(run)
        if answer is None:
            answer = self._answers[run] = any(
                run.allows(gpu_type) and fits_free(free, run.gpus, self.gpus_per_node[gpu_type])
                for gpu_type, free in self.per_type.items()
            )
        return answer


def wait_cause(sia_id: str, outcome: RoundOutcome, decided: Collection[str]) -> WaitCause:
    """Where ``outcome`` left out a job that holds no GPUs after the round's actions."""
    if sia_id not in decided:
        return WaitCause.NOT_DECIDED
    if sia_id not in outcome.allocation.jobs:
        return WaitCause.NOT_ALLOCATED
    if sia_id not in outcome.placement.assignments:
        return WaitCause.UNPLACED
    return WaitCause.REFUSED


def round_waits(
    jobs: Sequence[JobSnapshot],
    outcome: RoundOutcome,
    holding: Collection[str],
    free: FreeGpus,
) -> RoundWaits:
    """One round's idle waits and unplaced allocations.

    ``jobs`` is the snapshot the round decided from (its unfinished jobs are the active ones),
    ``outcome`` what the controller decided, ``holding`` the jobs that hold GPUs and ``free``
    the free GPUs, both once the round's actions were applied.
    """
    views = {view.job_id: view for view in outcome.views}
    waits: dict[str, WaitCause] = {}
    for job in jobs:
        if job.phase.finished or job.sia_id in holding:
            continue
        view = views.get(job.sia_id)
        run = smallest_run_of_job(job) if view is None else smallest_run_of_view(view)
        if free.room_for(run):
            waits[job.sia_id] = wait_cause(job.sia_id, outcome, views)
    return RoundWaits(waits, tuple(outcome.placement.unplaced))


def as_decided(snapshot: ClusterSnapshot, outcome: RoundOutcome) -> RoundWaits:
    """:func:`round_waits` of the round as it decided: the jobs it placed hold their shares,
    the ones it kept out of its decision (quarantined) the GPUs they hold, and every other GPU a
    managed job may use is free."""
    views = {view.job_id for view in outcome.views}
    holding = set(outcome.placement.assignments)
    taken: Counter[str] = Counter()
    for shares in outcome.placement.assignments.values():
        for share in shares:
            taken[share.node] += share.gpus
    for job in snapshot.jobs:
        if job.phase.holds_gpus and job.sia_id not in views and job.sia_id not in holding:
            holding.add(job.sia_id)
            for share in job.placement:
                taken[share.node] += share.gpus
    free = {node.name: max(node.usable_gpus - taken[node.name], 0) for node in snapshot.nodes}
    return round_waits(snapshot.jobs, outcome, holding, FreeGpus.of(snapshot.nodes, free))
