"""Sia's profiling of new models in the simulator (docs/simulator.md, "Profiling").

The first tests drive the simulated cluster by hand on a toy app whose every number can be
worked out: app ``toy`` (trace key ``x``) takes 1 s per step on one GPU at per-GPU batch 10 and
2 s at 20 (its largest measured batch, so the memory limit), and held at 1 s below 10; M0 is
10, the job is done after 3,000 M0-equivalent samples, a restart costs 30 s, and without
gradient noise (``grad_var`` 0) every step is worth M0 = 10 samples whatever its batch. A
profiling grant with the sweep (5, 10, 20, 40) then costs, after its 30 s restart, 4 steps at
5, 10 and 20 (4 + 4 + 8 s) and a failed try at 40 charged as one step at 20 (2 s): 18 s, of
which the 12 training steps are worth 120 samples (12 s of training at M0).

The others run the production controller on the paper's cluster (hetero64: T4, RTX, A100).
"""

from __future__ import annotations

import io
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.cluster import BatchChoice, JobPhase, Move, Start, Stop
from sia_slurm.controller.profiling import profile_sweep, profiling_limits
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import JobSpec
from sia_slurm.protocol.profile_json import measured_problems, profile_from_json
from sia_slurm.sim.apptruth import AppTruth
from sia_slurm.sim.clusterfile import ClusterGpuType, ClusterSpec
from sia_slurm.sim.gradstats import AppGradStats
from sia_slurm.sim.groundtruth import GroundTruth
from sia_slurm.sim.inputs import (
    SimulationInputs,
    job_specs,
    load_inputs,
    load_sim_workloads,
    load_workload_truths,
)
from sia_slurm.sim.restart import RestartDelay
from sia_slurm.sim.run import SimulationConfig, SimulationResult, simulate
from sia_slurm.sim.simulated_cluster import SimJobSpec, SimulatedCluster
from sia_slurm.sim.sweep import plan_sweep
from sia_slurm.sim.workload import Workload

REPO = Path(__file__).resolve().parents[2]
HETERO64 = REPO / "etc" / "clusters" / "hetero64.yaml"
PHILLY_1 = REPO / "data" / "workloads" / "philly" / "workload-1.csv"
PLACEMENTS = "placement,local_bsz,step_time,sync_time\n1,10,1.0,0.0\n1,20,2.0,0.0\n"
SWEEP = (5, 10, 20, 40)
SWEEP_S = 18.0  # 4 x 1 s at 5 and 10, 4 x 2 s at 20, one failed try of 2 s
SWEEP_SAMPLES = 120.0  # 12 training steps of M0 = 10 samples each
RESTART_S = 30.0
TARGET = 3000.0  # samples; 10 samples/s at M0 on one GPU


# ------------------------------------------------------------------------------------------
# The profiling run, by hand


def toy_cluster(tmp_path: Path, *, seed: int = 0, noise: float = 0.05) -> SimulatedCluster:
    """Two GPU types of the same speed, ``fast`` and ``slow``, whose profiles are named
    ``pfast`` and ``pslow`` (what the document must name); one job ``j0`` at time 0."""
    folder = tmp_path / "traces" / "toy"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "placements-x.csv").write_text(PLACEMENTS)
    for batch in (10, 20):
        (folder / f"validation-{batch}.csv").write_text(
            "progress,grad_sqr,grad_var\n100,1.0,0.0\n200,1.0,0.0\n"
        )
    traces = tmp_path / "traces"
    speed = GroundTruth.load(traces, "toy", "x", calibration=1.0)
    truth = AppTruth(
        app="toy",
        speed={"fast": speed, "slow": speed},
        stats=AppGradStats.load(traces, "toy", max_epochs=3),
        restart=RestartDelay(true_s=RESTART_S, assumed_s=RESTART_S),
        calibration=1.0,
    )
    gpu_types = (
        ClusterGpuType("fast", "pfast", "x", gpus_per_node=2, nodes=1),
        ClusterGpuType("slow", "pslow", "x", gpus_per_node=2, nodes=1),
    )
    spec = JobSpec("j0", "", init_batch_size=10, max_batch_size=20)
    return SimulatedCluster(
        ClusterSpec("toy", gpu_types), [SimJobSpec(spec, truth)], profile_noise=noise, seed=seed
    )


def grant(kind: type[Start] | type[Move], gpu_type: str, sweep: tuple[int, ...] = SWEEP) -> Any:
    config = Configuration(gpu_type, 1, 1)
    placement = (NodeShare(f"{gpu_type}-0", 1),)
    return kind("j0", 0, config, placement, BatchChoice(10, 10, 0), profile_sweep=sweep)


def run_until_done(cluster: SimulatedCluster) -> None:
    for _ in range(100):
        if cluster.all_done:
            return
        cluster.snapshot()
        cluster.advance(60.0)
    raise AssertionError("job did not finish")


def checked(document: dict[str, Any], types: list[str]) -> None:
    """The document passes the controller's checks for ``types``."""
    profile = profile_from_json(document, "test", {"pfast", "pslow"})
    assert measured_problems(profile, types) == []


