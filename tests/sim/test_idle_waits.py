"""Jobs waiting beside free GPUs, and unplaced allocations (sia_slurm/sim/waits_after_actions.py).

Each case builds a small situation whose answer follows from its own shape, not from a recorded
run: a node with room the job's smallest run fits in, a restart factor of zero, a placement that
cannot fit a third job, a FIFO queue blocked behind a job larger than what is free.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot, Start
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller.decide import RoundOutcome
from sia_slurm.controller.idle_waits import (
    FreeGpus,
    RoundWaits,
    SmallestRun,
    WaitCause,
    fits_free,
    round_waits,
    smallest_run,
)
from sia_slurm.core import Configuration, JobKind, NodeView
from sia_slurm.policy.base import Allocation, JobAllocation, PolicyInput, restart_factor
from sia_slurm.policy.parameters import SiaPaperPolicyConfig
from sia_slurm.policy.sia import SiaPolicy
from sia_slurm.protocol import JobSpec
from sia_slurm.sim.inputs import (
    SimulationInputs,
    job_specs,
    load_inputs,
    load_sim_workloads,
    load_workload_truths,
)
from sia_slurm.sim.run import SimulationConfig, simulate
from sia_slurm.sim.simulated_cluster import SimulatedCluster
from sia_slurm.sim.waits_after_actions import after_actions

HEADER = "name,time,application,num_replicas,batch_size\n"
# Two nodes of four T4 each: small enough to reason about every GPU.
TWO_NODES = """\
name: two-t4
gpu_types:
  t4:
    profile: t4
    trace_key: aws
    gpus_per_node: 4
    nodes: 2
