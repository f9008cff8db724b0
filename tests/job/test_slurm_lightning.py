"""The Lightning example (sia_slurm/job/examples/lightning_elastic.py) under sia-launch on the real
dev cluster. Moved 1 -> 2 -> 4 GPUs across types as the DDP example is; and to completion on 2
a100 GPUs started by torchrun inside a Slurm batch step, whose SLURM_* variables Lightning must
not take for its ranks: two epochs with gradient accumulation, every sample once per epoch
across the ranks, completed (the launcher's exit record says so, from rank 0's training
record)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from sia_slurm.config import load_config
from sia_slurm.job.elastic.checkpoint import CheckpointManager
from sia_slurm.protocol import Assignment, RunExit, StatePaths, exit_name, read_document
from sia_slurm.protocol import write_document as write
from sia_slurm_dev import DevCluster
from tests.job.moves import (
    SHAPES,
    MovingJob,
    check_epochs,
    check_runs_continue,
    move_through_the_plan,
    read_rows,
)
from tests.job.test_slurm_job import wait_for

REPO = Path(__file__).resolve().parents[2]
DATASET = 48


@pytest.mark.slurm
def test_the_lightning_example_trains_to_completion_on_two_gpus(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    config_path: Path,
    tiny_profile: Path,
    tmp_path: Path,
) -> None:
    paths = StatePaths(load_config(config_path).state_dir)
    job = MovingJob(
        dev_cluster.runner(), paths, tmp_path,
        [
            "--config", str(config_path), "--profile", str(tiny_profile),
            "--num-gpus", "2", "--gpu-type", "a100", "--batch-size", "16", "--",
            "python", "-m", "sia_slurm.job.examples.lightning_elastic", "--epochs", "2",
            "--dataset-size", str(DATASET), "--workers", "0",
            "--sample-log", str(tmp_path / "samples"),
        ],
        slurm_env,
    )  # fmt: skip
    job_id, sia_id, job_out = job.job_id, job.sia_id, job.job_out
    # 2 GPUs x 4 samples x 2 micro-batches: accumulation on both ranks
    write(
        paths.assignment(sia_id),
        Assignment(sia_id, 1, "a100", "a100", 1, 2, (), 16, 4, 1, slurm_job_id=job_id),
    )
    dev_cluster.runner().run(["scontrol", "release", job_id])
    exit_path = paths.job_dir(sia_id) / exit_name(job_id, 0)
    wait_for("the run's exit record", exit_path.exists, 150, job_out)
    record = read_document(RunExit, exit_path)
    assert (record.cause, record.status) == ("completed", 0), job_out.read_text()[-3000:]

    rows = read_rows(job.samples)
    assert {row["rank"] for row in rows} == {0, 1}
    assert {(row["replicas"], row["local_bsz"], row["accum_steps"]) for row in rows} == {(2, 4, 1)}
    for epoch in range(2):
        counts = Counter(i for row in rows if row["epoch"] == epoch for i in row["indices"])
        assert sorted(counts) == list(range(DATASET)) and max(counts.values()) == 1
    assert CheckpointManager(job.spec.checkpoint_dir).steps()[0] == 2 * DATASET // 16


@pytest.mark.slurm
def test_the_lightning_example_moves_1_2_4_gpus_across_types(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    config_path: Path,
    tiny_profile: Path,
    tmp_path: Path,
) -> None:
    """The DDP example's moves (test_slurm_elastic_ddp.py) under Lightning's Trainer: 1 t4 GPU
    -> 2 a100 GPUs -> 4 rtx GPUs on 2 nodes with accumulation; every run stops on request
    (checkpoint + ack), the step count goes on where it stopped, every sample once per epoch,
    and each run trains the shape it was assigned."""
    paths = StatePaths(load_config(config_path).state_dir)
    job = MovingJob(
        dev_cluster.runner(), paths, tmp_path,
        [
            "--config", str(config_path), "--profile", str(tiny_profile),
            "--num-gpus", "1", "--gpu-type", "t4", "--batch-size", "16",
            "--export=ALL,SIA_METRICS_INTERVAL_S=0.5,SIA_LINGER_S=120", "--",
            "python", "-m", "sia_slurm.job.examples.lightning_elastic", "--epochs", "1000",
            "--dataset-size", str(DATASET), "--workers", "0",
            "--sample-log", str(tmp_path / "samples"),
        ],
        slurm_env,
    )  # fmt: skip
    check_runs_continue(move_through_the_plan(job, 6))
    rows = read_rows(job.samples)
    for row in rows:
        shape = (row["gpu_type"], row["replicas"], row["local_bsz"], row["accum_steps"])
        assert shape == SHAPES[row["restarts"]], row
    check_epochs(rows, DATASET)