def test_a_profiling_grant_restarts_sweeps_writes_its_document_then_trains(
    tmp_path: Path,
) -> None:
    cluster = toy_cluster(tmp_path)
    cluster.snapshot()
    assert cluster.apply([grant(Start, "fast")])[0].ok
    cluster.advance(40.0)  # the restart, then 10 s of the 18 s sweep
    snapshot = cluster.snapshot()
    assert snapshot.jobs[0].phase is JobPhase.RUNNING
    assert snapshot.jobs[0].profiled_document is None  # written when the sweep is done
    cluster.advance(20.0)
    document = cluster.snapshot().jobs[0].profiled_document
    assert document is not None
    checked(document, ["pfast"])
    assert document["max_local_bsz"] == {"pfast": 20}  # 40 did not fit
    points = {p["local_bsz"]: p["step_time"] for p in document["seed"]}
    assert sorted(points) == [5, 10, 20]
    truth = {5: 1.0, 10: 1.0, 20: 2.0}
    for batch, step in points.items():  # 5% lognormal noise: well within 4 sigma
        assert abs(math.log(step / truth[batch])) < 0.2
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    # The restart, the sweep, then the samples the sweep did not train at 10 samples/s.
    assert outcome.jct == pytest.approx(RESTART_S + SWEEP_S + (TARGET - SWEEP_SAMPLES) / 10)
    assert outcome.profiling_gpu_seconds == pytest.approx(RESTART_S + SWEEP_S)
    assert outcome.gpu_seconds == pytest.approx(outcome.jct)
    assert outcome.sweeps == 1


def test_profiling_costs_its_restarts_and_sweeps_less_what_they_trained(tmp_path: Path) -> None:
    """A lone job profiled on both types, moved on as soon as each sweep is done, against the
    same job started on ``fast`` without profiling. The difference is the sweep time and the
    restarts, less what the sweeps' steps trained: one extra restart (the first one is paid
    either way) + 2 x 18 s of sweeps - 2 x 12 steps worth 1 s each = 30 + 36 - 24 = 42 s."""
    plain = toy_cluster(tmp_path)
    plain.snapshot()
    assert plain.apply([grant(Start, "fast", sweep=())])[0].ok
    run_until_done(plain)
    (off,) = plain.outcomes()
    assert off.jct == pytest.approx(RESTART_S + TARGET / 10)

    cluster = toy_cluster(tmp_path)
    cluster.snapshot()
    assert cluster.apply([grant(Start, "slow")])[0].ok
    cluster.advance(RESTART_S + SWEEP_S)
    first = cluster.snapshot().jobs[0].profiled_document
    assert first is not None and sorted(first["max_local_bsz"]) == ["pslow"]
    assert cluster.apply([grant(Move, "fast")])[0].ok
    cluster.advance(RESTART_S + SWEEP_S)
    both = cluster.snapshot().jobs[0].profiled_document
    assert both is not None and sorted(both["max_local_bsz"]) == ["pfast", "pslow"]
    checked(both, ["pfast", "pslow"])
    assert [p for p in both["seed"] if p["gpu_type"] == "pslow"] == first["seed"]  # kept
    run_until_done(cluster)
    (each,) = cluster.outcomes()
    restarts, sweeps, trained = RESTART_S, 2 * SWEEP_S, 2 * SWEEP_SAMPLES / 10
    assert each.jct - off.jct == pytest.approx(restarts + sweeps - trained)
    assert each.profiling_gpu_seconds == pytest.approx(2 * (RESTART_S + SWEEP_S))
    assert (each.sweeps, each.restarts) == (2, 1)


def test_a_sweep_cut_short_is_run_again_by_the_next_grant(tmp_path: Path) -> None:
    cluster = toy_cluster(tmp_path)
    cluster.snapshot()
    cluster.apply([grant(Start, "fast")])
    cluster.advance(40.0)  # 10 s into the sweep: 4 steps at 5, 4 at 10, 1 at 20 (90 samples)
    cluster.snapshot()
    assert cluster.apply([Stop("j0", 1)])[0].ok
    assert cluster.snapshot().jobs[0].profiled_document is None
    cluster.apply([grant(Start, "fast")])
    run_until_done(cluster)
    (outcome,) = cluster.outcomes()
    assert outcome.sweeps == 1
    assert outcome.finish_time == pytest.approx(
        40.0 + RESTART_S + SWEEP_S + (TARGET - 90.0 - SWEEP_SAMPLES) / 10
    )


def test_the_noise_is_seeded_and_can_be_turned_off(tmp_path: Path) -> None:
    def document(seed: int, noise: float) -> dict[str, Any]:
        cluster = toy_cluster(tmp_path, seed=seed, noise=noise)
        cluster.snapshot()
        cluster.apply([grant(Start, "fast")])
        cluster.advance(60.0)
        written = cluster.snapshot().jobs[0].profiled_document
        assert written is not None
        return written

    assert document(1, 0.05) == document(1, 0.05)
    assert document(1, 0.05) != document(2, 0.05)
    exact = {p["local_bsz"]: p["step_time"] for p in document(1, 0.0)["seed"]}
    assert exact == {5: 1.0, 10: 1.0, 20: 2.0}


