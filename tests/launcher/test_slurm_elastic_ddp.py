"""The DDP example made elastic (launcher/examples/ddp_elastic.py: DataLoader workers, bf16
autocast, a GradScaler, clipping) on the real dev cluster, with the test playing the
controller: it moves 1 t4 GPU -> 2 a100 GPUs -> 4 rtx GPUs on 2 nodes (with gradient
accumulation there), each move a stop (checkpoint + ack), requeuehold, reshape, new
assignment, release. Every sample once per epoch, the step count continuous, the loss down
and no jump back at a move, the GradScaler's scale carried over each move, a report from
each type."""

from __future__ import annotations

import itertools
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from launcher.elastic.checkpoint import CheckpointManager
from launcher.examples.ddp_parts import make_dataset, make_model
from sia_slurm.config import load_config
from sia_slurm.devcluster import DevCluster
from sia_slurm.model.batch import split_batch
from sia_slurm.protocol import (
    Assignment,
    JobSpec,
    MetricsReport,
    RunExit,
    StatePaths,
    StopRequest,
    exit_name,
    read_document,
    write_document,
)
from sia_slurm.slurm.calls import SlurmCalls
from tests.launcher.test_slurm_job import RTX_LIMIT, wait_for

REPO = Path(__file__).resolve().parents[2]
DATASET = 96


def read_rows(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.glob("samples-r*.jsonl")):
        rank = int(path.stem.split("-r")[1])
        rows += [{**json.loads(line), "rank": rank} for line in path.read_text().splitlines()]
    return rows


def steps_of(rows: list[dict[str, Any]], restarts: int) -> set[int]:
    return {row["step"] for row in rows if row["restarts"] == restarts}


def full_loss(state: dict[str, Any]) -> float:
    model = make_model(0)
    model.load_state_dict(state)
    images, labels, _ = make_dataset(DATASET, 0).tensors
    with torch.no_grad():
        return float(F.cross_entropy(model(images), labels))


