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

Computing it takes one solve per account with live jobs, on that account's jobs only; the
controller does it only when two or more accounts have live jobs, the usage factor is on and
the policy reads the weights at all (:func:`weighs_jobs`: Sia, Gavel's ``max_min_fairness``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

from sia_slurm.policy.base import ClusterView, Policy, PolicyInput


def weighs_jobs(policy: Policy) -> bool:
    """Whether ``policy``'s objective reads :attr:`PolicyInput.weights` (its ``weighs_jobs``
    attribute; absent: no). A policy that ignores the weights (Pollux, FIFO, Gavel's
    throughput objectives) gains nothing from the usage factor, so the controller does not
    spend a solve per account on what each is owed."""
    return bool(getattr(policy, "weighs_jobs", False))


def share_cluster(cluster: ClusterView, fraction: float) -> ClusterView:
    """The cluster with ``fraction`` of every GPU type's usable GPUs, whole nodes first (in
    the order the nodes are listed), the last node partly: an account's slice of it."""
    left = {name: round(view.capacity * fraction) for name, view in cluster.types.items()}
    nodes = []
    for node in cluster.nodes:
        usable = min(node.usable_gpus, left[node.gpu_type])
        left[node.gpu_type] -= usable
        nodes.append(replace(node, usable_gpus=usable))
    return ClusterView(tuple(nodes))


def owed_gpus(
    policy: Policy,
    policy_input: PolicyInput,
    account_of: Mapping[str, str],
    parts: Mapping[str, float],
) -> dict[str, int]:
    """Per account in ``parts`` (its fraction of the cluster), the GPUs ``policy`` allocates
    its jobs (``account_of``: job id -> account) alone on :func:`share_cluster` of that
    fraction; the site's limits and the other accounts' jobs left out."""
    owed = {}
    for account, part in parts.items():
        jobs = tuple(j for j in policy_input.jobs if account_of.get(j.job_id) == account)
        if not jobs:
            owed[account] = 0
            continue
        alone = replace(
            policy_input,
            cluster=share_cluster(policy_input.cluster, part),
            jobs=jobs,
            weights={},
            limits=(),
        )
        allocation = policy.solve(alone)
        owed[account] = sum(share.config.gpus for share in allocation.jobs.values())
    return owed
