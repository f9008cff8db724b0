"""The Lightning example (launcher/examples/lightning_elastic.py) under sia-launch on the real
dev cluster: 2 a100 GPUs started by torchrun inside a Slurm batch step, whose SLURM_*
variables Lightning must not take for its ranks; it trains two epochs with gradient
accumulation, every sample once per epoch across the ranks, and completes (the launcher's exit
record says so, from rank 0's training record)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from launcher.elastic.checkpoint import CheckpointManager
from sia_slurm.config import load_config
from sia_slurm.devcluster import DevCluster
from sia_slurm.protocol import Assignment, JobSpec, RunExit, StatePaths, exit_name, read_document
from sia_slurm.protocol import write_document as write
from tests.launcher.test_slurm_job import wait_for

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
    samples, job_out = tmp_path / "samples", tmp_path / "job.out"
    submitted = subprocess.run(
        [
            sys.executable, "-m", "launcher.sbatch", "--parsable",
            "--config", str(config_path), "--profile", str(tiny_profile),
            "--num-gpus", "2", "--gpu-type", "a100", "--batch-size", "16",
            f"--output={job_out}", "--",
            "python", "-m", "launcher.examples.lightning_elastic", "--epochs", "2",
            "--dataset-size", str(DATASET), "--workers", "0", "--sample-log", str(samples),
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

    rows = [
        {**json.loads(line), "rank": int(path.stem.split("-r")[1])}
        for path in sorted(samples.glob("samples-r*.jsonl"))
        for line in path.read_text().splitlines()
    ]
    assert {row["rank"] for row in rows} == {0, 1}
    assert {(row["replicas"], row["local_bsz"], row["accum_steps"]) for row in rows} == {(2, 4, 1)}
    for epoch in range(2):
        counts = Counter(i for row in rows if row["epoch"] == epoch for i in row["indices"])
        assert sorted(counts) == list(range(DATASET)) and max(counts.values()) == 1
    assert CheckpointManager(spec.checkpoint_dir).steps()[0] == 2 * DATASET // 16
