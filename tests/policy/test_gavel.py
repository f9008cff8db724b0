"""Gavel as the Sia artifact runs it: objectives, priority, work-conserving ranking, workers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import Allocation, JobAllocation, JobView, NodeShare, PolicyInput
from sia_slurm.policy.gavel import (
    GavelPolicy,
    GavelPolicyConfig,
    GavelState,
    credited,
    job_groups,
    ranked_pairs,
    requested_shapes,
    solve_lp,
)
from sia_slurm.policy.placement import place
from sia_slurm.policy.shares import JobOwner, SharesConfig, job_weights
from sia_slurm.policy.workers import (
    WorkerAssignmentError,
    WorkerRequest,
    assign_workers,
    even_shares,
)
from tests.estimators import SyntheticEstimator, TableEstimator, make_cluster

ANY = GavelPolicy(GavelPolicyConfig(workers="any"))  # the artifact's rule, the simulator's


def rigid(job_id: str, gpus: int, speed: dict[str, float], **kwargs) -> JobView:
    return JobView(
        job_id, JobKind.RIGID, SyntheticEstimator(speed=speed), requested_gpus=gpus, **kwargs
    )


def table_job(job_id: str, gpus: int, steps: dict[str, float], **kwargs) -> JobView:
    """A job whose throughput on each type is ``steps`` optimizer steps per second (batch 32)."""
    per_type = {t: {gpus: 32 * s} for t, s in steps.items()}
    return JobView(
        job_id,
        JobKind.RIGID,
        TableEstimator(per_type=per_type),
        requested_gpus=gpus,
        **kwargs,
    )


# Objectives


def test_max_sum_throughput_maximises_raw_throughput_without_normalising():
    """One GPU, a job at 10 steps/s and one at 1: the raw sum runs the fast one all the time
    (X = 1, 0); normalised per job the two are alike and max-min fairness splits (1/2, 1/2)."""
    throughput = np.array([[10.0], [1.0]])
    gpus, capacity = np.array([1.0, 1.0]), np.array([1.0])
    assert solve_lp(throughput, gpus, capacity, "max_sum_throughput")[:, 0] == pytest.approx(
        [1.0, 0.0]
    )
    assert solve_lp(throughput, gpus, capacity, "max_min_fairness")[:, 0] == pytest.approx(
        [0.5, 0.5]
    )


def test_hierarchical_max_min_fairness_splits_across_accounts_then_within():
    """Gavel's hierarchy: accounts 1:1, account A with three jobs, B with one (weights from
    policy/shares.py: 4 * 1/2 / 3 and 4 * 1/2). Two GPUs: each account gets one GPU's time,
    A's split between its three jobs; without weights every job gets half a GPU."""
    throughput = np.array([[1.0]] * 4)
    gpus, capacity = np.ones(4), np.array([2.0])
    weights = job_weights(
        [JobOwner(f"a{i}", "ann", "A") for i in range(3)] + [JobOwner("b0", "bob", "B")],
        SharesConfig(accounts={"A": 1, "B": 1}),
    )
    w = np.array([weights[j] for j in ("a0", "a1", "a2", "b0")])
    x = solve_lp(throughput, gpus, capacity, "max_min_fairness", w)[:, 0]
    assert x == pytest.approx([1 / 3, 1 / 3, 1 / 3, 1.0], abs=1e-5)
    assert solve_lp(throughput, gpus, capacity, "max_min_fairness")[:, 0] == pytest.approx(
        [0.5] * 4, abs=1e-5
    )
    # The raw-throughput objective has no hierarchy in Gavel: weights leave it alone.
    plain = solve_lp(throughput, gpus, capacity, "max_sum_throughput")
    assert solve_lp(throughput, gpus, capacity, "max_sum_throughput", w) == pytest.approx(plain)

    # The policy passes the round's weights: B's only job runs in the first round.
    cluster = make_cluster([("A", 1, 2)])
    jobs = tuple(rigid(j, 1, {"A": 1}) for j in ("a0", "a1", "a2", "b0"))
    fair = GavelPolicy(GavelPolicyConfig(objective="max_min_fairness"))
    assert "b0" in fair.solve(PolicyInput(cluster, jobs, weights=weights)).jobs
    assert "b0" not in fair.solve(PolicyInput(cluster, jobs)).jobs  # ties: input order


