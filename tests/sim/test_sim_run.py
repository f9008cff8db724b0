"""The simulation driver end to end: the production controller on the simulated cluster."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from sia_slurm.policy.pollux import PolluxPolicyConfig
from sia_slurm.policy.sia import SiaPolicyConfig
from sia_slurm.sim.apptruth import SimInputError
from sia_slurm.sim.inputs import (
    SimulationInputs,
    job_specs,
    load_inputs,
    load_sim_workloads,
    load_workload_truths,
)
from sia_slurm.sim.run import SimulationConfig, simulate
from sia_slurm.sim.simulated_cluster import SimulatedCluster
from sia_slurm.sim.workload import Workload

REPO = Path(__file__).resolve().parents[2]
HETERO64 = REPO / "etc" / "clusters" / "hetero64.yaml"
PHILLY_1 = REPO / "data" / "workloads" / "philly" / "workload-1.csv"
HEADER = "name,time,application,num_replicas,batch_size\n"


@pytest.fixture(scope="module")
def inputs() -> SimulationInputs:
    return load_inputs(HETERO64)


@pytest.fixture(scope="module")
def six_jobs(inputs: SimulationInputs) -> Workload:
    (workload,) = load_sim_workloads(PHILLY_1, inputs, max_jobs=6)
    return workload


@pytest.mark.parametrize(
    "policy",
    [
        pytest.param("sia", marks=pytest.mark.heavy),
        pytest.param("pollux", marks=pytest.mark.heavy),
        pytest.param("gavel", marks=pytest.mark.heavy),
        "fifo",
    ],
)
def test_every_policy_finishes_six_jobs_without_oversubscribing(
    inputs: SimulationInputs, six_jobs: Workload, policy: str
) -> None:
    capacity = {t.name: t.gpus for t in inputs.cluster.gpu_types}
    node_size = {
        f"{t.name}-{i}": t.gpus_per_node for t in inputs.cluster.gpu_types for i in range(t.nodes)
    }
    overfull: list[str] = []

    def check_nodes(cluster: SimulatedCluster) -> None:
        usage = cluster.node_usage()
        overfull.extend(f"{n}: {g}" for n, g in usage.items() if g > node_size[n])
        held = cluster.gpus_held()
        for gpu_type in capacity:
            assert held[gpu_type] == sum(g for n, g in usage.items() if n.startswith(gpu_type))

    log = io.StringIO()
    # A smaller genetic search keeps Pollux's test quick; the driver does not care.
    params = PolluxPolicyConfig(population=20, generations=20) if policy == "pollux" else None
    config = SimulationConfig(policy=policy, params=params)
    result = simulate(six_jobs, inputs, config, log=log, on_round=check_nodes)
    assert result.stopped == ""
    assert [job.name for job in result.jobs] == [job.name for job in six_jobs.jobs]
    assert all(
        job.finish_time is not None and job.finish_time > job.submit_time for job in result.jobs
    )
    assert all(job.gpu_seconds > 0 for job in result.jobs)
    assert overfull == []
    lines = [json.loads(line) for line in log.getvalue().splitlines()]
    assert len(lines) == len(result.rounds) > 0
    for line in lines:
        for gpu_type, held in line["gpus"].items():
            assert held <= capacity[gpu_type], line
        assert line["failed"] == [], line
    finished = [name for line in lines for name in line["finished"]]
    assert sorted(finished) == sorted(job.name for job in six_jobs.jobs)
    starts = [a for line in lines for a in line["actions"] if a["action"] == "start"]
    requested = {job.name: job.num_replicas for job in six_jobs.jobs}
    if policy in ("gavel", "fifo"):  # they run jobs at the size the user asked for
        assert all(sum(a["nodes"].values()) == requested[a["job"]] for a in starts)
    if policy == "sia":  # Sia starts every job on one GPU (growth cap), then grows it
        first = {}
        for a in starts:
            first.setdefault(a["job"], sum(a["nodes"].values()))
        assert set(first.values()) == {1}
    metrics = result.metrics()
    assert metrics.completed == 6 and metrics.avg_jct_h > 0 and metrics.makespan_h > 0


def test_the_simulation_is_deterministic(inputs: SimulationInputs, six_jobs: Workload) -> None:
    config = SimulationConfig(policy="fifo")
    first = simulate(six_jobs, inputs, config)
    second = simulate(six_jobs, inputs, config)
    assert first.jobs == second.jobs


def test_golden_fifo_run(inputs: SimulationInputs) -> None:
    """A small fixed run whose numbers are pinned, so any change of behaviour shows up here.

    FIFO on the first four Philly jobs: no solver and no fitting, only the ground truth, the
    restart delays, the controller's batch split and placement decide the result. Update the
    numbers only for an intended change, and say why in the commit. (FIFO never preempts: no
    restarts. Before FIFO and Gavel checked node fit and placement's evictions became
    transactional, both deepspeech2 jobs restarted 95 times here.)
    """
    (workload,) = load_sim_workloads(PHILLY_1, inputs, max_jobs=4)
    result = simulate(workload, inputs, SimulationConfig(policy="fifo"))
    got = {job.name: (round((job.jct or 0.0) / 3600, 4), job.restarts) for job in result.jobs}
    assert got == GOLDEN_FIFO


GOLDEN_FIFO = {  # job: (JCT in hours, restarts)
    "cifar10-0": (0.5196, 0),
    "deepspeech2-1": (1.5107, 0),
    "cifar10-2": (0.1835, 0),
    "deepspeech2-3": (0.6917, 0),
}


def test_policy_params_must_match_the_policy() -> None:
    with pytest.raises(TypeError, match="policy 'pollux' takes a PolluxPolicyConfig"):
        SimulationConfig(policy="pollux", params=SiaPolicyConfig())
    with pytest.raises(ValueError, match="unknown policy 'tetris'"):
        SimulationConfig(policy="tetris")


def test_idle_stretches_are_skipped(inputs: SimulationInputs, tmp_path: Path) -> None:
    path = tmp_path / "late.csv"
    path.write_text(HEADER + "late,86400,cifar10,1,128\n")
    (workload,) = load_sim_workloads(path, inputs)
    result = simulate(workload, inputs, SimulationConfig(policy="fifo"))
    assert result.rounds[0].time == 86400.0
    assert result.jobs[0].finish_time is not None


def test_a_job_that_can_never_run_stops_the_simulation(
    inputs: SimulationInputs, tmp_path: Path
) -> None:
    path = tmp_path / "huge.csv"
    path.write_text(HEADER + "huge,0,cifar10,32,4096\n")  # no GPU type has 32 GPUs
    (workload,) = load_sim_workloads(path, inputs)
    result = simulate(workload, inputs, SimulationConfig(policy="fifo", stall_rounds=5))
    assert "stalled" in result.stopped
    assert result.jobs[0].finish_time is None
    assert result.metrics().completed == 0


def test_workload_rows_become_adaptive_specs_with_the_users_request(
    inputs: SimulationInputs, six_jobs: Workload
) -> None:
    truths = load_workload_truths([six_jobs], inputs)
    specs = job_specs(six_jobs, truths)
    first = specs[0].spec  # cifar10-0,107,cifar10,6,2048
    assert (first.sia_id, first.app, first.kind.value) == ("cifar10-0", "cifar10", "adaptive")
    assert (first.requested_gpus, first.requested_batch_size) == (6, 2048)
    assert first.init_batch_size == 0  # the profile's M0 (128), not the row's batch
    assert first.restart_cost == 30.0  # what the policy assumes; the cluster charges 50 s
    assert specs[0].truth.restart.true_s == 50.0
    assert first.submit_time == 107.0


# ------------------------------------------------------------------------------------------
# Bad inputs


def write(tmp_path: Path, text: str, name: str = "w.csv") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HEADER + "a,0,gpt_pmp,4,64\n", ":2: application: expected one of bert, cifar10"),
        (HEADER + "a,0,resnet,4,64\n", "got 'resnet'"),
        ("name,time,application,num_replicas\na,0,bert,4\n", "missing batch_size"),
        (HEADER + "a,10,bert,4,64\nb,5,bert,4,64\n", ":3: time: expected jobs in order"),
        (HEADER + "a,-1,bert,4,64\n", ":2: time: expected a number of seconds >= 0"),
        (HEADER, "expected at least one job"),
        (HEADER + "a b,0,bert,4,64\n", "name: sia job id"),
    ],
)
def test_bad_workloads_are_rejected_naming_file_and_line(
    inputs: SimulationInputs, tmp_path: Path, text: str, expected: str
) -> None:
    path = write(tmp_path, text)
    with pytest.raises(SimInputError) as caught:
        workloads = load_sim_workloads(path, inputs)
        job_specs(workloads[0], load_workload_truths(workloads, inputs))
    assert str(path) in str(caught.value)
    assert expected in str(caught.value)


def test_gpt_pmp_is_refused_because_it_has_no_profile(
    inputs: SimulationInputs, tmp_path: Path
) -> None:
    path = write(tmp_path, HEADER + "a,0,gpt_pmp,4,64\n")
    with pytest.raises(SimInputError, match=r"needs traces under .* and a profile under"):
        load_sim_workloads(path, inputs)


def test_gpu_type_without_ground_truth_is_rejected(tmp_path: Path) -> None:
    cluster = write(
        tmp_path,
        "gpu_types:\n  t4: {profile: t4, trace_key: aws, gpus_per_node: 4, nodes: 1}\n"
        "  odd: {profile: v100, trace_key: nosuch, gpus_per_node: 8, nodes: 1}\n",
        "odd.yaml",
    )
    odd = load_inputs(cluster)
    (workload,) = load_sim_workloads(write(tmp_path, HEADER + "a,0,bert,4,64\n"), odd)
    with pytest.raises(SimInputError) as caught:
        load_workload_truths([workload], odd)
    message = str(caught.value)
    assert str(cluster) in message
    assert "bert on odd (trace key nosuch)" in message and "placements-nosuch.csv" in message


def test_bad_cluster_file_names_file_line_and_key(tmp_path: Path) -> None:
    cluster = write(
        tmp_path,
        "gpu_types:\n  t4: {profile: t9, trace_key: aws, gpus_per_node: 4, nodes: 0}\n",
        "bad.yaml",
    )
    with pytest.raises(SimInputError) as caught:
        load_inputs(cluster)
    assert f"{cluster}:2: gpu_types.t4.profile: expected one of" in str(caught.value)
    assert "gpu_types.t4.nodes: expected a positive integer, got 0" in str(caught.value)