@pytest.mark.slurm
def test_ddp_script_moves_1_2_4_gpus_across_types(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    config_path: Path,
    tiny_profile: Path,
    tmp_path: Path,
) -> None:
    paths = StatePaths(load_config(config_path).state_dir)
    runner = dev_cluster.runner()
    samples, job_out = tmp_path / "samples", tmp_path / "job.out"
    submitted = subprocess.run(
        [
            sys.executable, "-m", "launcher.sbatch", "--parsable",
            "--config", str(config_path), "--profile", str(tiny_profile),
            "--num-gpus", "1", "--gpu-type", "t4", "--batch-size", "16",
            f"--output={job_out}", "--export=ALL,SIA_METRICS_INTERVAL_S=0.5,SIA_LINGER_S=120",
            "--",
            "python", "-m", "launcher.examples.ddp_elastic", "--epochs", "1000",
            "--dataset-size", str(DATASET), "--workers", "1", "--growth-interval", "8",
            "--sample-log", str(samples),
        ],
        cwd=REPO,
        env={**os.environ, **slurm_env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    sia_id = re.search(r"sia job (\S+)", submitted.stderr)[1]  # type: ignore[index]
    spec = read_document(JobSpec, paths.spec(sia_id))

    def report_from(gpu_type: str) -> MetricsReport | None:
        path = paths.metrics(sia_id)
        latest = read_document(MetricsReport, path) if path.exists() else None
        return latest if latest is not None and latest.gpu_type == gpu_type else None

    def stop(round_index: int, run: int) -> None:
        write_document(paths.stop_request(sia_id), StopRequest(sia_id, round_index, time.time()))
        runner.run(["scancel", "--batch", "--signal=USR1", job_id])
        wait_for(
            f"ack-{round_index}", paths.ack(sia_id, round_index, job_id, run).exists, 90, job_out
        )

    def move(round_index: int, run: int, gpu_type: str, nodes: int, gpus: int, batch: int) -> None:
        runner.run(["scontrol", "requeuehold", job_id])
        state = lambda: runner.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()  # noqa: E731
        wait_for("the requeue", lambda: state() == "PENDING", 60, job_out)
        SlurmCalls(runner).run([
            "scontrol", "update", f"JobId={job_id}", f"Partition={gpu_type}",
            f"TresPerNode=gres:gpu:{gpus // nodes}", f"NumNodes={nodes}-{nodes}",
            f"NumTasks={nodes}",
        ])  # fmt: skip
        local_bsz, accum = (int(v) for v in split_batch(batch, gpus, limit(gpu_type)))
        write_document(
            paths.assignment(sia_id),
            Assignment(
                sia_id, round_index, gpu_type, gpu_type, nodes, gpus, (), batch, local_bsz,
                accum, slurm_job_id=job_id, slurm_restart_count=run,
            ),
        )  # fmt: skip
        runner.run(["scontrol", "release", job_id])
        runner.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])

    def limit(gpu_type: str) -> int:
        return {"t4": 16, "a100": 64, "rtx": RTX_LIMIT}[gpu_type]

    # ---- run 0: 1 t4 GPU; run 1: 2 a100 GPUs; run 2: 4 rtx GPUs on 2 nodes ----------------
    write_document(
        paths.assignment(sia_id),
        Assignment(sia_id, 1, "t4", "t4", 1, 1, (), 16, 16, 0, slurm_job_id=job_id),
    )
    runner.run(["scontrol", "release", job_id])
    plan = [(2, "a100", 1, 2, 32), (3, "rtx", 2, 4, 48)]
    wait_for("12 steps on t4", lambda: len(steps_of(read_rows(samples), 0)) >= 12, 180, job_out)
    wait_for("a report from t4", lambda: report_from("t4"), 30, job_out)
    for run, (round_index, gpu_type, nodes, gpus, batch) in enumerate(plan, start=1):
        stop(round_index, run - 1)
        move(round_index, run, gpu_type, nodes, gpus, batch)
        wait_for(
            f"12 steps on {gpu_type}",
            lambda run=run: len(steps_of(read_rows(samples), run)) >= 12,  # type: ignore[misc]
            240,
            job_out,
        )
        wait_for(f"a report from {gpu_type}", lambda t=gpu_type: report_from(t), 30, job_out)  # type: ignore[misc]
    stop(4, 2)
    runner.run(["scancel", job_id])
    for run in range(3):  # each run's launcher judged it from rank 0's record: stopped
        path = paths.job_dir(sia_id) / exit_name(job_id, run)
        wait_for(f"exit record of run {run}", path.exists, 60, job_out)
        record = read_document(RunExit, path)
        assert (record.cause, record.status) == ("stopped", 75), record

    # ---- what each run trained on --------------------------------------------------------
    rows = read_rows(samples)
    runs = [sorted(steps_of(rows, run)) for run in range(3)]
    assert runs[0][0] == 0
    for before, after in itertools.pairwise(runs):
        assert after == list(range(before[-1] + 1, before[-1] + 1 + len(after)))  # continuous
    shapes = {0: ("t4", 1, 16, 0), 1: ("a100", 2, 16, 0), 2: ("rtx", 4, 6, 1)}
    per_step: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        per_step[(row["restarts"], row["step"])].append(row)
        assert (row["gpu_type"], row["replicas"], row["local_bsz"], row["accum_steps"]) == (
            shapes[row["restarts"]]
        )
        assert len(row["indices"]) <= limit(row["gpu_type"])
    for (restarts, _step), step_rows in per_step.items():
        replicas, micro = shapes[restarts][1], shapes[restarts][3] + 1
        full = sum(len(r["indices"]) for r in step_rows) == replicas * micro * shapes[restarts][2]
        if full:  # a whole step: every rank ran every micro-batch
            assert Counter(r["rank"] for r in step_rows) == dict.fromkeys(range(replicas), micro)
    epochs: dict[int, Counter[int]] = defaultdict(Counter)
    for row in rows:
        epochs[row["epoch"]].update(row["indices"])
    last = max(epochs)
    for epoch, counts in epochs.items():
        assert max(counts.values()) == 1, f"epoch {epoch} repeated samples"
        if epoch < last:
            assert sorted(counts) == list(range(DATASET)), f"epoch {epoch} skipped samples"
    assert last >= 3

    # ---- the loss keeps falling over the moves; the GradScaler's scale moves with the job --
    manager = CheckpointManager(spec.checkpoint_dir)
    ends = [steps[-1] + 1 for steps in runs]
    assert manager.steps()[:2] == [ends[2], ends[1]]
    states = [manager.load(end)[1] for end in ends[1:]]  # type: ignore[index]
    initial = full_loss(make_model(0).state_dict())
    losses = [full_loss(state["model"]) for state in states]
    # trained, and not set back by the last move (the loss may have reached its floor)
    assert initial - losses[0] > 0.1 and losses[1] < 1.02 * losses[0], (initial, losses)
    step_loss = {
        step: sum(r["loss"] for r in step_rows) / len(step_rows)
        for (_, step), step_rows in per_step.items()
    }
    for before, after in itertools.pairwise(runs):  # no jump back at a move
        tail = sum(step_loss[s] for s in before[-10:]) / 10
        head = sum(step_loss[s] for s in after[:10]) / 10
        assert head < 1.2 * tail and head < initial - 0.1, (tail, head, initial)
    first_scale = {run: min((r["step"], r["scale"]) for r in rows if r["restarts"] == run)[1]
                   for run in range(3)}  # fmt: skip
    assert states[0]["scaler"]["scale"] == first_scale[2]  # saved by run 1, used by run 2
    assert first_scale[2] > first_scale[0]  # grown every 8 steps and carried, not reset