def test_job_groups_are_the_inputs_hierarchy_and_jobs_without_one_stand_alone():
    cluster = make_cluster([("A", 1, 2)])
    jobs = tuple(rigid(j, 1, {"A": 1}) for j in ("a0", "a1", "b0", "x"))
    groups = {"a0": ("A", "ann"), "a1": ("A", "bob"), "b0": ("B", "ann")}
    accounts, users = job_groups(PolicyInput(cluster, jobs, groups=groups))
    assert len(set(accounts)) == 3 and accounts[0] == accounts[1] != accounts[2]
    assert users[0] != users[1] and len(set(zip(accounts, users, strict=True))) == 4
    assert accounts[3] not in accounts[:3] and users[3] not in users[:3]  # x stands alone
    assert job_groups(PolicyInput(cluster, jobs)) == []


def test_max_sum_throughput_respects_gpu_and_job_constraints():
    """Types A (4 GPUs) and B (2). Per GPU, "wide" (4 GPUs; 8 steps/s on A, 4 on B) is worth
    2 on A and 1 on B, "narrow" (1 GPU) 3 on A and 1 on B. The unique optimum (value 10): narrow
    all on A, wide the 3 GPUs left on A (X = 3/4) and the rest of its time on B (X = 1/4, within
    B's X <= 1/2); every job's shares sum to at most 1 and no type is oversubscribed."""
    throughput = np.array([[8.0, 4.0], [3.0, 1.0]])
    x = solve_lp(throughput, np.array([4.0, 1.0]), np.array([4.0, 2.0]), "max_sum_throughput")
    assert x.sum(axis=1) == pytest.approx([1.0, 1.0])
    assert np.all((x * np.array([[4.0], [1.0]])).sum(axis=0) <= np.array([4.0, 2.0]) + 1e-9)
    assert x[1] == pytest.approx([1.0, 0.0])
    assert x[0] == pytest.approx([0.75, 0.25])


def test_requested_shapes_give_optimizer_steps_per_second():
    """T is samples/s over the global batch: the artifact's 1 / iteration time."""
    cluster = make_cluster([("A", 1, 4), ("B", 1, 2)])
    job = table_job("j", 4, {"A": 5.0, "B": 7.0})
    shapes, throughput = requested_shapes(PolicyInput(cluster, (job,)))
    assert shapes[0] == [Configuration("A", 1, 4), None]  # 4 GPUs do not fit B's 2
    assert throughput[0] == pytest.approx([5.0, 0.0])


def test_config_default_is_the_artifacts_objective_and_others_stay_named():
    assert GavelPolicyConfig().objective == "max_sum_throughput"
    assert GavelPolicyConfig().water_filling  # max_min_fairness water-fills unless told not to
    for name in ("max_min_fairness", "max_total_throughput"):
        assert GavelPolicyConfig(objective=name).objective == name
    with pytest.raises(ValueError, match="max_sum_throughput"):
        GavelPolicyConfig(objective="fastest")


# Priority


def test_new_job_is_credited_half_a_round_on_every_type_and_totals_keep_finished_jobs():
    cluster = make_cluster([("A", 1, 1), ("B", 1, 1)])
    old = GavelState({"gone": {"A": 900.0, "B": 180.0}, "old": {"A": 540.0, "B": 180.0}}, 0.0)
    old = dataclasses.replace(old, type_time={"A": 1440.0, "B": 360.0})
    previous = Allocation({}, state=old)
    jobs = (rigid("old", 1, {"A": 1, "B": 1}), rigid("new", 1, {"A": 1, "B": 1}))
    received, type_time = credited(PolicyInput(cluster, jobs, previous), 360.0)
    assert received == {"old": {"A": 540.0, "B": 180.0}, "new": {"A": 180.0, "B": 180.0}}
    assert type_time == {"A": 1620.0, "B": 540.0}  # "gone" finished: its time still counts


