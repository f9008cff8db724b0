"""The round passes the site's shares and Slurm's limits to the policy (issue 20): weights from
the config's shares without accounting, from the associations with it, and the associations'
GPU limits as the policy's limits."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.policy.base import Allocation, NodeView, PolicyInput
from sia_slurm.policy.entitlement import weighs_jobs
from sia_slurm.policy.gavel import GavelPolicy
from sia_slurm.policy.parameters import GavelPolicyConfig
from sia_slurm.policy.registry import make_policy
from sia_slurm.policy.shares import SharesConfig
from sia_slurm.policy.site_accounting import Association, SiteAccounting
from sia_slurm.protocol import JobSpec
from sia_slurm.protocol.profile import load_profiles

NODES = (NodeView("a100-1", "a100", 4, 4), NodeView("a100-2", "a100", 4, 4))


class Recording:
    """Sia, remembering the inputs it was given."""

    weighs_jobs = True

    def __init__(self) -> None:
        self.sia = make_policy("sia")
        self.inputs: list[PolicyInput] = []

    def solve(self, policy_input: PolicyInput) -> Allocation:
        self.inputs.append(policy_input)
        return self.sia.solve(policy_input)


def job(sia_id: str, user: str, account: str) -> JobSnapshot:
    return JobSnapshot(JobSpec(sia_id, "cifar10"), JobPhase.PENDING, user=user, account=account)


@pytest.fixture
def jobs() -> tuple[JobSnapshot, ...]:
    return (
        job("b1", "ann", "bio"),
        job("b2", "ann", "bio"),
        job("b3", "ann", "bio"),
        job("p1", "bob", "phys"),
    )


def controller(policy: Recording, shares: SharesConfig | None = None) -> Controller:
    factory = EstimatorFactory(load_profiles(), {"a100": "dgx"})
    return Controller(policy, factory, shares) if shares else Controller(policy, factory)  # type: ignore[arg-type]


def test_without_accounting_every_user_gets_an_equal_share(jobs: tuple[JobSnapshot, ...]) -> None:
    policy = Recording()
    controller(policy).round(ClusterSnapshot(0.0, NODES, jobs))
    seen = policy.inputs[-1]
    assert seen.weights["p1"] == pytest.approx(3 * seen.weights["b1"])  # 1 job vs 3 jobs
    assert sum(seen.weights.values()) == pytest.approx(4) and seen.limits == ()


def test_config_shares_weigh_accounts(jobs: tuple[JobSnapshot, ...]) -> None:
    policy = Recording()
    shares = SharesConfig(accounts={"bio": 3, "phys": 1})
    controller(policy, shares).round(ClusterSnapshot(0.0, NODES, jobs))
    *owed, seen = policy.inputs
    assert seen.weights["b1"] == pytest.approx(seen.weights["p1"])  # 3/4 over 3 jobs vs 1/4
    # the hierarchy the weights come from, for Gavel's water-filling to pass weights down
    assert dict(seen.groups) == {
        "b1": ("bio", "ann"),
        "b2": ("bio", "ann"),
        "b3": ("bio", "ann"),
        "p1": ("phys", "bob"),
    }
    # What each account is owed, before the round's own solve: its jobs alone on the whole
    # cluster (solo), on its part (bio 3/4 of the 8 A100s: one whole node and half the other;
    # phys 1/4) and on what the other's solo leaves (new jobs start on one GPU each: phys's
    # solo takes 1 of the 8, bio's 3).
    assert [sorted(j.job_id for j in i.jobs) for i in owed] == [
        ["b1", "b2", "b3"],
        ["p1"],
        ["b1", "b2", "b3"],
        ["b1", "b2", "b3"],
        ["p1"],
        ["p1"],
    ]
    assert [i.cluster.total_capacity for i in owed] == [8, 8, 6, 7, 2, 5]
    assert all(not i.groups and not i.weights for i in owed)
    assert seen.cluster.total_capacity == 8 and len(seen.jobs) == 4


def test_static_shares_solve_once(jobs: tuple[JobSnapshot, ...]) -> None:
    policy = Recording()
    shares = SharesConfig(accounts={"bio": 3, "phys": 1}, usage_factor_limit=1)
    controller(policy, shares).round(ClusterSnapshot(0.0, NODES, jobs))
    assert len(policy.inputs) == 1


class Counting(Recording):
    """Any policy, remembering its inputs; it weighs jobs where the policy does."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.sia = make_policy(name)
        self.weighs_jobs = weighs_jobs(self.sia)


@pytest.mark.parametrize("name", ["fifo", "gavel"])
def test_policies_without_weights_skip_the_owed_solves(
    jobs: tuple[JobSnapshot, ...], name: str
) -> None:
    policy = Counting(name)  # gavel: max_sum_throughput, the default, has no weights
    assert not policy.weighs_jobs
    shares = SharesConfig(accounts={"bio": 3, "phys": 1})
    controller(policy, shares).round(ClusterSnapshot(0.0, NODES, jobs))
    assert len(policy.inputs) == 1  # the round's own solve, no solve per account


def test_which_policies_weigh_jobs() -> None:
    assert weighs_jobs(make_policy("sia"))
    assert weighs_jobs(GavelPolicy(GavelPolicyConfig(objective="max_min_fairness")))
    assert not weighs_jobs(make_policy("pollux"))


def test_accounting_shares_and_limits_replace_the_config(jobs: tuple[JobSnapshot, ...]) -> None:
    site = SiteAccounting(
        (
            Association("c", "root", "", "", 1, None, None, ()),
            Association("c", "bio", "", "root", 1, 2, None, ()),
            Association("c", "phys", "", "root", 3, None, None, ()),
        )
    )
    policy = Recording()
    shares = SharesConfig(accounts={"bio": 3, "phys": 1})  # what accounting overrides
    outcome = controller(policy, shares).round(
        replace(ClusterSnapshot(0.0, NODES, jobs), site=site)
    )
    seen = policy.inputs[-1]
    assert seen.weights["p1"] == pytest.approx(9 * seen.weights["b1"])  # 3:1 for phys, 3 jobs
    (limit,) = seen.limits
    assert limit.job_ids == {"b1", "b2", "b3"} and limit.gpus == 2
    granted = sum(a.config.gpus for k, a in outcome.allocation.jobs.items() if k.startswith("b"))
    assert granted <= 2
