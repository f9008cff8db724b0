"""A managed job on the real dev cluster, with the test playing the controller.

Submitted with sia-sbatch, the emulated trainer runs under sia-launch/torchrun (gloo on CPU)
on 2 GPUs of one a100 node; a stop request (stop.json + SIGUSR1 to the batch step) makes it
checkpoint and acknowledge; the test requeues it held, retypes and grows it with scontrol to
4 GPUs of rtx over 2 nodes, writes the new assignment and releases it. The job resumes there:
step count continuous, no sample skipped or repeated, micro-batches within rtx's limit (with
gradient accumulation), metrics reports from both configurations, and the loss of its
checkpoints keeps falling. The actuation sequence is the one of docs/slurm-actuation.md.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.nn import functional as F

from sia_slurm.config import load_config
from sia_slurm.job.elastic.checkpoint import CheckpointManager
from sia_slurm.job.examples.emulated import FEATURES, make_dataset
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
    refusal_name,
    write_document,
)
from sia_slurm.slurm.actuate.calls import SlurmCalls
from sia_slurm_dev import DevCluster

REPO = Path(__file__).resolve().parents[2]
DATASET = 96
RTX_LIMIT = 8  # max_local_bsz of rtx in the tiny profile (conftest.TINY_LIMITS)


def wait_for(what: str, check: Callable[[], Any], timeout_s: float, job_out: Path) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    tail = job_out.read_text()[-3000:] if job_out.exists() else "(no job output)"
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}; job output:\n{tail}")


def read_samples(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.glob("samples-r*.jsonl")):
        rank = int(path.stem.split("-r")[1])
        for line in path.read_text().splitlines():
            rows.append({**json.loads(line), "rank": rank})
    return rows


def steps_of(rows: list[dict[str, Any]], restarts: int) -> set[int]:
    return {row["step"] for row in rows if row["restarts"] == restarts}


def full_loss(state: dict[str, Any]) -> float:
    model = torch.nn.Linear(FEATURES, 1)
    model.load_state_dict(state)
    inputs, targets = make_dataset(DATASET, 0).tensors
    with torch.no_grad():
        return float(F.mse_loss(model(inputs).squeeze(1), targets))


@pytest.mark.slurm
def test_job_stops_on_request_and_resumes_on_another_type_and_size(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    config_path: Path,
    tiny_profile: Path,
    tmp_path: Path,
) -> None:
    config = load_config(config_path)
    paths = StatePaths(config.state_dir)
    scontrol = dev_cluster.runner()
    samples, job_out = tmp_path / "samples", tmp_path / "job.out"

    def show_job() -> dict[str, str]:
        fields = ("JobState", "Partition", "NodeList", "Comment", "Reason")
        line = scontrol.run(["squeue", "-h", "-j", job_id, "-o", "%T|%P|%N|%k|%r"]).stdout
        return dict(zip(fields, line.strip().split("|"), strict=True))

    def report() -> MetricsReport | None:
        path = paths.metrics(sia_id)
        return read_document(MetricsReport, path) if path.exists() else None

    # ---- submit with sia-sbatch -----------------------------------------------------------
    submitted = subprocess.run(
        [
            sys.executable, "-m", "sia_slurm.job.sbatch",
            "--config", str(config_path), "--profile", str(tiny_profile),
            "--num-gpus", "2", "--gpu-type", "a100", "--batch-size", "16",
            f"--output={job_out}", "--export=ALL,SIA_METRICS_INTERVAL_S=0.5,SIA_LINGER_S=120",
            "--",
            "python", "-m", "sia_slurm.job.examples.emulated", "--epochs", "1000",
            "--dataset-size", str(DATASET), "--lr", "0.005", "--time-scale", "4",
            "--sample-log", str(samples),
        ],
        cwd=REPO,
        env={**os.environ, **slurm_env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = re.fullmatch(r"Submitted batch job (\d+)\n", submitted.stdout)[1]  # type: ignore[index]
    sia_id = re.search(r"sia job (\S+)", submitted.stderr)[1]  # type: ignore[index]
    spec = read_document(JobSpec, paths.spec(sia_id))
    assert (spec.app, spec.init_batch_size, spec.requested_gpus) == ("tiny", 16, 2)
    job = show_job()
    assert job["JobState"] == "PENDING" and job["Reason"] == "JobHeldUser"
    assert job["Comment"] == f"sia-slurm:{sia_id}" and job["Partition"] == "a100"

    # ---- round 1: start on 2 GPUs of one a100 node ----------------------------------------
    write_document(
        paths.assignment(sia_id),
        Assignment(
            sia_id, 1, "a100", "a100", 1, 2, (), batch_size=16, local_bsz=8, accum_steps=0,
            slurm_job_id=job_id, slurm_restart_count=0,
        ),
    )  # fmt: skip
    scontrol.run(["scontrol", "release", job_id])
    wait_for(
        "20 steps on a100", lambda: len(steps_of(read_samples(samples), 0)) >= 20, 120, job_out
    )
    first = wait_for("a report from a100", report, 30, job_out)
    assert (first.gpu_type, first.nodes, first.gpus, first.local_bsz) == ("a100", 1, 2, 8)

    # ---- round 2: stop (checkpoint + ack), requeue held, retype and grow, release ----------
    write_document(paths.stop_request(sia_id), StopRequest(sia_id, 2, time.time()))
    scontrol.run(["scancel", "--batch", "--signal=USR1", job_id])
    wait_for("ack-2", paths.ack(sia_id, 2, job_id, 0).exists, 60, job_out)
    trained = len(steps_of(read_samples(samples), 0))
    time.sleep(1.0)
    assert show_job()["JobState"] == "RUNNING"  # idle, waiting for the requeue
    assert len(steps_of(read_samples(samples), 0)) == trained  # ... and not training
    scontrol.run(["scontrol", "requeuehold", job_id])
    wait_for("the requeue", lambda: show_job()["JobState"] == "PENDING", 60, job_out)
    # Through SlurmCalls, as the controller: 24.11 and 26.05 refuse a Partition= change now
    # and then with EAGAIN when there is no slurmdbd, and it sends the update again.
    SlurmCalls(scontrol).run([
        "scontrol", "update", f"JobId={job_id}", "Partition=rtx", "TresPerNode=gres:gpu:2",
        "NumNodes=2-2", "NumTasks=2",
    ])  # fmt: skip
    local_bsz, accum = (int(v) for v in split_batch(48, 4, RTX_LIMIT))
    write_document(
        paths.assignment(sia_id),
        Assignment(
            sia_id,
            2,
            "rtx",
            "rtx",
            2,
            4,
            (),
            48,
            local_bsz,
            accum,
            slurm_job_id=job_id,
            slurm_restart_count=1,
        ),
    )
    scontrol.run(["scontrol", "release", job_id])
    scontrol.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])
    wait_for("10 steps on rtx", lambda: len(steps_of(read_samples(samples), 1)) >= 10, 180, job_out)
    job = show_job()
    assert (job["JobState"], job["Partition"], job["NodeList"]) == ("RUNNING", "rtx", "rtx-[1-2]")

    def rtx_report() -> MetricsReport | None:
        latest = report()
        return latest if latest is not None and latest.gpu_type == "rtx" else None

    second = wait_for("a report from rtx", rtx_report, 30, job_out)
    assert (second.nodes, second.gpus, second.local_bsz, second.accum_steps) == (2, 4, 6, 1)
    assert second.round_index == 2 and second.steps > first.steps

    # ---- round 3: stop again, for a checkpoint of the second run; then cancel -------------
    write_document(paths.stop_request(sia_id), StopRequest(sia_id, 3, time.time()))
    scontrol.run(["scancel", "--batch", "--signal=USR1", job_id])
    wait_for("ack-3", paths.ack(sia_id, 3, job_id, 1).exists, 60, job_out)
    scontrol.run(["scancel", job_id])
    stopped = "stopped on request and checkpointed; exit 75"
    wait_for("the launcher's stop line", lambda: stopped in job_out.read_text(), 30, job_out)
    for run in (0, 1):  # each run left how it ended: stopped for the controller
        path = paths.job_dir(sia_id) / exit_name(job_id, run)
        wait_for(f"exit record of run {run}", path.exists, 30, job_out)
        record = read_document(RunExit, path)
        assert (record.cause, record.status) == ("stopped", 75), record

    # ---- what the job trained on ----------------------------------------------------------
    rows = read_samples(samples)
    run1, run2 = sorted(steps_of(rows, 0)), sorted(steps_of(rows, 1))
    assert run1 == list(range(len(run1)))
    assert run2 == list(range(len(run1), len(run1) + len(run2)))  # continuous step count
    per_step: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        per_step[(row["restarts"], row["step"])].append(row)
    for (restarts, _step), step_rows in per_step.items():
        assert sorted(r["rank"] for r in step_rows) == list(range(2 if restarts == 0 else 4))
        for row in step_rows:
            if restarts == 0:
                assert (row["gpu_type"], row["batch_size"], row["local_bsz"]) == ("a100", 16, 8)
            else:
                assert (row["gpu_type"], row["replicas"], row["batch_size"]) == ("rtx", 4, 48)
                assert (row["local_bsz"], row["accum_steps"]) == (6, 1)
                assert all(len(micro) <= RTX_LIMIT for micro in row["micro_batches"])
    epochs: dict[int, Counter[int]] = defaultdict(Counter)
    for row in rows:
        epochs[row["epoch"]].update(i for micro in row["micro_batches"] for i in micro)
    last = max(epochs)
    for epoch, counts in epochs.items():
        assert max(counts.values()) == 1, f"epoch {epoch} repeated samples"
        if epoch < last:
            assert sorted(counts) == list(range(DATASET)), f"epoch {epoch} skipped samples"
    assert rows[0]["epoch"] < last  # the run crossed whole epochs, the restart included

    # ---- the loss keeps falling: initial model > first run's checkpoint > second run's -----
    manager = CheckpointManager(spec.checkpoint_dir)
    assert manager.steps() == [run2[-1] + 1, run1[-1] + 1]
    torch.manual_seed(0)
    initial = full_loss(torch.nn.Linear(FEATURES, 1).state_dict())
    after_first = full_loss(manager.load(run1[-1] + 1)[1]["model"])  # type: ignore[index]
    after_second = full_loss(manager.load(run2[-1] + 1)[1]["model"])  # type: ignore[index]
    assert initial > after_first > after_second, (initial, after_first, after_second)


@pytest.mark.slurm
def test_launcher_refuses_an_allocation_that_is_not_the_assignment(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    config_path: Path,
    tmp_path: Path,
) -> None:
    paths = StatePaths(load_config(config_path).state_dir)
    job_out = tmp_path / "job.out"
    submitted = subprocess.run(
        [
            sys.executable, "-m", "sia_slurm.job.sbatch", "--parsable",
            "--config", str(config_path),
            "--app", "cifar10", "--num-gpus", "2", "--gpu-type", "t4", f"--output={job_out}",
            "--export=ALL,SIA_MISMATCH_WAIT_S=4",
            "--", "python", "-m", "sia_slurm.job.examples.cnn",
        ],
        cwd=REPO,
        env={**os.environ, **slurm_env, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.strip()
    assert job_id.isdigit()
    sia_id = re.search(r"sia job (\S+)", submitted.stderr)[1]  # type: ignore[index]
    # the controller "forgot" to retarget the job: the assignment says 4 GPUs of rtx
    write_document(
        paths.assignment(sia_id),
        Assignment(sia_id, 1, "rtx", "rtx", 1, 4, (), 128, 32, 0, slurm_job_id=job_id),
    )
    runner = dev_cluster.runner()
    runner.run(["scontrol", "release", job_id])

    def exit_code() -> str | None:
        shown = runner.run(["scontrol", "-o", "show", "job", job_id]).stdout
        state = re.search(r"JobState=(\S+)", shown)[1]  # type: ignore[index]
        return re.search(r"ExitCode=(\S+)", shown)[1] if state == "FAILED" else None  # type: ignore[index]

    # No controller runs here to requeue the refused run, so the launcher gives up after
    # SIA_MISMATCH_WAIT_S; it trained nothing meanwhile.
    assert wait_for("the launcher to refuse", exit_code, 60, job_out) == "3:0"
    output = job_out.read_text()
    assert "not training:" in output and "waiting for the controller" in output
    assert "torch.distributed.run" not in output  # torchrun never started
    assert "Slurm's allocation is not the controller's assignment (round 1)" in output
    assert "assignment.json: gpu_type: rtx, but partition t4 holds t4" in output
    assert "assignment.json: gpus per node: 4 (gpus=4), but SLURM_GPUS_ON_NODE=2" in output
    assert "Traceback" not in output
    # The assignment names this very run: the refusal was left for a controller meanwhile,
    # and withdrawn as the launcher gave up.
    assert f"refusal recorded in {paths.job_dir(sia_id) / refusal_name(job_id, 0)}" in output
    assert not (paths.job_dir(sia_id) / refusal_name(job_id, 0)).exists()
    # ... and left its record: refused (the controller's to repair), not the job's failure.
    record = read_document(RunExit, paths.job_dir(sia_id) / exit_name(job_id, 0))
    assert (record.cause, record.status) == ("refused", 3)


@pytest.mark.slurm
def test_a_run_whose_node_fails_is_not_taken_for_a_completion(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    config_path: Path,
    tiny_profile: Path,
    tmp_path: Path,
) -> None:
    """Soak defect 4 (docs/reliability.md): the slurmd of a running job's node dies alone;
    Slurm sets the node DOWN and requeues the job, and srun, told "Node failure", exits while
    the trainer has not completed: with status 0 on 22.05 (a job Slurm does not requeue
    would end COMPLETED untrained) and 1 on 24.11 and 26.05 (the job's own failure, spending its
    --max-failures). Both are ``aborted``: Slurm ended the run (the launcher asks it)."""
    config = load_config(config_path)
    paths = StatePaths(config.state_dir)
    runner = dev_cluster.runner()
    samples, job_out = tmp_path / "samples", tmp_path / "job.out"
    submitted = subprocess.run(
        [
            sys.executable, "-m", "sia_slurm.job.sbatch", "--parsable",
            "--config", str(config_path),
            "--profile", str(tiny_profile), "--num-gpus", "1", "--gpu-type", "t4",
            "--batch-size", "8", f"--output={job_out}", "--export=ALL,SIA_METRICS_INTERVAL_S=0.5",
            "--", "python", "-m", "sia_slurm.job.examples.emulated", "--epochs", "100000",
            "--dataset-size", str(DATASET), "--time-scale", "4", "--sample-log", str(samples),
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
    write_document(
        paths.assignment(sia_id),
        Assignment(sia_id, 1, "t4", "t4", 1, 1, (), 8, 8, 0, slurm_job_id=job_id),
    )
    runner.run(["scontrol", "release", job_id])
    training = paths.job_dir(sia_id) / f"training-{job_id}.0.json"
    wait_for("the trainer to begin", training.exists, 120, job_out)
    wait_for("10 steps", lambda: len(steps_of(read_samples(samples), 0)) >= 10, 120, job_out)
    node = runner.run(["squeue", "-h", "-j", job_id, "-o", "%N"]).stdout.strip()
    exit_file = paths.job_dir(sia_id) / exit_name(job_id, 0)
    try:
        dev_cluster.kill_slurmd(node)  # the job's processes live on, as when slurmd crashes
        wait_for("the run's verdict", exit_file.exists, 240, job_out)
    finally:
        dev_cluster.start_killed()
        runner.run(["scancel", job_id], check=False)
        state = dev_cluster.node_state(node)
        if "DOWN" in state or "DRAIN" in state:
            dev_cluster.resume(node)
        dev_cluster.wait_for_node(node, lambda s: s == "IDLE", "idle again", 120)
    record = read_document(RunExit, exit_file)
    output = job_out.read_text()
    assert f"Node failure on {node}" in output  # what srun was told (exit 0 on 22.05, 1 later)
    assert re.search(r"srun exited with status \d+; aborted", output), output[-3000:]
    assert (record.cause, record.status) == ("aborted", 77), record
    assert not training.exists()  # the evidence is cleared once the verdict is written