def test_priority_is_share_over_fraction_of_type_time_and_zero_shares_rank_last():
    """On A (1,800 s credited in all): "starved" has had 180 s (fraction 0.1), "fed" 900 s
    (0.5). With X = 0.5 each, starved's priority 5 beats fed's 1; "idle" (X = 0) comes last
    on A but is still ranked, as are all pairs on B."""
    cluster = make_cluster([("A", 1, 1), ("B", 1, 1)])
    jobs = tuple(rigid(name, 1, {"A": 1, "B": 1}) for name in ("fed", "starved", "idle"))
    shapes = [[Configuration("A", 1, 1), Configuration("B", 1, 1)]] * 3
    targets = np.array([[0.5, 0.0], [0.5, 0.0], [0.0, 0.0]])
    received = {
        "fed": {"A": 900.0, "B": 180.0},
        "starved": {"A": 180.0, "B": 180.0},
        "idle": {"A": 720.0, "B": 180.0},
    }
    pairs = ranked_pairs(
        PolicyInput(cluster, jobs), shapes, targets, received, {"A": 1800.0, "B": 540.0}
    )
    names = [(jobs[m].job_id, cluster.gpu_types[j]) for m, j in pairs]
    assert names[:2] == [("starved", "A"), ("fed", "A")]
    assert sorted(names[2:]) == sorted(
        [("idle", "A"), ("fed", "B"), ("starved", "B"), ("idle", "B")]
    )
    assert len(names) == 6


# The mechanism over rounds

# Two jobs that never fit together on one 2-GPU node: "wide" asks for 2 GPUs, "narrow" for 1
# (SyntheticEstimator, fixed batch 64: wide 2 / 1.1 samples/s, narrow 1 sample/s).
# - max_sum_throughput: per GPU wide is worth 0.909/64/2 < narrow's 1/64, so X_narrow = 1 and
#   wide gets the GPU left: X_wide = 1/2;
# - max_total_throughput (normalised: each job 1.5 X): the only optimum is the same (1/2, 1);
# - max_min_fairness: 2 X_wide + X_narrow <= 2 with equal normalised shares: 2/3 each.
# The priority rule realises X: over 12 rounds of 360 s the runs split in X's proportions.
TIME_SHARE_CASES = {
    "max_sum_throughput": ({"wide": 1 / 2, "narrow": 1.0}, {"wide": 4, "narrow": 8}),
    "max_total_throughput": ({"wide": 1 / 2, "narrow": 1.0}, {"wide": 4, "narrow": 8}),
    "max_min_fairness": ({"wide": 2 / 3, "narrow": 2 / 3}, {"wide": 6, "narrow": 6}),
}


