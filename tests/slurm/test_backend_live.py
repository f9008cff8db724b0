"""SlurmBackend against the real 22.05 dev cluster, with tests/slurm/protocol_job.py as the job.

One job goes through start, moves across GPU types and sizes (1 -> 2 -> 4 GPUs on 2 nodes),
an in-place shrink, a shrink by resubmission, replays, a rebatch and a stop; its counter must
continue across every restart. Requeued jobs restart within seconds because the backend cuts
the BeginTime delay to what the revoked credential needs, so the whole module takes well under
a minute.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from sia_slurm.cluster import BatchChoice, JobPhase, JobSnapshot, Move, Rebatch, Start, Stop
from sia_slurm.config import parse_config
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import Assignment, StatePaths, read_document
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.records import parse_records
from sia_slurm_dev import DevCluster

pytestmark = pytest.mark.slurm


def backend_for(cluster: DevCluster, paths: StatePaths, **options: Any) -> SlurmBackend:
    config = parse_config(
        f"state_dir: {paths.state_dir}\npartitions:\n"
        "  a100: {gpu_type: a100, gpus_per_node: 4}\n"
        "  rtx: {gpu_type: rtx, gpus_per_node: 4}\n"
        "  t4: {gpu_type: t4, gpus_per_node: 4}\n"
        "restart: {checkpoint_timeout_s: 20}\n"
    )
    return SlurmBackend(config, cluster.runner(), **options)


def placed(
    kind: type, sia_id: str, round_index: int, gpu_type: str, nodes: list[str], per_node: int
) -> Any:
    config = Configuration(gpu_type, len(nodes), per_node * len(nodes))
    batch = BatchChoice(16 * config.gpus, 16, 0)
    return kind(sia_id, round_index, config, tuple(NodeShare(n, per_node) for n in nodes), batch)


def wait_for_phase(
    backend: SlurmBackend, sia_id: str, phase: JobPhase, timeout_s: float = 40.0
) -> JobSnapshot:
    deadline = time.monotonic() + timeout_s
    while True:
        job = next((j for j in backend.snapshot().jobs if j.sia_id == sia_id), None)
        if job is not None and job.phase is phase:
            return job
        if time.monotonic() > deadline:
            raise AssertionError(f"{sia_id} not {phase} after {timeout_s} s: {job}")
        time.sleep(0.3)


def slurm_job(cluster: DevCluster, job_id: str) -> dict[str, str]:
    (record,) = parse_records(
        cluster.runner().run(["scontrol", "-o", "show", "job", job_id]).stdout
    )
    return record


def test_snapshot_of_the_real_cluster(dev_cluster: DevCluster, live_submitter: Any) -> None:
    runner = dev_cluster.runner()
    managed = live_submitter.submit("snap-pending")
    unmanaged = runner.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "rtx",
            "-w",
            "rtx-1",
            "--gpus-per-node=2",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 120",
        ]
    ).stdout.strip()
    runner.run(["scontrol", "update", "nodename=t4-2", "state=drain", "reason=sia-test"])
    runner.run(
        [
            "scontrol",
            "create",
            "reservation",
            "ReservationName=sia-test",
            "StartTime=now",
            "Duration=10",
            "Nodes=a100-2",
            "Users=root",
            "Flags=MAINT,IGNORE_JOBS",
        ]
    )
    try:
        backend = backend_for(dev_cluster, live_submitter.paths)
        deadline = time.monotonic() + 20
        while slurm_job(dev_cluster, unmanaged)["JobState"] != "RUNNING":
            assert time.monotonic() < deadline, "unmanaged job did not start"
            time.sleep(0.2)
        snapshot = backend.snapshot()
        usable = {node.name: node.usable_gpus for node in snapshot.nodes}
        assert usable == {"a100-1": 4, "a100-2": 0, "rtx-1": 2, "rtx-2": 4, "t4-1": 4, "t4-2": 0}
        (job,) = [j for j in snapshot.jobs if j.sia_id == "snap-pending"]
        assert (job.phase, job.slurm_job_id, job.restarts) == (JobPhase.PENDING, managed, 0)
        assert "held" in job.message
    finally:
        runner.run(["scontrol", "delete", "ReservationName=sia-test"], check=False)
        runner.run(["scontrol", "update", "nodename=t4-2", "state=resume"], check=False)
        runner.run(["scancel", managed, unmanaged], check=False)


def test_start_move_shrink_stop_keep_the_job_going(
    dev_cluster: DevCluster, live_submitter: Any
) -> None:
    runner = dev_cluster.runner()
    paths = live_submitter.paths
    backend = backend_for(dev_cluster, paths)
    first = live_submitter.submit("live-a")
    bystander = runner.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            "rtx",
            "-w",
            "rtx-1",
            "--gpus-per-node=1",
            "-o",
            "/dev/null",
            "--wrap",
            "sleep 300",
        ]
    ).stdout.strip()
    try:
        steps = [
            (Start, 1, "t4", ["t4-1"], 1),
            (Move, 2, "rtx", ["rtx-2"], 2),  # another type, 2 GPUs
            (Move, 3, "a100", ["a100-1", "a100-2"], 2),  # 4 GPUs on 2 nodes
            (Move, 4, "t4", ["t4-2"], 4),  # node-count shrink in place (NumCPUs)
            (Move, 5, "a100", ["a100-1", "a100-2"], 1),  # grow again
        ]
        for kind, round_index, gpu_type, nodes, per_node in steps:
            action = placed(kind, "live-a", round_index, gpu_type, nodes, per_node)
            (result,) = backend.apply([action])
            assert result.ok, result.message
            job = wait_for_phase(backend, "live-a", JobPhase.RUNNING)
            assert job.config == action.config and job.slurm_job_id == first
            assert sorted(s.node for s in job.placement) == nodes
            assert job.restarts == round_index - 1
        # A shrink by resubmission: a new Slurm job carries the same sia id.
        resubmitting = backend_for(dev_cluster, paths, resubmit_shrinks=True)
        shrink = placed(Move, "live-a", 6, "t4", ["t4-1"], 1)
        (result,) = resubmitting.apply([shrink])
        assert result.ok, result.message
        second = result.details["slurm_job_id"]
        assert second != first
        job = wait_for_phase(resubmitting, "live-a", JobPhase.RUNNING)
        assert (job.slurm_job_id, job.restarts, job.config) == (second, 5, shrink.config)
        assert slurm_job(dev_cluster, first)["JobState"] == "CANCELLED"
        # Replays change nothing.
        (again,) = resubmitting.apply([shrink])
        assert again.ok and "already moved" in again.message
        assert slurm_job(dev_cluster, second)["Restarts"] == "0"

        (rebatch,) = resubmitting.apply([Rebatch("live-a", 7, BatchChoice(32, 16, 1))])
        assert rebatch.ok, rebatch.message
        deadline = time.monotonic() + 10
        while not any(e["event"] == "rebatch" for e in live_submitter.events("live-a")):
            assert time.monotonic() < deadline, "the job did not adopt the new batch"
            time.sleep(0.2)

        (stop,) = resubmitting.apply([Stop("live-a", 8)])
        assert stop.ok and stop.details["checkpoint"].startswith("acknowledged"), stop.details
        job = wait_for_phase(resubmitting, "live-a", JobPhase.PENDING)
        assert job.restarts == 6 and "held" in job.message
        (replay,) = resubmitting.apply([Stop("live-a", 8)])
        assert replay.ok and replay.details["checkpoint"] == "job was not running"
        assert not paths.stop_request("live-a").exists()

        events = live_submitter.events("live-a")
        starts = [e for e in events if e["event"] == "start"]
        acks = [e for e in events if e["event"] == "acked"]
        assert [e["round"] for e in starts] == [1, 2, 3, 4, 5, 6]
        assert [(e["partition"], e["nodes"], e["gpus_on_node"]) for e in starts] == [
            ("t4", 1, 1),
            ("rtx", 1, 2),
            ("a100", 2, 2),
            ("t4", 1, 4),
            ("a100", 2, 1),
            ("t4", 1, 1),
        ]
        assert not any(e["event"] == "refused" for e in events)
        # The counter resumes exactly where each checkpoint left it.
        assert [s["counter"] for s in starts[1:]] == [a["counter"] for a in acks[:5]]
        assert starts[-1]["counter"] > starts[0]["counter"]
        assignment = read_document(Assignment, paths.assignment("live-a"))
        assert (assignment.round_index, assignment.slurm_job_id) == (7, second)
        # The unmanaged job was never touched.
        record = slurm_job(dev_cluster, bystander)
        assert (record["JobState"], record["Restarts"]) == ("RUNNING", "0")
    finally:
        runner.run(["scancel", first, bystander], check=False)
        for job in backend.snapshot().jobs:
            runner.run(["scancel", job.slurm_job_id], check=False)
