"""Finish-time fairness (sia_slurm/sim/finish_time_fairness.py) on cases worked out by hand.

Toy app ``toy`` on GPU type ``fast`` (2 nodes x 2 GPUs): one GPU at per-GPU batch 10 takes 1 s a
step, at 20 2 s; two GPUs in one node at 10 per GPU take 1.5 s. M0 is 10, the largest batch 20,
the smallest per-GPU batch 10; a job is done after 3,000 M0-equivalent samples; a start costs
30 s. Without gradient noise (``grad_var`` 0) a larger batch is worth no more progress than M0,
so the best run is one GPU at batch 10: 10 samples/s, 300 s. With overwhelming noise the gain
is the scale, progress goes at the raw throughput, and two GPUs at batch 20 are best: 20 / 1.5 =
13.3 samples/s, 225 s.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from click.testing import CliRunner

from sia_slurm.cli.main import cli
from sia_slurm.cluster import Action, BatchChoice, Start
from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import JobSpec
from sia_slurm.sim.artifact_metrics import JobOutcome, workload_metrics
from sia_slurm.sim.clusterfile import ClusterGpuType, ClusterSpec
from sia_slurm.sim.finish_time_fairness import IndependentTimes, with_independent_times
from sia_slurm.sim.inputs import load_inputs, load_sim_workloads, load_workload_truths
from sia_slurm.sim.run import SimulationConfig, simulate
from sia_slurm.sim.simulated_cluster import SimJobSpec, SimulatedCluster
from tests.sim.toys import toy_truth

REPO = Path(__file__).resolve().parents[2]
HEADER = "name,time,application,num_replicas,batch_size\n"
NOISY = 1e9  # grad_var that makes the gain equal the scale (to 1e-8)
FAST = ClusterGpuType("fast", "fast", "x", gpus_per_node=2, nodes=2)
TOY_CLUSTER = ClusterSpec("toy", (FAST,))


@pytest.mark.parametrize(
    ("grad_var", "contention", "expected"),
    [
        (0.0, 1.0, 30 + 300),  # alone: one GPU at M0 is best however many it could have
        (NOISY, 1.0, 30 + 225),  # alone: two GPUs at batch 20 (no more: 20 / 10 per GPU)
        (NOISY, 2.0, 30 + 225),  # half of 4 GPUs: the same two
        (NOISY, 3.0, 30 + 300),  # 1.33 GPUs: one GPU (two a 2/3 of the time: 337.5 s)
        (NOISY, 4.0, 30 + 300),  # one GPU
        (NOISY, 8.0, 30 + 600),  # half a GPU: one GPU half of the time
        (0.0, 16.0, 30 + 1200),
    ],
)
def test_independent_time_by_hand(
    tmp_path: Path, grad_var: float, contention: float, expected: float
) -> None:
    truth = toy_truth(tmp_path, grad_var=grad_var, assumed_restart_s=30.0)
    times = IndependentTimes(TOY_CLUSTER)
    assert times.seconds(JobSpec("j", "toy"), truth, contention) == pytest.approx(expected)


def test_work_per_gpu_count_by_hand(tmp_path: Path) -> None:
    times = IndependentTimes(TOY_CLUSTER)
    quiet, noisy = (
        toy_truth(tmp_path / "a", assumed_restart_s=30.0),
        toy_truth(tmp_path / "b", grad_var=NOISY, assumed_restart_s=30.0),
    )
    spec = JobSpec("j", "toy")
    assert times.work_seconds(spec, quiet, FAST, 1) == pytest.approx(300.0)
    assert times.work_seconds(spec, quiet, FAST, 2) == pytest.approx(450.0)  # 10 / 1.5 per s
    assert times.work_seconds(spec, noisy, FAST, 2) == pytest.approx(225.0)
    assert times.work_seconds(spec, noisy, FAST, 3) == math.inf  # 3 x 10 > the largest batch


def test_fixed_batch_and_count_are_kept(tmp_path: Path) -> None:
    truth = toy_truth(tmp_path, grad_var=NOISY, assumed_restart_s=30.0)
    times = IndependentTimes(TOY_CLUSTER)
    # Strong-scaling at batch 10, even with noise: on two GPUs (5 each, held at the smallest
    # measured per-GPU batch: 1.5 s) 10 samples per 1.5 s, worse than one GPU's 10 per 1 s.
    strong = JobSpec("j", "toy", kind=JobKind.STRONG_SCALING, requested_batch_size=10)
    assert times.seconds(strong, truth, 1.0) == pytest.approx(330.0)
    # Rigid on two GPUs at batch 20, half of a GPU-share (N = 4, 1 GPU): 225 s x 2.
    rigid = JobSpec("j", "toy", kind=JobKind.RIGID, requested_gpus=2, requested_batch_size=20)
    assert times.seconds(rigid, truth, 4.0) == pytest.approx(30 + 450)


def test_restart_of_the_cluster_file_replaces_the_apps(tmp_path: Path) -> None:
    from sia_slurm.sim.clusterfile import ClusterRestart

    cluster = ClusterSpec("toy", (FAST,), restart=ClusterRestart(start_s=5.0, move_s=7.0))
    truth = toy_truth(tmp_path, assumed_restart_s=30.0)
    assert IndependentTimes(cluster).seconds(JobSpec("j", "toy"), truth, 1.0) == pytest.approx(
        305.0
    )


# ------------------------------------------------------------------------------------------
# Against the simulated cluster, driven by hand


def _start(job: str, node: str) -> Start:
    config = Configuration("fast", 1, 1)
    return Start(job, 0, config, (NodeShare(node, 1),), BatchChoice(10, 10, 0))


def _run(
    cluster: SimulatedCluster, actions: Callable[[float], Sequence[Action]], rounds: int = 50
) -> None:
    for _ in range(rounds):
        if cluster.all_done:
            return
        cluster.snapshot()
        results = cluster.apply(actions(cluster.time))
        assert all(r.ok for r in results), results
        cluster.advance(60.0)
    raise AssertionError("jobs did not finish")


def _two_jobs(tmp_path: Path) -> tuple[SimulatedCluster, list[SimJobSpec]]:
    truth = toy_truth(tmp_path, assumed_restart_s=30.0)
    cluster_spec = ClusterSpec("toy", (ClusterGpuType("fast", "fast", "x", 2, 1),))  # 2 GPUs
    jobs = [SimJobSpec(JobSpec(name, "toy"), truth) for name in ("j0", "j1")]
    return SimulatedCluster(cluster_spec, jobs), jobs


def test_a_job_alone_at_its_best_run_is_fair(tmp_path: Path) -> None:
    truth = toy_truth(tmp_path, assumed_restart_s=30.0)
    jobs = [SimJobSpec(JobSpec("j0", "toy"), truth)]
    cluster = SimulatedCluster(TOY_CLUSTER, jobs)
    _run(cluster, lambda t: [_start("j0", "fast-0")] if t == 0 else [])
    (outcome,) = with_independent_times(cluster.outcomes(), jobs, TOY_CLUSTER)
    assert outcome.contention == 1.0
    assert outcome.jct == pytest.approx(330.0) and outcome.independent_s == pytest.approx(330.0)
    assert outcome.ftf == pytest.approx(1.0)


def test_two_jobs_side_by_side_on_their_halves_are_fair(tmp_path: Path) -> None:
    cluster, jobs = _two_jobs(tmp_path)
    both = [_start("j0", "fast-0"), _start("j1", "fast-0")]
    _run(cluster, lambda t: both if t == 0 else [])
    outcomes = with_independent_times(cluster.outcomes(), jobs, cluster.cluster)
    assert [o.contention for o in outcomes] == [2.0, 2.0]
    assert [o.ftf for o in outcomes] == [pytest.approx(1.0), pytest.approx(1.0)]


def test_the_second_of_two_jobs_run_one_after_the_other_is_treated_unfairly(
    tmp_path: Path,
) -> None:
    # j0 runs 0-330 s; j1 starts at the next round, 360 s, and ends at 690 s. j1 was active in
    # 6 rounds beside j0 and 6 alone: N = 1.5, a share of 1.33 GPUs, whose best is one GPU
    # (two GPUs 2/3 of the time: 450 / (2/3) = 675 s): T_independent = 330 s for both.
    cluster, jobs = _two_jobs(tmp_path)
    _run(
        cluster,
        lambda t: {0.0: [_start("j0", "fast-0")], 360.0: [_start("j1", "fast-0")]}.get(t, []),
    )
    first, second = with_independent_times(cluster.outcomes(), jobs, cluster.cluster)
    assert (first.contention, second.contention) == (2.0, 1.5)
    assert first.ftf == pytest.approx(1.0)
    assert second.jct == pytest.approx(690.0) and second.independent_s == pytest.approx(330.0)
    assert second.ftf == pytest.approx(690.0 / 330.0)
    m = workload_metrics([first, second], contention=[2, 1], solve_ms=[], wall_s=0.0)
    assert m.ftf_mean == pytest.approx((1.0 + 690 / 330) / 2)
    assert m.ftf_max == m.ftf_p99 == pytest.approx(690 / 330)
    assert m.ftf_unfair_fraction == 0.5
    assert m.ftf == {"j0": pytest.approx(1.0), "j1": pytest.approx(690 / 330)}


def test_the_integral_agrees_with_the_simulator_on_real_traces(tmp_path: Path) -> None:
    # cifar10 on one T4 at a fixed batch of 256: T_independent's trapezoid against the
    # simulator's midpoint rule over a whole job (statistics that change with progress).
    inputs = load_inputs(REPO / "etc" / "clusters" / "hetero64.yaml")
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "j,0,cifar10,1,256\n")
    (workload,) = load_sim_workloads(path, inputs)
    truth = load_workload_truths([workload], inputs)["cifar10"]
    t4 = ClusterGpuType("t4", "t4", "aws", gpus_per_node=1, nodes=1)
    cluster_spec = ClusterSpec("one-t4", (t4,))
    spec = JobSpec("j", "cifar10", kind=JobKind.STRONG_SCALING, requested_batch_size=256)
    jobs = [SimJobSpec(spec, truth)]
    cluster = SimulatedCluster(cluster_spec, jobs)
    start = Start(
        "j", 0, Configuration("t4", 1, 1), (NodeShare("t4-0", 1),), BatchChoice(256, 256, 0)
    )
    _run(cluster, lambda t: [start] if t == 0 else [], rounds=1000)
    (outcome,) = with_independent_times(cluster.outcomes(), jobs, cluster_spec)
    assert outcome.jct is not None and outcome.jct > 1800  # long enough to test the integral
    assert outcome.ftf == pytest.approx(1.0, abs=2e-3)


def test_unfinished_jobs_and_jobs_without_a_time_alone_have_no_ratio() -> None:
    base = JobOutcome("a", "app", 0.0, 100.0, 0.0, 0, 1.0)
    assert base.ftf is None  # not computed
    assert JobOutcome("b", "app", 0.0, None, 0.0, 0, 1.0, independent_s=50.0).ftf is None
    m = workload_metrics([base], contention=[1], solve_ms=[], wall_s=0.0)
    assert math.isnan(m.ftf_mean) and math.isnan(m.ftf_unfair_fraction) and m.ftf == {}


# ------------------------------------------------------------------------------------------
# Whole simulations


def test_summary_json_carries_finish_time_fairness(tmp_path: Path) -> None:
    # One cifar10 job alone on hetero64 under FIFO: it runs where it asked, one GPU at batch
    # 128, while alone (N = 1) it could have had 16 A100s and its best batch: unfair.
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "j,0,cifar10,1,128\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(
        cli, ["simulate", str(path), "--policy", "fifo", "-j", "1", "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    summary = json.loads((out / "summary.json").read_text())
    metrics = summary["workloads"]["w"]["metrics"]
    rho = metrics["ftf"]["j"]
    assert rho > 2.0
    assert metrics["ftf_mean"] == metrics["ftf_p99"] == metrics["ftf_max"] == rho
    assert metrics["ftf_unfair_fraction"] == 1.0
    pooled = summary["pooled"]
    assert (pooled["ftf_mean"], pooled["ftf_max"], pooled["ftf_unfair_fraction"]) == (
        rho,
        rho,
        1.0,
    )
    assert "FTF" in result.output


@pytest.mark.heavy
def test_a_job_alone_under_sia_is_fair_but_for_its_ramp(tmp_path: Path) -> None:
    # One T4 node: Sia grows cifar10 1 -> 4 GPUs (its 4x growth cap), one round and one 50 s
    # restart; alone on the cluster, its best run is 4 GPUs from the start. rho is just above 1.
    cluster = tmp_path / "one.yaml"
    cluster.write_text(
        "name: one-t4\ngpu_types:\n  t4:\n    profile: t4\n    trace_key: aws\n"
        "    gpus_per_node: 4\n    nodes: 1\n"
    )
    path = tmp_path / "w.csv"
    path.write_text(HEADER + "j,0,cifar10,1,128\n")
    inputs = load_inputs(cluster)
    (workload,) = load_sim_workloads(path, inputs)
    (job,) = simulate(workload, inputs, SimulationConfig(policy="sia")).jobs
    assert job.contention == 1.0 and job.restarts == 1
    assert job.ftf is not None and 1.0 < job.ftf < 1.15