@pytest.mark.parametrize("objective", sorted(TIME_SHARE_CASES))
def test_gavel_time_shares_one_node_by_priority_across_rounds(objective):
    targets, rounds_run = TIME_SHARE_CASES[objective]
    cluster = make_cluster([("A", 1, 2)])
    jobs = (rigid("wide", 2, {"A": 1}), rigid("narrow", 1, {"A": 1}))
    _, throughput = requested_shapes(PolicyInput(cluster, jobs))
    solved = solve_lp(throughput, np.array([2.0, 1.0]), np.array([2.0]), objective)
    # X is rounded to 5 decimals, as the artifact rounds it
    assert solved[:, 0] == pytest.approx([targets["wide"], targets["narrow"]], abs=1e-5)

    policy = GavelPolicy(GavelPolicyConfig(objective=objective))
    previous, ran = None, []
    for index in range(12):
        now = 360.0 * index
        aged = tuple(dataclasses.replace(job, age=now) for job in jobs)
        allocation = policy.solve(PolicyInput(cluster, aged, previous, now=now))
        assert allocation.info.status == "optimal"
        (winner,) = allocation.jobs  # never both: 3 GPUs asked of 2
        ran.append(winner)
        if index == 0:  # a solve inside the round keeps the allocation and credits nothing
            mid = policy.solve(PolicyInput(cluster, aged, allocation, now=60.0))
            assert set(mid.jobs) == {winner} and mid.info.status == "kept"
            assert mid.state == allocation.state
        previous = allocation
    assert {job: ran.count(job) for job in rounds_run} == rounds_run
    state = previous.state
    assert isinstance(state, GavelState)
    # Credited: half a round at the start, then 360 s per round won (the last one included).
    for job in rounds_run:
        assert dict(state.received[job]) == pytest.approx({"A": 180.0 + 360.0 * ran.count(job)})
    assert dict(state.type_time) == pytest.approx({"A": 360.0 + 360.0 * 12})


def test_gavel_is_work_conserving_a_zero_share_job_takes_leftover_gpus():
    """Five 1-GPU nodes; three 2-GPU jobs worth 5 steps/s per GPU and a 1-GPU job worth 1.
    The LP gives the 2-GPU jobs 5 GPUs' worth (X summing to 2.5) and the small one X = 0. Two
    2-GPU jobs run; the third needs 2 GPUs and one is left, which the small job gets instead
    of it sitting idle (GPU counts per type: the 2-GPU jobs span two nodes each)."""
    cluster = make_cluster([("A", 5, 1)])
    jobs = (
        *(table_job(f"big{i}", 2, {"A": 10.0}) for i in range(3)),
        table_job("small", 1, {"A": 1.0}),
    )
    allocation = GavelPolicy().solve(PolicyInput(cluster, jobs))
    granted = {job: share.config for job, share in allocation.jobs.items()}
    assert len([j for j in granted if j.startswith("big")]) == 2
    assert granted["small"] == Configuration("A", 1, 1)
    assert sum(c.gpus for c in granted.values()) == 5
    assert all(c.nodes == 2 for j, c in granted.items() if j.startswith("big"))
    placement = place(cluster, allocation, jobs)
    assert placement.unplaced == ()
    assert {j: placement.assignments[j] for j in granted} == dict(allocation.node_hints)


def test_gavel_grants_by_gpu_count_spreading_over_nodes():
    """Three 4-GPU nodes, one GPU of each held by a 1-GPU job: an 8-GPU job that is granted
    takes its GPUs wherever they are (larger jobs pick first, node by node), and the small jobs
    whose GPUs it took move to the GPUs left; the one whose GPU is still free keeps it."""
    cluster = make_cluster([("A", 3, 4)])
    one = Configuration("A", 1, 1)
    small = tuple(
        rigid(f"s{i}", 1, {"A": 1}, current=one, placement=(NodeShare(f"A-{i}", 1),))
        for i in range(3)
    )
    jobs = (*small, rigid("big", 8, {"A": 1}, submit_time=1))
    allocation = ANY.solve(PolicyInput(cluster, jobs, now=0.0))
    assert set(allocation.jobs) == {"s0", "s1", "s2", "big"}
    assert allocation.node_hints["big"] == (NodeShare("A-0", 4), NodeShare("A-1", 4))
    assert allocation.jobs["big"].config == Configuration("A", 2, 8)
    assert allocation.node_hints["s2"] == (NodeShare("A-2", 1),)  # kept
    assert {allocation.node_hints[f"s{i}"] for i in (0, 1)} == {(NodeShare("A-2", 1),)}
    placement = place(cluster, allocation, jobs)
    assert placement.unplaced == ()
    assert set(placement.moved) == set()
    assert placement.assignments["s0"] == (NodeShare("A-2", 1),)  # moved by the binding hint


