"""Fair shares (issue 20): job weights from account -> user -> job, the usage ledger, the
``shares:`` config section, and the weights' effect on Sia's program."""

from __future__ import annotations

from pathlib import Path

import pytest

from sia_slurm.config import ConfigError, parse_config
from sia_slurm.core import JobKind
from sia_slurm.policy.base import Allocation, ClusterView, JobView, NodeView, PolicyInput
from sia_slurm.policy.shares import (
    DEFAULT_ACCOUNT,
    EQUAL_USERS,
    JobOwner,
    SharesConfig,
    UsageLedger,
    UserShareConfig,
    account_parts,
    job_weights,
)
from sia_slurm.policy.sia import SiaPolicy
from tests.estimators import SyntheticEstimator

CONFIG = """\
state_dir: /var/lib/sia
partitions:
  gpu: {gpu_type: a100, gpus_per_node: 8}
"""


def owners(*spec: tuple[str, str, int]) -> list[JobOwner]:
    """``(account, user, jobs)`` triples as owners ``account-user-i``."""
    return [
        JobOwner(f"{account}-{user}-{i}", user, account)
        for account, user, count in spec
        for i in range(count)
    ]


def test_equal_everything_weighs_every_job_one() -> None:
    jobs = owners(("a", "u", 3), ("b", "v", 3))
    assert job_weights(jobs, EQUAL_USERS) == dict.fromkeys((o.job_id for o in jobs), 1.0)
    # Nobody's name on any job: one pool, today's Sia.
    anonymous = [JobOwner(f"j{i}") for i in range(5)]
    assert set(job_weights(anonymous, EQUAL_USERS).values()) == {1.0}


def test_an_account_with_ten_times_the_jobs_gets_the_same_total_weight() -> None:
    jobs = owners(("big", "u", 20), ("small", "v", 2))
    weights = job_weights(jobs, SharesConfig(accounts={"big": 1, "small": 1}))
    big = sum(w for k, w in weights.items() if k.startswith("big"))
    small = sum(w for k, w in weights.items() if k.startswith("small"))
    assert big == pytest.approx(small) == pytest.approx(11.0)
    assert sum(weights.values()) == pytest.approx(len(jobs))


def test_hierarchy_account_then_user_then_job() -> None:
    shares = SharesConfig(
        accounts={"phys": 3, "bio": 1},
        users={"ann": UserShareConfig("phys", 2), "bob": UserShareConfig("phys", 1)},
    )
    jobs = owners(("x", "ann", 2), ("x", "bob", 1), ("bio", "cy", 1))
    weights = job_weights(jobs, shares)
    n = len(jobs)
    # ann's account comes from the config (phys), not the Slurm account "x" her jobs ran under.
    assert weights["x-ann-0"] == pytest.approx(n * 3 / 4 * 2 / 3 / 2)
    assert weights["x-bob-0"] == pytest.approx(n * 3 / 4 * 1 / 3)
    assert weights["bio-cy-0"] == pytest.approx(n * 1 / 4)


def test_unknown_accounts_take_default_share_and_jobs_without_account_pool() -> None:
    shares = SharesConfig(accounts={"a": 3}, default_share=1)
    assert shares.account_of("u", "") == DEFAULT_ACCOUNT
    parts = account_parts(owners(("a", "u", 1), ("zz", "v", 1)), shares)
    assert parts == {"a": 0.75, "zz": 0.25}


def test_only_accounts_with_live_jobs_split_the_cluster() -> None:
    shares = SharesConfig(accounts={"a": 1, "b": 1, "idle": 8})
    weights = job_weights(owners(("a", "u", 1), ("b", "v", 1)), shares)
    assert set(weights.values()) == {1.0}


def test_usage_factors_weigh_up_the_account_short_of_what_it_was_owed() -> None:
    ledger = UsageLedger(half_life_s=3600, gain=1.0)
    ledger.record(0.0, {"big": 48, "small": 8}, {"big": 32, "small": 16})
    ledger.record(600.0, {"big": 48, "small": 8}, {"big": 32, "small": 16})
    factors = ledger.factors(["big", "small"])
    assert factors["small"] == pytest.approx(16 / 8)  # held half what it was owed
    assert factors["big"] == 1.0  # held more than owed: GPUs small had no use for; not weighed down
    weights = job_weights(owners(("big", "u", 1), ("small", "v", 1)), EQUAL_USERS, factors)
    assert weights["small-v-0"] == pytest.approx(2 * weights["big-u-0"])
    ledger.gain = UsageLedger().gain  # the controller's: the shortfall ratio to the 4th power
    assert ledger.factors(["small"])["small"] == pytest.approx(8.0)  # 2 ** 4 = 16, clipped


def test_an_account_that_holds_what_it_is_owed_banks_nothing() -> None:
    """Owed only what its jobs would take on its slice: an account that cannot use half the
    cluster is not weighed up for the half it leaves (the bank that over-served it later)."""
    ledger = UsageLedger(half_life_s=3600)
    for t in (0.0, 600.0, 1200.0):
        ledger.record(t, {"big": 60, "small": 4}, {"big": 32, "small": 4})
    assert ledger.factors(["big", "small"]) == {"big": 1.0, "small": 1.0}


