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
from sia_slurm.policy.entitlement import Entitlement, entitlements, owed_gpus, share_cluster

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
    last = Allocation(jobs={}, time=0.0, round_index=0, state="Gavel's round timing")
    given = PolicyInput(CLUSTER, jobs, previous=last, weights={"a1": 2.0, "a2": 2.0, "b1": 0.5})
    owed = owed_gpus(policy, given, account_of, {"a": 0.75, "b": 0.25, "idle": 0.0})
    # round(7 * 0.75), round(7 * 0.25): each solo allocation takes all 7 t4 GPUs, so what the
    # other leaves (24 rtx GPUs, which Greedy does not use) adds nothing.
    assert owed == {"a": 5, "b": 2, "idle": 0}
    solo_a, solo_b, alone_a, leftover_a, alone_b, leftover_b = policy.inputs
    assert [j.job_id for j in solo_a.jobs] == ["a1", "a2"] and solo_a.weights == {}
    assert [j.job_id for j in solo_b.jobs] == ["b1"] and solo_b.cluster == CLUSTER
    assert all(i.previous is None for i in policy.inputs)  # each a decision of its own
    assert alone_a.cluster.types["t4"].capacity == 5 and alone_b.cluster.types["t4"].capacity == 2
    assert leftover_a.cluster.types["t4"].capacity == 0  # b's solo takes all of them
    assert leftover_b.cluster.types["t4"].capacity == 0  # and a's
    assert leftover_a.cluster.types["rtx"].capacity == 24


class Wants:
    """Each job takes up to what it wants of one GPU type, in job order."""

    def __init__(self, wants: dict[str, tuple[str, int]]) -> None:
        self.wants = wants

    def solve(self, policy_input: PolicyInput) -> Allocation:
        left = {name: view.capacity for name, view in policy_input.cluster.types.items()}
        jobs = {}
        for job in policy_input.jobs:
            gpu_type, want = self.wants[job.job_id]
            if take := min(want, left[gpu_type]):
                left[gpu_type] -= take
                jobs[job.job_id] = JobAllocation(Configuration(gpu_type, 1, take), 8, 8, 1, 1.0)
        return Allocation(jobs=jobs, time=0.0, round_index=0)


def entitled(wants: dict[str, tuple[str, int]]) -> dict[str, Entitlement]:
    jobs = tuple(JobView(name, JobKind.ADAPTIVE, None) for name in wants)  # type: ignore[arg-type]
    account_of = {name: name[0] for name in wants}
    return entitlements(Wants(wants), PolicyInput(CLUSTER, jobs), account_of, {"a": 0.5, "b": 0.5})


def test_an_account_is_owed_what_the_others_leave_unused() -> None:
    # b's job wants only t4 GPUs, so a's job may have every rtx GPU, beyond its half (12).
    got = entitled({"a1": ("rtx", 20), "b1": ("t4", 4)})
    assert got["a"] == Entitlement(alone=12, solo=20, leftover=20) and got["a"].owed == 20
    assert got["b"] == Entitlement(alone=4, solo=4, leftover=4) and got["b"].owed == 4


def test_what_another_account_would_take_is_not_owed_beyond_the_part() -> None:
    # Both want 20 of the 24 rtx GPUs: each is owed its half, not what the other leaves (4).
    got = entitled({"a1": ("rtx", 20), "b1": ("rtx", 20)})
    assert got["a"] == Entitlement(alone=12, solo=20, leftover=4) and got["a"].owed == 12
    assert got["b"].owed == 12


def test_what_is_left_is_counted_type_by_type() -> None:
    # b takes all 7 t4 GPUs alone; what it leaves (rtx) is of no use to a's t4 job.
    got = entitled({"a1": ("t4", 7), "b1": ("t4", 7)})
    assert got["a"] == Entitlement(alone=4, solo=7, leftover=0)