def test_gavel_spread_configuration_is_priced_by_the_estimator_at_its_node_count():
    """Nodes with 2, 1 and 1 usable GPUs (the rest held by other Slurm jobs): under the
    artifact's rule a 4-GPU job runs spread 2 + 1 + 1, as the 3-node configuration it is, priced
    at that node count; under ``even`` (one Slurm job: the same GPUs per node) it cannot run."""
    cluster = make_cluster([("A", 3, 2)])
    usable = (2, 1, 1)
    nodes = tuple(
        dataclasses.replace(n, usable_gpus=u) for n, u in zip(cluster.nodes, usable, strict=True)
    )
    cluster = dataclasses.replace(cluster, nodes=nodes)
    job = rigid("four", 4, {"A": 1})
    assert GavelPolicy().solve(PolicyInput(cluster, (job,))).jobs == {}  # "even": no 4 = k x 4/k
    allocation = ANY.solve(PolicyInput(cluster, (job,)))
    assert allocation.node_hints["four"] == (
        NodeShare("A-0", 2),
        NodeShare("A-1", 1),
        NodeShare("A-2", 1),
    )
    config = allocation.jobs["four"].config
    assert config == Configuration("A", 3, 4)
    expected = job.estimator.evaluate([config], fixed_batch=True).goodput[0]
    assert allocation.jobs["four"].goodput == pytest.approx(expected)
    assert place(cluster, allocation, (job,)).assignments["four"] == allocation.node_hints["four"]


# Workers


def test_workers_larger_jobs_first_previous_kept_when_free_rest_node_by_node():
    cluster = make_cluster([("A", 3, 4)])
    requests = [
        WorkerRequest("one", "A", 1, (NodeShare("A-2", 1),)),
        WorkerRequest("six", "A", 6),
        WorkerRequest("two", "A", 2, (NodeShare("A-0", 2),)),  # A-0 taken by "six" first
    ]
    assigned = assign_workers(cluster, requests)
    assert assigned["six"] == (NodeShare("A-0", 4), NodeShare("A-1", 2))
    assert assigned["two"] == (NodeShare("A-1", 2),)
    assert assigned["one"] == (NodeShare("A-2", 1),)


def test_workers_respect_usable_gpus_and_refuse_oversubscription():
    cluster = make_cluster([("A", 2, 4)])
    nodes = (dataclasses.replace(cluster.nodes[0], usable_gpus=1), cluster.nodes[1])
    cluster = dataclasses.replace(cluster, nodes=nodes)
    assigned = assign_workers(cluster, [WorkerRequest("j", "A", 5)])
    assert assigned["j"] == (NodeShare("A-0", 1), NodeShare("A-1", 4))
    with pytest.raises(WorkerAssignmentError, match="6 GPUs scheduled, only 5 usable"):
        assign_workers(cluster, [WorkerRequest("j", "A", 6)])


# Placement's binding hints


def _running(job_id: str, node: str) -> JobView:
    return dataclasses.replace(
        rigid(job_id, 2, {"A": 1}, current=Configuration("A", 1, 2)),
        placement=(NodeShare(node, 2),),
    )


@pytest.mark.parametrize("binding", [True, False])
def test_placement_moves_a_job_to_its_hint_only_when_hints_are_binding(binding):
    """Same configuration, hint on another node: Gavel's binding hint moves the job there;
    Pollux's (a wish) leaves it where it runs."""
    cluster = make_cluster([("A", 2, 2)])
    job = _running("j", "A-0")
    share = JobAllocation(Configuration("A", 1, 2), 64, 32, 0, 1.0)
    allocation = Allocation(
        {"j": share}, node_hints={"j": (NodeShare("A-1", 2),)}, hints_move_jobs=binding
    )
    placed = place(cluster, allocation, (job,))
    assert placed.assignments["j"] == (
        (NodeShare("A-1", 2),) if binding else (NodeShare("A-0", 2),)
    )


