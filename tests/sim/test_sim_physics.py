"""The simulated cluster's physics on a toy app whose every number can be worked out by hand.

Toy app ``toy`` on GPU type ``fast`` (trace key ``x``): one GPU at per-GPU batch 10 takes 1 s
per step, at batch 20 2 s; two GPUs in one node at batch 10 take 1.5 s (0.5 s of it sync). Its
validation files put M0 at 10 and 1,000 samples in an epoch (two epochs of 100 M0-iterations);
with ``max_epochs=3`` a job is done after 3,000 M0-equivalent samples. The true restart delay
is 30 s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from sia_slurm.cluster import BatchChoice, JobPhase, Move, Rebatch, Start, Stop
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import JobSpec
from sia_slurm.sim.apptruth import AppTruth
from sia_slurm.sim.clusterfile import ClusterGpuType, ClusterRestart, ClusterSpec
from sia_slurm.sim.gradstats import AppGradStats
from sia_slurm.sim.progress import StatsTable, integrate
from sia_slurm.sim.simulated_cluster import SimJobSpec, SimulatedCluster
from tests.sim.toys import toy_truth

REPO = Path(__file__).resolve().parents[2]
ONE_GPU = Configuration("fast", 1, 1)
THREE_GPUS = Configuration("fast", 1, 3)  # more than a node holds
TWO_NODES = (NodeShare("fast-0", 1), NodeShare("fast-1", 1))  # for a 1-node configuration


def toy_cluster(
    truth: AppTruth,
    *submits: float,
    init_batch_size: int = 0,
    restart: ClusterRestart | None = None,
) -> SimulatedCluster:
    gpu_type = ClusterGpuType("fast", "fast", "x", gpus_per_node=2, nodes=2)
    spec = ClusterSpec("toy", (gpu_type,), restart=restart)
    jobs = [
        SimJobSpec(JobSpec(f"j{i}", "toy", submit_time=t, init_batch_size=init_batch_size), truth)
        for i, t in enumerate(submits or (0.0,))
    ]
    return SimulatedCluster(spec, jobs)


def start(job: str = "j0", node: str = "fast-0", batch: int = 10, gpus: int = 1) -> Start:
    config = Configuration("fast", 1, gpus)
    local = batch // gpus
    return Start(job, 0, config, (NodeShare(node, gpus),), BatchChoice(batch, local, 0))


def run_until_done(cluster: SimulatedCluster, rounds: int = 100) -> None:
    for _ in range(rounds):
        if cluster.all_done:
            return
        cluster.snapshot()
        cluster.advance(60.0)
    raise AssertionError("job did not finish")


def test_toy_completion_target_is_three_epochs(tmp_path: Path) -> None:
    truth = toy_truth(tmp_path)
    assert truth.init_batch_size == 10
    assert truth.completion_samples == pytest.approx(3000.0)


def test_job_alone_finishes_when_the_ground_truth_says(tmp_path: Path) -> None:
    # 30 s restart delay, then 3000 samples at 10 samples/s (1 s per batch of 10): 330 s.
    cluster = toy_cluster(toy_truth(tmp_path))
    cluster.snapshot()
    assert cluster.apply([start()])[0].ok
    snapshot = cluster.snapshot()
    assert snapshot.jobs[0].phase is JobPhase.STARTING
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.finish_time == pytest.approx(330.0)
    assert outcome.jct == pytest.approx(330.0)
    assert outcome.gpu_seconds == pytest.approx(330.0)  # restart delay counts
    assert outcome.restarts == 0


def test_two_gpus_calibration_and_gpu_hours(tmp_path: Path) -> None:
    # 2 GPUs, batch 20 (10 per GPU): 1.5 s per step. No gradient noise (grad_var 0), so the
    # gain is 1: a batch of 20 is worth M0 = 10 samples of progress; calibration 2 halves it:
    # 10 / 1.5 / 2 = 3.33 samples/s -> 900 s for 3000 samples, + 30 s delay, on 2 GPUs.
    cluster = toy_cluster(toy_truth(tmp_path, calibration=2.0))
    cluster.snapshot()
    assert cluster.apply([start(batch=20, gpus=2)])[0].ok
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.finish_time == pytest.approx(930.0)
    assert outcome.gpu_seconds == pytest.approx(1860.0)


def test_move_pays_the_true_restart_delay_again(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path))
    cluster.snapshot()
    cluster.apply([start()])
    cluster.advance(60.0)  # 30 s delay + 30 s of training: 300 samples
    move = Move("j0", 1, ONE_GPU, (NodeShare("fast-1", 1),), BatchChoice(10, 10, 0))
    assert cluster.apply([move])[0].ok
    snapshot = cluster.snapshot()
    assert snapshot.jobs[0].phase is JobPhase.STARTING
    assert snapshot.jobs[0].restarts == 1
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.finish_time == pytest.approx(60.0 + 30.0 + 270.0)
    assert outcome.restarts == 1


def test_stop_then_start_counts_a_restart_and_frees_gpus_at_once(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path))
    cluster.snapshot()
    cluster.apply([start()])
    cluster.advance(60.0)
    assert cluster.apply([Stop("j0", 1)])[0].ok
    assert cluster.gpus_held() == {"fast": 0}
    cluster.advance(60.0)  # no GPUs: no progress, no GPU time
    cluster.apply([start(node="fast-1")])
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.restarts == 1
    assert outcome.finish_time == pytest.approx(120.0 + 30.0 + 270.0)
    assert outcome.gpu_seconds == pytest.approx(60.0 + 300.0)


def test_a_cluster_restart_time_replaces_the_apps_delay(tmp_path: Path) -> None:
    # The cluster's own start (5 s) and move (12 s) instead of the app's 30 s: 3000 samples at
    # 10 samples/s plus 5 s to start and 12 s for the move after the first round.
    restart = ClusterRestart(start_s=5.0, move_s=12.0)
    cluster = toy_cluster(toy_truth(tmp_path), restart=restart)
    cluster.snapshot()
    cluster.apply([start()])
    cluster.advance(60.0)  # 5 s start, 55 s of training: 550 samples
    move = Move("j0", 1, ONE_GPU, (NodeShare("fast-1", 1),), BatchChoice(10, 10, 0))
    assert cluster.apply([move])[0].ok
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.finish_time == pytest.approx(60.0 + 12.0 + 245.0)
    # A start after a stop in an earlier round is a start, not a move.
    cluster = toy_cluster(toy_truth(tmp_path), restart=restart)
    cluster.snapshot()
    cluster.apply([start()])
    cluster.advance(60.0)
    cluster.apply([Stop("j0", 1)])
    cluster.advance(60.0)
    cluster.apply([start(node="fast-1")])
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.finish_time == pytest.approx(120.0 + 5.0 + 245.0)


def test_rebatch_changes_speed_without_a_delay(tmp_path: Path) -> None:
    # After 300 samples, batch 20 on 1 GPU: 2 s per step, scale 2, gain (1+1)/(1/2+1) = 4/3,
    # so 4/3 * 10 / 2 = 20/3 M0-samples per second: the remaining 2700 take 405 s.
    cluster = toy_cluster(toy_truth(tmp_path, grad_var=1.0))
    cluster.snapshot()
    cluster.apply([start()])
    cluster.advance(60.0)
    assert cluster.apply([Rebatch("j0", 1, BatchChoice(20, 20, 0))])[0].ok
    snapshot = cluster.snapshot()
    assert snapshot.jobs[0].phase is JobPhase.RUNNING
    assert snapshot.jobs[0].restarts == 0
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.finish_time == pytest.approx(60.0 + 405.0)
    assert outcome.restarts == 0


def test_accumulation_steps_add_compute_but_not_sync(tmp_path: Path) -> None:
    # 2 GPUs, local 10, one extra micro-batch: T = 1 * (1.5 - 0.5) + 1.5 = 2.5 s for 40
    # samples; grad_var 0 makes the gain 1, so progress is 10 / 2.5 = 4 M0-samples/s.
    cluster = toy_cluster(toy_truth(tmp_path))
    cluster.snapshot()
    two = Configuration("fast", 1, 2)
    action = Start("j0", 0, two, (NodeShare("fast-0", 2),), BatchChoice(40, 10, 1))
    assert cluster.apply([action])[0].ok
    run_until_done(cluster)
    assert cluster.outcomes()[0].finish_time == pytest.approx(30.0 + 750.0)


def test_reports_carry_measured_times_and_true_statistics(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path, grad_var=2.0), init_batch_size=20)
    assert cluster.snapshot().reports == ()
    cluster.apply([start(batch=20, gpus=2)])
    cluster.advance(20.0)  # still restoring: nothing trained, nothing to report
    assert cluster.snapshot().reports == ()
    cluster.advance(40.0)
    (report,) = cluster.snapshot().reports
    assert (report.gpu_type, report.nodes, report.gpus, report.local_bsz) == ("fast", 1, 2, 10)
    assert (report.step_time, report.sync_time) == (1.5, 0.5)
    assert report.grad_sqr == 1.0
    assert report.grad_var == pytest.approx(2.0 * 10 / 20)  # normalised to the job's own M0
    assert report.steps == int(30.0 / 1.5)
    assert cluster.snapshot().reports == ()  # each interval reports once


def test_finished_job_is_shown_done_once_then_gone(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path))
    cluster.snapshot()
    cluster.apply([start()])
    for _ in range(6):
        cluster.advance(60.0)
    done = cluster.snapshot()
    assert [job.phase for job in done.jobs] == [JobPhase.DONE]
    assert done.jobs[0].finish_time == pytest.approx(330.0)
    assert done.reports == ()
    assert cluster.snapshot().jobs == ()
    assert cluster.gpus_held() == {"fast": 0}


def test_jobs_appear_at_their_submission_time(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path), 0.0, 100.0)
    assert [job.sia_id for job in cluster.snapshot().jobs] == ["j0"]
    cluster.advance(60.0)
    assert [job.sia_id for job in cluster.snapshot().jobs] == ["j0"]
    assert cluster.next_submit_time == 100.0
    cluster.advance(60.0)
    assert [job.sia_id for job in cluster.snapshot().jobs] == ["j0", "j1"]
    assert cluster.next_submit_time is None


@pytest.mark.parametrize(
    ("action", "message"),
    [
        (start(node="nope-0"), "is not a fast node"),
        (
            Start("j0", 0, THREE_GPUS, (NodeShare("fast-0", 3),), BatchChoice(30, 10, 0)),
            "free GPUs",
        ),
        (Start("j0", 0, ONE_GPU, (NodeShare("fast-0", 1),), BatchChoice(12, 10, 0)), "batch_size"),
        (Start("j0", 0, ONE_GPU, TWO_NODES, BatchChoice(10, 10, 0)), "does not match"),
        (Stop("j0", 0), "holds no GPUs"),
        (Rebatch("j0", 0, BatchChoice(10, 10, 0)), "holds no GPUs"),
        (start(job="ghost"), "not a live submitted job"),
    ],
)
def test_invalid_actions_are_refused_and_change_nothing(
    tmp_path: Path, action: object, message: str
) -> None:
    cluster = toy_cluster(toy_truth(tmp_path))
    cluster.snapshot()
    (result,) = cluster.apply([action])  # type: ignore[list-item]
    assert not result.ok and message in result.message
    assert cluster.gpus_held() == {"fast": 0}
    assert cluster.snapshot().jobs[0].phase is JobPhase.PENDING


def test_oversubscription_is_refused(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path), 0.0, 0.0)
    cluster.snapshot()
    first, second = cluster.apply([start(gpus=2, batch=20), start("j1", gpus=2, batch=20)])
    assert first.ok and not second.ok and "free GPUs" in second.message
    assert cluster.gpus_held() == {"fast": 2}


def test_moves_release_before_granting_so_jobs_can_swap_nodes(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path), 0.0, 0.0)
    cluster.snapshot()
    cluster.apply([start(gpus=2, batch=20), start("j1", node="fast-1", gpus=2, batch=20)])
    cluster.advance(60.0)
    config = Configuration("fast", 1, 2)
    swap = [
        Move("j0", 1, config, (NodeShare("fast-1", 2),), BatchChoice(20, 10, 0)),
        Move("j1", 1, config, (NodeShare("fast-0", 2),), BatchChoice(20, 10, 0)),
    ]
    assert all(result.ok for result in cluster.apply(swap))
    placements = {job.sia_id: job.placement[0].node for job in cluster.snapshot().jobs}
    assert placements == {"j0": "fast-1", "j1": "fast-0"}
    assert cluster.gpus_held() == {"fast": 4}


def test_stats_table_matches_the_curves(tmp_path: Path) -> None:
    stats = {app: AppGradStats.load(REPO / "data" / "traces", app) for app in ("cifar10", "bert")}
    table = StatsTable.build(stats)
    rng = np.random.default_rng(0)
    for app, app_stats in stats.items():
        for batch in app_stats.batch_sizes:
            high = app_stats.curves[batch].progress[-1]
            progress = rng.uniform(-0.1 * high, 1.2 * high, size=50)
            curve = np.full(50, table.curve_index(app, batch), dtype=np.int64)
            sqr, var = table.at(curve, progress)
            want_sqr, want_var = app_stats.at(batch, progress)
            np.testing.assert_allclose(sqr, want_sqr, rtol=1e-12)
            np.testing.assert_allclose(var, want_var, rtol=1e-12)


def test_integration_is_accurate_on_real_statistics() -> None:
    # cifar10 at batch 4096 from scratch to completion: statistics change every epoch; the
    # default 10 s midpoint steps agree with 0.25 s steps to 0.1% on the completion time.
    stats = AppGradStats.load(REPO / "data" / "traces", "cifar10")
    table = StatsTable.build({"cifar10": stats})
    inputs = {
        "progress": np.zeros(1),
        "base_rate": np.array([128 / 0.9]),  # M0 / T_iter
        "scale": np.array([4096 / 128]),
        "curve": np.array([table.curve_index("cifar10", 4096)], dtype=np.int64),
        "target": np.array([stats.completion_samples]),
    }

    def completion(substep: float) -> float:
        elapsed, state = 0.0, dict(inputs)
        while True:
            stepped = integrate(table, **state, duration=np.array([60.0]), max_substep=substep)
            if not np.isnan(stepped.finish[0]):
                return elapsed + float(stepped.finish[0])
            elapsed += 60.0
            state["progress"] = stepped.progress

    coarse, fine = completion(10.0), completion(0.25)
    assert fine > 600
    assert coarse == pytest.approx(fine, rel=1e-3)


def test_a_restore_that_ends_on_a_round_boundary_shows_running(tmp_path: Path) -> None:
    cluster = toy_cluster(toy_truth(tmp_path))
    cluster.snapshot()
    cluster.apply([start()])
    cluster.advance(30.0)  # exactly the 30 s delay
    snapshot = cluster.snapshot()
    assert snapshot.jobs[0].phase is JobPhase.RUNNING
    assert snapshot.reports == ()  # restored, but has not trained yet


def test_a_cluster_without_jobs_is_idle_and_done(tmp_path: Path) -> None:
    spec = ClusterSpec("toy", (ClusterGpuType("fast", "fast", "x", gpus_per_node=2, nodes=2),))
    cluster = SimulatedCluster(spec, [])
    assert cluster.all_done and cluster.idle()
    assert [node.name for node in cluster.snapshot().nodes] == ["fast-0", "fast-1"]


def test_arriving_jobs_report_their_requested_size_when_asked(tmp_path: Path) -> None:
    """With ``profile_requested`` each job reports, on arrival, one measured step on every type
    at its requested GPUs packed on whole nodes and its requested batch split over them, with
    accumulation past the largest measured per-GPU batch (20 here); a job larger than the type
    gets none. Without it (the default) nothing is reported before a job runs."""
    truth = toy_truth(tmp_path, grad_var=2.0)
    gpu_type = ClusterGpuType("fast", "fast", "x", gpus_per_node=2, nodes=2)
    spec = ClusterSpec("toy", (gpu_type,))
    asks = {"fits": (2, 40), "accumulates": (2, 60), "too_big": (5, 50)}
    jobs = [
        SimJobSpec(JobSpec(name, "toy", requested_gpus=g, requested_batch_size=b), truth)
        for name, (g, b) in asks.items()
    ]
    assert SimulatedCluster(spec, jobs).snapshot().reports == ()
    cluster = SimulatedCluster(spec, jobs, profile_requested=True)
    reports = {r.sia_id: r for r in cluster.snapshot().reports}
    assert set(reports) == {"fits", "accumulates"}
    fits, accumulates = reports["fits"], reports["accumulates"]
    assert (fits.gpu_type, fits.nodes, fits.gpus, fits.local_bsz, fits.accum_steps) == (
        "fast",
        1,
        2,
        20,
        0,
    )
    assert (fits.step_time, fits.sync_time) == (2.5, 0.5)
    assert (accumulates.local_bsz, accumulates.accum_steps) == (15, 1)
    assert accumulates.step_time == pytest.approx(2.0)  # halfway between batch 10 and 20
    assert fits.grad_var == pytest.approx(2.0)
    assert cluster.snapshot().reports == ()  # once, on arrival