# ------------------------------------------------------------------------------------------
# With the controller


@pytest.fixture(scope="module")
def inputs() -> SimulationInputs:
    return load_inputs(HETERO64)


@pytest.fixture(scope="module")
def four_jobs(inputs: SimulationInputs) -> Workload:
    """cifar10-0, deepspeech2-1, cifar10-2, deepspeech2-3 (Philly workload-1)."""
    (workload,) = load_sim_workloads(PHILLY_1, inputs, max_jobs=4)
    return workload


def run(
    workload: Workload, inputs: SimulationInputs, **config: Any
) -> tuple[SimulationResult, list[dict[str, Any]]]:
    log = io.StringIO()
    result = simulate(workload, inputs, SimulationConfig(**config), log=log)
    assert result.stopped == ""
    return result, [json.loads(line) for line in log.getvalue().splitlines()]


def sweeps(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """(job, GPU type) of every Start/Move with a profiling sweep, in order."""
    return [
        (action["job"], action["config"].split(":")[0])
        for line in lines
        for action in line["actions"]
        if "profile_sweep" in action
    ]


@pytest.mark.heavy
def test_each_job_is_profiled_once_on_every_type_and_completes(
    inputs: SimulationInputs, four_jobs: Workload
) -> None:
    result, lines = run(four_jobs, inputs, profiling="each")
    assert all(job.finish_time is not None for job in result.jobs)
    assert all(line["failed"] == [] for line in lines)
    types = {t.name for t in inputs.cluster.gpu_types}
    swept = sweeps(lines)
    for job in result.jobs:
        on = [gpu_type for name, gpu_type in swept if name == job.name]
        assert sorted(on) == sorted(types), job.name  # one sweep per type
        assert job.sweeps == len(types) and job.profiling_gpu_seconds > 0
    # Deterministic: the same seed gives the same run.
    again, _ = run(four_jobs, inputs, profiling="each")
    assert again.jobs == result.jobs


@pytest.mark.heavy
def test_shared_profiles_each_app_once_per_account(
    inputs: SimulationInputs, four_jobs: Workload, tmp_path: Path
) -> None:
    result, lines = run(four_jobs, inputs, profiling="shared")
    assert all(job.finish_time is not None for job in result.jobs)
    by_app = Counter(job.split("-")[0] for job, _ in sweeps(lines))
    assert by_app == {"cifar10": 3, "deepspeech2": 3}
    # Two accounts of one app: one profile each.
    path = tmp_path / "two-accounts.csv"
    path.write_text(
        "name,time,application,num_replicas,batch_size,account\n"
        + "".join(f"c{i},{60 * i},cifar10,1,128,{'ab'[i % 2]}\n" for i in range(4))
    )
    (workload,) = load_sim_workloads(path, inputs)
    result, lines = run(workload, inputs, profiling="shared")
    assert all(job.finish_time is not None for job in result.jobs)
    accounts = {job.name: job.account for job in result.jobs}
    assert Counter(accounts[job] for job, _ in sweeps(lines)) == {"a": 3, "b": 3}


@pytest.mark.heavy
def test_a_lone_job_pays_for_its_profiling(inputs: SimulationInputs, tmp_path: Path) -> None:
    """Sia, one cifar10 job alone: profiled, it finishes later than when its model starts from
    the shipped profile, and it is charged exactly its three profiling restarts (50 s each)
    and sweeps. (How much later is not pinned: after profiling, Sia grows the job more slowly,
    its restart factor counting the profiling runs as restarts; the toy test above pins the
    charge itself.)"""
    path = tmp_path / "lone.csv"
    path.write_text("name,time,application,num_replicas,batch_size\nj,0,cifar10,1,128\n")
    (workload,) = load_sim_workloads(path, inputs)
    (off,) = run(workload, inputs)[0].jobs
    result, lines = run(workload, inputs, profiling="each")
    (each,) = result.jobs
    assert each.jct is not None and off.jct is not None and each.jct >= off.jct
    truth = load_workload_truths([workload], inputs)["cifar10"]
    (spec,) = job_specs(workload, {"cifar10": truth}, profiling="each")
    sweep = profile_sweep(profiling_limits(spec.spec))
    expected = sum(
        truth.restart.true_s + plan_sweep(truth.speed[t.name], t.profile, sweep).seconds
        for t in inputs.cluster.gpu_types
    )
    assert len(sweeps(lines)) == 3
    assert each.profiling_gpu_seconds == pytest.approx(expected)


def test_profiling_options_are_checked() -> None:
    with pytest.raises(ValueError, match="profiling: expected one of off, each, shared"):
        SimulationConfig(profiling="sometimes")
    with pytest.raises(ValueError, match="profile_noise"):
        SimulationConfig(profiling="each", profile_noise=-0.1)