"""


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> SimulationInputs:
    path = tmp_path_factory.mktemp("cluster") / "two-t4.yaml"
    path.write_text(TWO_NODES)
    return load_inputs(path)


def _workload(inputs: SimulationInputs, tmp_path: Path, rows: str) -> SimulatedCluster:
    path = tmp_path / "w.csv"
    path.write_text(HEADER + rows)
    (workload,) = load_sim_workloads(path, inputs)
    truths = load_workload_truths([workload], inputs)
    return SimulatedCluster(inputs.cluster, job_specs(workload, truths))


# ------------------------------------------------------------------------------------------
# Fit and smallest run


@pytest.mark.parametrize(
    ("free", "gpus", "per_node", "fits"),
    [
        ((0, 1), 1, 4, True),
        ((0, 0), 1, 4, False),
        ((1, 1), 2, 4, False),  # two GPUs free, but not on one node
        ((2, 1), 2, 4, True),
        ((4, 4), 8, 4, True),  # whole nodes
        ((4, 3), 8, 4, False),
        ((3, 0, 3), 6, 4, True),  # 3 + 3 over two nodes
        ((4, 2, 0), 6, 4, False),
        ((4,), 0, 4, False),
    ],
)
def test_fits_free_places_as_placement_does(
    free: tuple[int, ...], gpus: int, per_node: int, fits: bool
) -> None:
    assert fits_free(free, gpus, per_node) is fits


def test_smallest_run_is_the_jobs_own_not_the_policys() -> None:
    assert smallest_run(JobKind.ADAPTIVE, 1, 8) == SmallestRun(1)
    assert smallest_run(JobKind.RIGID, 1, 8) == SmallestRun(8)
    assert smallest_run(JobKind.PINNED, 1, 2, "a100") == SmallestRun(2, frozenset({"a100"}))
    held = smallest_run(JobKind.PINNED, 1, 2, "a100", frozenset())
    assert held.gpu_types == frozenset() and not held.allows("a100")


def test_free_gpus_count_only_what_a_node_offers() -> None:
    nodes = (NodeView("t4-0", "t4", 4, 4), NodeView("t4-1", "t4", 4, 0))  # t4-1 is down
    free = FreeGpus.of(nodes, {"t4-0": 0, "t4-1": 4})
    assert free.per_type == {"t4": (0, 0)}
    assert not free.room_for(SmallestRun(1))


# ------------------------------------------------------------------------------------------
# The restart factor: Sia leaves a job out while the cluster is empty


def _one_job(restarts: int, now: float) -> ClusterSnapshot:
    spec = JobSpec(sia_id="old", app="cifar10", restart_cost=30.0, submit_time=0.0)
    job = JobSnapshot(spec=spec, phase=JobPhase.PENDING, restarts=restarts)
    nodes = (NodeView("t4-0", "t4", 4, 4), NodeView("t4-1", "t4", 4, 4))
    return ClusterSnapshot(time=now, nodes=nodes, jobs=(job,))


@pytest.mark.parametrize("restarts", [0, 10, 60, 200])
def test_a_job_the_restart_factor_discounts_waits_beside_an_empty_cluster(
    two_nodes: SimulationInputs, restarts: int
) -> None:
    """Sia multiplies every configuration but the current one by the restart factor r. A new
    job may take one GPU (the growth cap), on the only type: normalised goodput 1, so its
    column beats leaving it out only while ``r ** p < lambda_n``, i.e. ``r > lambda_n ** (1/p)``
    (0.83 by default). Below that it waits with every GPU free: the paper's rule
    (``sia-paper``); sia, which does not charge a job without GPUs, starts it."""
    now = 3600.0
    snapshot = _one_job(restarts, now)
    factory = EstimatorFactory(two_nodes.profiles, two_nodes.type_aliases)
    default = Controller(SiaPolicy(), factory).round(snapshot)
    assert {a.sia_id for a in default.actions if isinstance(a, Start)} == {"old"}
    policy = SiaPolicy(SiaPaperPolicyConfig())
    outcome = Controller(policy, factory).round(snapshot)
    started = {a.sia_id for a in outcome.actions if isinstance(a, Start)}
    taken = {s.node: s.gpus for a in outcome.actions if isinstance(a, Start) for s in a.placement}
    left = {n.name: n.usable_gpus - taken.get(n.name, 0) for n in snapshot.nodes}
    counted = round_waits(snapshot.jobs, outcome, started, FreeGpus.of(snapshot.nodes, left))
    threshold = policy.config.lambda_n ** (1 / policy.config.p)
    must_wait = restart_factor(now, restarts, 30.0) <= threshold
    assert (started == set()) is must_wait  # the policy's doing, not the count's
    assert dict(counted.waits) == ({"old": WaitCause.NOT_ALLOCATED} if must_wait else {})
    assert counted.unplaced == ()


# ------------------------------------------------------------------------------------------
# Placement: an allocation that fits the type's capacity but not its nodes


@dataclass(frozen=True)
class _FixedPolicy:
    """Allocates the given GPUs per job on t4, whatever the cluster looks like."""

    gpus: Mapping[str, int]

    def solve(self, policy_input: PolicyInput) -> Allocation:
        jobs = {
            job.job_id: JobAllocation(
                Configuration("t4", 1, self.gpus[job.job_id]),
                batch_size=self.gpus[job.job_id] * 64,
                local_bsz=64,
                accum_steps=0,
                goodput=1.0,
            )
            for job in policy_input.jobs
            if job.job_id in self.gpus
        }
        return Allocation(jobs, policy_input.now, policy_input.round_index)


def _fixed_round(
    inputs: SimulationInputs, tmp_path: Path, gpus: Mapping[str, int]
) -> tuple[SimulatedCluster, RoundOutcome, RoundWaits]:
    """One controller round of :class:`_FixedPolicy` over jobs a, b, c on the two t4 nodes,
    its actions applied (each must succeed), and its waits counted."""
    cluster = _workload(inputs, tmp_path, "a,0,cifar10,1,64\nb,0,cifar10,1,64\nc,0,cifar10,1,64\n")
    factory = EstimatorFactory(inputs.profiles, inputs.type_aliases)
    snapshot = cluster.snapshot()
    outcome = Controller(_FixedPolicy(gpus), factory).round(snapshot)
    assert all(result.ok for result in cluster.apply(outcome.actions))
    return cluster, outcome, after_actions(snapshot, outcome, cluster)


def test_an_allocation_placement_cannot_honour_is_counted_from_the_controller(
    two_nodes: SimulationInputs, tmp_path: Path
) -> None:
    """3 + 3 + 2 GPUs fill the type's 8, but after the two 3-GPU jobs each node has one GPU
    free: the 2-GPU job is left unplaced (evicting either would leave that one nowhere), and
    waits beside two free GPUs its 1-GPU smallest run fits in."""
    cluster, outcome, counted = _fixed_round(two_nodes, tmp_path, {"a": 3, "b": 3, "c": 2})
    not_placed = [d.sia_id for d in outcome.decisions if d.note == "allocated but not placed"]
    assert counted.unplaced == tuple(not_placed) == ("c",)
    assert sum(cluster.free_gpus().values()) == 8 - 3 - 3
    assert dict(counted.waits) == {"c": WaitCause.UNPLACED}
    assert counted.by_cause() == {"unplaced": 1}


def test_nothing_is_counted_when_every_allocation_fits(
    two_nodes: SimulationInputs, tmp_path: Path
) -> None:
    cluster, _, counted = _fixed_round(two_nodes, tmp_path, {"a": 4, "b": 2, "c": 2})
    assert counted.unplaced == () and dict(counted.waits) == {}
    assert cluster.holding() == {"a", "b", "c"}


# ------------------------------------------------------------------------------------------
# A whole simulation: FIFO's queue blocked behind a job larger than what is free


def test_fifo_blocked_behind_a_large_job_waits_beside_a_free_node(
    two_nodes: SimulationInputs, tmp_path: Path
) -> None:
    """``big`` asks for all 8 GPUs while ``first`` holds 4: FIFO (no backfill) starts neither
    ``big`` nor ``small`` behind it, and both could run on one of the 4 free GPUs. Every round
    in which ``first`` held its node with the other two queued counts both; once ``big`` holds
    all 8, ``small`` waits beside nothing."""
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "first,0,cifar10,4,512\nbig,1,cifar10,8,1024\nsmall,2,cifar10,1,128\n")
    (workload,) = load_sim_workloads(path, two_nodes)
    result = simulate(workload, two_nodes, SimulationConfig(policy="fifo"))
    assert result.stopped == ""
    blocked = [r for r in result.rounds if r.contention == 3 and r.gpus["t4"] == 4]
    assert blocked, "the situation did not arise: nothing to count"
    metrics = result.metrics()
    assert metrics.job_rounds_waiting_beside_free_gpus == 2 * len(blocked)
    assert metrics.rounds_with_jobs_waiting_beside_free_gpus == len(blocked)
    assert metrics.waits_beside_free_gpus_by_cause == {"not_allocated": 2 * len(blocked)}
    assert metrics.unplaced_allocations == 0
    assert metrics.active_job_rounds == sum(r.contention for r in result.rounds)


def test_fifo_with_room_for_everyone_counts_no_wait(
    two_nodes: SimulationInputs, tmp_path: Path
) -> None:
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "first,0,cifar10,4,512\nsmall,2,cifar10,1,128\nmid,3,cifar10,2,256\n")
    (workload,) = load_sim_workloads(path, two_nodes)
    metrics = simulate(workload, two_nodes, SimulationConfig(policy="fifo")).metrics()
    assert metrics.completed == 3
    assert metrics.job_rounds_waiting_beside_free_gpus == 0
    assert metrics.rounds_with_jobs_waiting_beside_free_gpus == 0
    assert metrics.unplaced_allocations == 0
    assert metrics.active_job_rounds > 0
