"""FIFO, Gavel and Pollux baselines, and the policy registry."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import JobView, NodeShare, PolicyInput
from sia_slurm.policy.fifo import FifoPolicy, FifoPolicyConfig
from sia_slurm.policy.placement import place
from sia_slurm.policy.pollux import PolluxPolicy, PolluxPolicyConfig, build_problem, warm_start
from sia_slurm.policy.registry import POLICIES, make_policy
from sia_slurm.policy.sia import SiaPolicyConfig
from tests.estimators import SyntheticEstimator, make_cluster


def rigid(job_id: str, gpus: int, speed: dict[str, float], **kwargs) -> JobView:
    estimator = SyntheticEstimator(speed=speed)
    return JobView(job_id, JobKind.RIGID, estimator, requested_gpus=gpus, **kwargs)


# FIFO


def test_fifo_runs_in_arrival_order_at_requested_size_on_first_type_that_fits():
    cluster = make_cluster([("A", 1, 4), ("B", 1, 4)])
    jobs = (
        rigid("late", 1, {"A": 1, "B": 1}, submit_time=3),
        rigid("first", 4, {"A": 1, "B": 1}, submit_time=1),
        rigid("second", 2, {"A": 1, "B": 1}, submit_time=2),
    )
    allocation = FifoPolicy().solve(PolicyInput(cluster, jobs))
    assert allocation.jobs["first"].config == Configuration("A", 1, 4)
    assert allocation.jobs["second"].config == Configuration("B", 1, 2)
    assert allocation.jobs["late"].config == Configuration("B", 1, 1)


def test_fifo_blocks_behind_a_job_that_does_not_fit_unless_backfilling():
    cluster = make_cluster([("A", 1, 4)])
    running = rigid("run", 2, {"A": 1}, current=Configuration("A", 1, 2))
    jobs = (
        running,
        rigid("big", 4, {"A": 1}, submit_time=1),
        rigid("small", 1, {"A": 1}, submit_time=2),
    )
    strict = FifoPolicy().solve(PolicyInput(cluster, jobs))
    assert set(strict.jobs) == {"run"}
    backfill = FifoPolicy(FifoPolicyConfig(backfill=True)).solve(PolicyInput(cluster, jobs))
    assert set(backfill.jobs) == {"run", "small"}


def test_fifo_grants_only_shapes_that_fit_on_nodes():
    """Three 4-GPU nodes with one GPU busy on each: 9 GPUs are free, but no two whole nodes, so
    an 8-GPU (2 x 4) job must wait instead of being granted GPUs placement cannot give.
    (Gavel grants by GPU count and spreads the job: tests/policy/test_gavel.py.)"""
    cluster = make_cluster([("A", 3, 4)])
    one = Configuration("A", 1, 1)
    small = tuple(
        rigid(f"s{i}", 1, {"A": 1}, current=one, placement=(NodeShare(f"A-{i}", 1),))
        for i in range(3)
    )
    jobs = (*small, rigid("big", 8, {"A": 1}, submit_time=1))
    fifo = FifoPolicy().solve(PolicyInput(cluster, jobs))
    assert set(fifo.jobs) == {"s0", "s1", "s2"}
    assert place(cluster, fifo, jobs).unplaced == ()


# Pollux


def pollux_jobs(count: int, seed: int) -> tuple[JobView, ...]:
    rng = np.random.default_rng(seed)
    return tuple(
        JobView(
            f"j{i}",
            JobKind.ADAPTIVE,
            SyntheticEstimator(speed={"A": float(rng.uniform(1, 3)), "B": 2.0}, serial=0.05),
            age=1000,
            max_gpus_seen=int(rng.integers(0, 8)),
        )
        for i in range(count)
    )


def assert_pollux_valid(cluster, allocation, jobs) -> None:
    used = allocation.gpus_used()
    assert all(used[t] <= cluster.types[t].capacity for t in used)
    placement = place(cluster, allocation, jobs)
    assert placement.unplaced == ()
    for share in allocation.jobs.values():
        assert share.config.nodes <= 16


def test_pollux_allocates_within_capacity_deterministically():
    cluster = make_cluster([("A", 4, 4), ("B", 2, 8)])
    jobs = pollux_jobs(10, 0)
    config = PolluxPolicyConfig(generations=30)
    first = PolluxPolicy(config).solve(PolicyInput(cluster, jobs))
    again = PolluxPolicy(config).solve(PolicyInput(cluster, jobs))
    assert {k: v.config for k, v in first.jobs.items()} == {
        k: v.config for k, v in again.jobs.items()
    }
    assert_pollux_valid(cluster, first, jobs)
    assert len(first.jobs) == 10  # enough GPUs for everyone: leaving a job out ruins the mean


def test_pollux_respects_growth_cap_min_gpus_and_one_distributed_job_per_node():
    cluster = make_cluster([("A", 4, 4)])
    jobs = (
        JobView("new", JobKind.ADAPTIVE, SyntheticEstimator(speed={"A": 1.0}, serial=0.0)),
        JobView(
            "big",
            JobKind.ADAPTIVE,
            SyntheticEstimator(speed={"A": 1.0}, serial=0.0),
            min_gpus=8,
            max_gpus_seen=8,
        ),
    )
    allocation = PolluxPolicy(PolluxPolicyConfig(generations=40)).solve(PolicyInput(cluster, jobs))
    assert allocation.jobs["new"].config.gpus == 1
    assert allocation.jobs["big"].config.gpus >= 8
    state = allocation.state
    distributed = (state.replicas > 0).sum(axis=1) > 1
    assert ((state.replicas[distributed] > 0).sum(axis=0) <= 1).all()


def test_pollux_keeps_restoring_jobs_and_warm_starts_from_its_state():
    cluster = make_cluster([("A", 2, 4)])
    current = Configuration("A", 1, 2)
    restoring = JobView(
        "r",
        JobKind.ADAPTIVE,
        SyntheticEstimator(speed={"A": 1.0}),
        current=current,
        placement=(NodeShare("A-1", 2),),
        restoring=True,
        max_gpus_seen=2,
    )
    jobs = (restoring, *pollux_jobs(3, 1)[:3])
    jobs = tuple(
        dataclasses.replace(j, estimator=SyntheticEstimator(speed={"A": 1.0})) for j in jobs
    )
    config = PolluxPolicyConfig(generations=20)
    first = PolluxPolicy(config).solve(PolicyInput(cluster, jobs))
    assert first.jobs["r"].config == current
    reordered = PolicyInput(cluster, jobs[::-1], first)
    warm = warm_start(reordered, build_problem(reordered, config))
    assert (warm == first.state.replicas[::-1]).all()


def test_pollux_repairs_a_placement_across_types_to_one_type():
    cluster = make_cluster([("A", 1, 4), ("B", 1, 4)])
    jobs = (
        JobView(
            "j",
            JobKind.ADAPTIVE,
            SyntheticEstimator(speed={"A": 1, "B": 1}, serial=0.0),
            max_gpus_seen=4,
        ),
    )
    allocation = PolluxPolicy(PolluxPolicyConfig(generations=30)).solve(PolicyInput(cluster, jobs))
    config = allocation.jobs["j"].config
    assert config.gpus == 4 and config.nodes == 1  # never 4 + 4 across the two types


# Registry


def test_registry_builds_every_policy_and_rejects_unknown_names():
    for name in POLICIES:
        assert hasattr(make_policy(name), "solve")
    with pytest.raises(ValueError, match="valid policies: fifo, gavel, pollux, sia"):
        make_policy("slurm")
    with pytest.raises(TypeError, match="SiaPolicyConfig"):
        make_policy("sia", FifoPolicyConfig())
    assert make_policy("sia", SiaPolicyConfig(p=-1.0)).config.p == -1.0


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_handles_an_empty_round_and_places_validly(name):
    cluster = make_cluster([("A", 2, 4), ("B", 1, 8)])
    assert make_policy(name).solve(PolicyInput(cluster, ())).jobs == {}
    jobs = tuple(dataclasses.replace(j, requested_gpus=2) for j in pollux_jobs(6, 2))
    allocation = make_policy(name).solve(PolicyInput(cluster, jobs))
    assert_pollux_valid(cluster, allocation, jobs)
    granted = {job_id: share.config for job_id, share in allocation.jobs.items()}
    # 16 GPUs, six jobs asking for 2 each: there is room for all, and every policy runs them all
    # (FIFO and Gavel at the size asked; for Pollux and Sia one left out ruins the power mean).
    assert set(granted) == {job.job_id for job in jobs}
    EVERY_POLICY_EXPECTATIONS[name](jobs, granted)


def _fifo_expectation(jobs, granted) -> None:
    """Arrival order (all arrive at 0: by id) at the size asked, on the first type in the
    cluster's order with room: A's 8 GPUs hold the first four, B the last two."""
    assert granted == {
        job.job_id: Configuration("A" if i < 4 else "B", 1, 2) for i, job in enumerate(jobs)
    }


def _gavel_expectation(jobs, granted) -> None:
    """At the size asked, each on the type it is faster on: here that fits (two jobs faster on
    A take 4 of its 8 GPUs, four faster on B take its 8)."""
    faster = {job.job_id: max(job.estimator.speed, key=job.estimator.speed.get) for job in jobs}
    assert sorted(faster.values()).count("A") == 2
    assert granted == {job_id: Configuration(t, 1, 2) for job_id, t in faster.items()}


def _growth_cap_expectation(jobs, granted) -> None:
    """Elastic: any size up to twice the most GPUs a job has run on (1 before its first run)."""
    for job in jobs:
        assert 1 <= granted[job.job_id].gpus <= max(2 * job.max_gpus_seen, 1), job.job_id


def _sia_expectation(jobs, granted) -> None:
    """The growth cap, and only Sia's configurations: a power of two inside one node (A: 4 GPUs
    per node, B: 8) or whole nodes."""
    _growth_cap_expectation(jobs, granted)
    per_node = {"A": 4, "B": 8}
    for job_id, config in granted.items():
        gpus, nodes = config.gpus, config.nodes
        whole_nodes = nodes > 1 and gpus == nodes * per_node[config.gpu_type]
        in_one_node = nodes == 1 and gpus <= per_node[config.gpu_type] and gpus & (gpus - 1) == 0
        assert whole_nodes or in_one_node, (job_id, config)


EVERY_POLICY_EXPECTATIONS = {
    "fifo": _fifo_expectation,
    "gavel": _gavel_expectation,
    "pollux": _growth_cap_expectation,
    "sia": _sia_expectation,
    "sia-paper": _sia_expectation,
}


def test_every_policy_has_an_expectation():
    assert set(EVERY_POLICY_EXPECTATIONS) == set(POLICIES)