def test_gpus_beyond_what_was_owed_do_not_cancel_a_later_shortfall() -> None:
    ledger = UsageLedger(half_life_s=1e9, gain=1.0)  # no decay: the sums are exact
    ledger.record(0.0, {"small": 16}, {"small": 8})  # 8 GPUs nobody else wanted
    ledger.record(600.0, {"small": 4}, {"small": 8})  # then short by half
    ledger.record(1200.0, {}, {})
    assert ledger.used["small"] == pytest.approx((8 + 4) * 600)
    assert ledger.factors(["small"])["small"] == pytest.approx(16 / 12)


def test_usage_decays_and_is_clipped() -> None:
    ledger = UsageLedger(half_life_s=100.0, limit=8.0)
    ledger.record(0.0, {"a": 10}, {"a": 10, "b": 4})
    ledger.record(100.0, {}, {})
    assert ledger.used["a"] == pytest.approx(1000.0)
    ledger.record(200.0, {})
    assert ledger.used["a"] == pytest.approx(500.0)  # halved after one half-life
    assert ledger.owed["b"] == pytest.approx(200.0)
    factors = ledger.factors(["a", "b", "c"])
    assert factors == {"a": 1.0, "b": 8.0, "c": 1.0}  # b never ran: up to the clip; c owed nothing


def test_shares_config_rejects_non_positive_shares() -> None:
    with pytest.raises(ValueError, match="share of a"):
        SharesConfig(accounts={"a": 0})
    with pytest.raises(ValueError, match="user u"):
        SharesConfig(users={"u": UserShareConfig("a", -1)})


def test_config_section_parses() -> None:
    text = CONFIG + (
        "shares:\n  accounts: {phys: 2, bio: 1}\n"
        "  users:\n    ann: {account: phys, share: 3}\n    bob: {}\n"
        "  default_share: 0.5\n"
    )
    config = parse_config(text, Path("/etc/sia-slurm/sia.yaml"))
    assert config.shares_configured
    assert dict(config.shares.accounts) == {"phys": 2.0, "bio": 1.0}
    assert config.shares.users["ann"] == UserShareConfig("phys", 3.0)
    assert config.shares.users["bob"] == UserShareConfig(None, 1.0)
    assert config.shares.default_share == 0.5
    plain = parse_config(CONFIG, Path("/etc/sia-slurm/sia.yaml"))
    assert not plain.shares_configured and plain.shares == EQUAL_USERS


@pytest.mark.parametrize(
    ("section", "where", "says"),
    [
        ("shares: [a]", "shares", "expected a mapping"),
        ("shares: {accounts: {phys: 0}}", "shares.accounts.phys", "expected a number > 0"),
        ("shares: {accounts: {phys: many}}", "shares.accounts.phys", "expected a number"),
        (
            "shares: {users: {ann: {account: phys, shares: 2}}}",
            "shares.users.ann.shares",
            "unknown key",
        ),
        (
            "shares: {users: {ann: {account: 'a b'}}}",
            "shares.users.ann.account",
            "Slurm account name",
        ),
        ("shares: {users: {ann: 3}}", "shares.users.ann", "expected a mapping"),
        ("shares: {usage_half_life_s: -1}", "shares.usage_half_life_s", "> 0"),
        ("shares: {usage_factor_limit: 0.5}", "shares.usage_factor_limit", ">= 1"),
        ("shares: {acounts: {}}", "shares.acounts", "did you mean 'accounts'"),
    ],
)
def test_bad_shares_name_file_and_field(section: str, where: str, says: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(CONFIG + section + "\n", Path("/etc/sia-slurm/sia.yaml"))
    text = str(caught.value)
    assert "/etc/sia-slurm/sia.yaml:4" in text and where in text and says in text, text


def test_weights_move_gpus_to_the_heavier_job() -> None:
    """Two identical jobs on 4 GPUs that both would use: with equal weights they split evenly,
    with one weighed 4x it takes more (so it is the weight, not the job order, that decides)."""
    cluster = ClusterView((NodeView("n0", "a100", 4, 4),))
    jobs = tuple(
        JobView(
            name,
            kind=JobKind.ADAPTIVE,
            estimator=SyntheticEstimator({"a100": 100.0}, serial=0.2),
            age=10.0,
            max_gpus_seen=4,
        )
        for name in ("a", "b")
    )
    policy = SiaPolicy()

    def gpus(allocation: Allocation, job: str) -> int:
        share = allocation.get(job)
        return 0 if share is None else share.config.gpus

    even = policy.solve(PolicyInput(cluster, jobs))
    assert (gpus(even, "a"), gpus(even, "b")) == (2, 2)
    for heavy, light in (("a", "b"), ("b", "a")):
        tilted = policy.solve(PolicyInput(cluster, jobs, weights={heavy: 4.0, light: 1.0}))
        assert gpus(tilted, heavy) > gpus(tilted, light), tilted.jobs


def test_policy_input_rejects_bad_weights() -> None:
    cluster = ClusterView((NodeView("n0", "a100", 4, 4),))
    with pytest.raises(ValueError, match="weights"):
        PolicyInput(cluster, (), weights={"a": 0.0})


def test_a_shares_config_pickles_for_the_simulators_worker_processes() -> None:
    """A simulation's config, shares included, goes to sim.parallel's worker processes: a
    mapping proxy does not pickle, and a run with more than one worker failed."""
    import pickle

    from sia_slurm.policy.shares import SharesConfig, UserShareConfig
    from sia_slurm.sim.run import SimulationConfig

    shares = SharesConfig({"physics": 2.0}, {"alice": UserShareConfig("physics", 3.0)}, 0.5)
    config = SimulationConfig(policy="sia", shares=shares)
    assert pickle.loads(pickle.dumps(config)) == config
