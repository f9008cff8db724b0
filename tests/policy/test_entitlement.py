"""What an account is owed (issue 20): its jobs alone on its slice of the cluster."""

from __future__ import annotations

from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import (
    Allocation,
    ClusterView,
    JobAllocation,
    JobView,
    NodeView,
    PolicyInput,
)
from sia_slurm.policy.entitlement import owed_gpus, share_cluster

CLUSTER = ClusterView(
    (
        NodeView("t4-1", "t4", 4, 4),
        NodeView("t4-2", "t4", 4, 3),  # one GPU held by an unmanaged job
        NodeView("rtx-1", "rtx", 8, 8),
        NodeView("rtx-2", "rtx", 8, 8),
        NodeView("rtx-3", "rtx", 8, 8),
    )
)


def test_share_cluster_takes_whole_nodes_first() -> None:
    half = share_cluster(CLUSTER, 0.5)
    assert [n.usable_gpus for n in half.nodes] == [4, 0, 8, 4, 0]  # round(7 / 2), 24 / 2
    assert half.types["rtx"].capacity == 12 and half.types["t4"].capacity == 4
    assert [n.total_gpus for n in half.nodes] == [n.total_gpus for n in CLUSTER.nodes]


class Greedy:
    """Every job takes as many GPUs of the first type as are left (records its inputs)."""

    def __init__(self) -> None:
        self.inputs: list[PolicyInput] = []

    def solve(self, policy_input: PolicyInput) -> Allocation:
        self.inputs.append(policy_input)
        left = policy_input.cluster.types["t4"].capacity
        jobs = {}
        for job in policy_input.jobs:
            if left:
                jobs[job.job_id] = JobAllocation(Configuration("t4", 1, left), 8, 8, 1, 1.0)
                left = 0
        return Allocation(jobs=jobs, time=0.0, round_index=0)


def test_owed_gpus_solves_each_account_alone_on_its_part() -> None:
    policy = Greedy()
    jobs = tuple(JobView(name, JobKind.ADAPTIVE, None) for name in ("a1", "a2", "b1"))  # type: ignore[arg-type]
    account_of = {"a1": "a", "a2": "a", "b1": "b"}
    given = PolicyInput(CLUSTER, jobs, weights={"a1": 2.0, "a2": 2.0, "b1": 0.5})
    owed = owed_gpus(policy, given, account_of, {"a": 0.75, "b": 0.25, "idle": 0.0})
    assert owed == {"a": 5, "b": 2, "idle": 0}  # round(7 * 0.75), round(7 * 0.25)
    seen_a, seen_b = policy.inputs
    assert [j.job_id for j in seen_a.jobs] == ["a1", "a2"] and seen_a.weights == {}
    assert [j.job_id for j in seen_b.jobs] == ["b1"]