def test_interchangeable_jobs_share_the_lp_optimum_as_an_interior_point_would():
    """Three identical 1-GPU jobs and two GPUs: a vertex gives two of them X = 1 and one 0; the
    centre of the optimal face (the artifact's ECOS) gives each 2/3. A different job keeps its
    own share."""
    throughput = np.array([[5.0], [5.0], [5.0], [1.0]])
    x = solve_lp(throughput, np.ones(4), np.array([2.0]), "max_sum_throughput")
    assert x[:3, 0] == pytest.approx([2 / 3] * 3, abs=1e-5)
    assert x[3, 0] == 0.0


def test_even_shares_fewest_nodes_with_equal_gpus_previous_kept_or_none():
    nodes = ["A-0", "A-1", "A-2"]
    free = {"A-0": 1, "A-1": 2, "A-2": 4}
    assert even_shares(free, nodes, 4) == (NodeShare("A-2", 4),)
    assert even_shares(free, nodes, 2) == (NodeShare("A-1", 2),)  # first fit in node order
    assert even_shares({"A-0": 1, "A-1": 2, "A-2": 1}, nodes, 3) == (
        NodeShare("A-0", 1),
        NodeShare("A-1", 1),
        NodeShare("A-2", 1),
    )
    assert even_shares({"A-0": 1, "A-1": 2, "A-2": 1}, nodes, 4) is None  # 2 + 1 + 1 only
    kept = (NodeShare("A-0", 1), NodeShare("A-1", 1))
    assert even_shares(free, nodes, 2, kept) == kept
    assert even_shares({"A-0": 0, "A-1": 2, "A-2": 4}, nodes, 2, kept) == (NodeShare("A-1", 2),)


def test_even_workers_give_only_even_placeable_splits_and_stay_work_conserving():
    """Two 4-GPU nodes, one GPU of each held by other Slurm jobs (3 + 3 usable): a 4-GPU job
    fits only as 2 + 2, a 3-GPU job only on one node; whatever the order, every grant is the
    same GPUs per node, placeable as hinted, and no job that would fit the GPUs left waits."""
    cluster = make_cluster([("A", 2, 4)])
    nodes = tuple(dataclasses.replace(n, usable_gpus=3) for n in cluster.nodes)
    cluster = dataclasses.replace(cluster, nodes=nodes)
    jobs = (rigid("four", 4, {"A": 1}), rigid("three", 3, {"A": 1}), rigid("one", 1, {"A": 1}))
    allocation = GavelPolicy().solve(PolicyInput(cluster, jobs))
    hints = dict(allocation.node_hints)
    for job_id, shares in hints.items():
        assert len({s.gpus for s in shares}) == 1, job_id  # one Slurm job: same GPUs per node
        assert allocation.jobs[job_id].config.nodes == len(shares)
    if "four" in hints:
        assert hints["four"] == (NodeShare("A-0", 2), NodeShare("A-1", 2))
    placed = place(cluster, allocation, jobs)
    assert placed.unplaced == () and dict(placed.assignments) == hints
    used = {
        n.name: sum(s.gpus for sh in hints.values() for s in sh if s.node == n.name) for n in nodes
    }
    waiting = [j for j in jobs if j.job_id not in hints]
    for job in waiting:  # work-conserving: it has no even split in what is left
        free = {n: 3 - used[n] for n in used}
        assert even_shares(free, list(free), job.requested_gpus) is None, job.job_id


def test_workers_rule_is_validated_and_the_simulator_uses_the_artifacts():
    from sia_slurm.sim.run import policy_params

    with pytest.raises(ValueError, match="workers"):
        GavelPolicyConfig(workers="some")
    assert GavelPolicyConfig().workers == "even"
    assert policy_params("gavel", 0) == GavelPolicyConfig(workers="any")
