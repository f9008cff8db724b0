"""What each account is owed: the GPUs its jobs would take alone on its share of the cluster.

Fair shares (:mod:`.shares`) weigh an account up when it has recently held less GPU time than
it is owed. Owing every account its share of the *whole* cluster overstates what an elastic
workload wants: an account whose two jobs would not use half the cluster banks the difference
(up to the usage factor's clip) and is then over-served for an hour whenever it has a job that
could grow, at the cost of the cluster's JCT (docs/deviations.md, "Fair shares"). So an account
is owed what the policy itself would give its live jobs on its part of the cluster, alone:
each GPU type's usable GPUs scaled by the account's part, whole nodes first. That is the
sharing incentive of Gavel and DRF (no account does worse than on its own slice of the
cluster), measured with Sia's own goodput model, restart factor and growth cap.

An account is owed more where the other accounts leave more unused: GPUs nobody else's jobs
would take, even with the whole cluster to themselves, are its too. So it is owed the larger
of what its jobs take alone on its part and what they take alone on what the other accounts'
*solo* allocations (each alone on the whole cluster) leave, type by type. GPUs that several
accounts would take beyond their parts are owed to no one: the policy puts them where goodput
gains most, so only a shortfall is unfair (:class:`Entitlement`).

Computing it takes up to three solves per account with live jobs, on that account's jobs
only; the controller does it only when two or more accounts have live jobs, the usage factor
is on and the policy reads the weights at all (:func:`weighs_jobs`: Sia, Gavel's
``max_min_fairness``). ``benchmarks/fair_shares.py`` measures held GPU time against the same
:func:`entitlements`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace

from sia_slurm.policy.base import Allocation, ClusterView, Policy, PolicyInput


def weighs_jobs(policy: Policy) -> bool:
    """Whether ``policy``'s objective reads :attr:`PolicyInput.weights` (its ``weighs_jobs``
    attribute; absent: no). A policy that ignores the weights (Pollux, FIFO, Gavel's
    throughput objectives) gains nothing from the usage factor, so the controller does not
    spend a solve per account on what each is owed."""
    return bool(getattr(policy, "weighs_jobs", False))


@dataclass(frozen=True)
class Entitlement:
    """What one account's jobs take alone, in GPUs: on its part of the cluster (``alone``), on
    the whole cluster (``solo``, its demand) and on what the other accounts' solo allocations
    leave (``leftover``). It is ``owed`` the larger of ``alone`` and ``leftover``."""

    alone: int
    solo: int
    leftover: int

    @property
    def owed(self) -> int:
        return max(self.alone, self.leftover)


def share_cluster(cluster: ClusterView, fraction: float) -> ClusterView:
    """The cluster with ``fraction`` of every GPU type's usable GPUs, whole nodes first (in
    the order the nodes are listed), the last node partly: an account's slice of it."""
    return keep_gpus(
        cluster, {name: round(view.capacity * fraction) for name, view in cluster.types.items()}
    )


def keep_gpus(cluster: ClusterView, keep: Mapping[str, int]) -> ClusterView:
    """The cluster with ``keep[type]`` of every GPU type's usable GPUs (none of a type not in
    ``keep``), whole nodes first in the order the nodes are listed, the last node partly."""
    left = {name: max(0, keep.get(name, 0)) for name in cluster.types}
    nodes = []
    for node in cluster.nodes:
        usable = min(node.usable_gpus, left[node.gpu_type])
        left[node.gpu_type] -= usable
        nodes.append(replace(node, usable_gpus=usable))
    return ClusterView(tuple(nodes))


def entitlements(
    policy: Policy,
    policy_input: PolicyInput,
    account_of: Mapping[str, str],
    parts: Mapping[str, float],
) -> dict[str, Entitlement]:
    """Per account in ``parts`` (its fraction of the cluster), what ``policy`` allocates its
    jobs (``account_of``: job id -> account) alone on :func:`share_cluster` of that fraction,
    on the whole cluster, and on the whole cluster less the other accounts' solo allocations;
    the site's limits and the other accounts' jobs left out. Each is a decision of its own,
    with no previous allocation: a policy that decides only every so often (Gavel, every
    ``round_duration``) would otherwise keep its last allocation, and owe each account what it
    holds."""
    own = {
        account: replace(
            policy_input,
            jobs=tuple(j for j in policy_input.jobs if account_of.get(j.job_id) == account),
            weights={},
            groups={},
            limits=(),
            previous=None,
        )
        for account in parts
    }
    solo = {a: by_type(policy.solve(given)) if given.jobs else {} for a, given in own.items()}
    result = {}
    for account, part in parts.items():
        given = own[account]
        if not given.jobs:
            result[account] = Entitlement(0, 0, 0)
            continue
        alone = gpus(policy.solve(replace(given, cluster=share_cluster(given.cluster, part))))
        left = {
            name: view.capacity - sum(solo[a].get(name, 0) for a in own if a != account)
            for name, view in given.cluster.types.items()
        }
        leftover = 0
        if any(count > 0 for count in left.values()):
            leftover = gpus(policy.solve(replace(given, cluster=keep_gpus(given.cluster, left))))
        result[account] = Entitlement(alone, sum(solo[account].values()), leftover)
    return result


def owed_gpus(
    policy: Policy,
    policy_input: PolicyInput,
    account_of: Mapping[str, str],
    parts: Mapping[str, float],
) -> dict[str, int]:
    """Per account in ``parts``, the GPUs it is owed (:func:`entitlements`)."""
    return {a: e.owed for a, e in entitlements(policy, policy_input, account_of, parts).items()}


def gpus(allocation: Allocation) -> int:
    """The GPUs of all of an allocation's jobs."""
    return sum(share.config.gpus for share in allocation.jobs.values())


def by_type(allocation: Allocation) -> dict[str, int]:
    """An allocation's GPUs per GPU type."""
    count: dict[str, int] = {}
    for share in allocation.jobs.values():
        count[share.config.gpu_type] = count.get(share.config.gpu_type, 0) + share.config.gpus
    return count
