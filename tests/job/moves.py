"""The test playing the controller for one elastic example job on the real dev cluster: submit
it with sia-sbatch, then stop it (checkpoint + ack) and move it (requeuehold, reshape, a new
assignment, release) as the controller would, and read back what each run trained on
(``samples-r<rank>.jsonl``, one line per micro-batch: ``sia_slurm/job/examples/ddp_parts.StepLog``).
Shared by the plain-DDP and the Lightning example's move tests."""

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
from sia_slurm.slurm.actuate.calls import SlurmCalls
from sia_slurm.slurm.runner import CommandRunner
from tests.job.test_slurm_job import RTX_LIMIT, wait_for

REPO = Path(__file__).resolve().parents[2]
LIMITS = {"t4": 16, "a100": 64, "rtx": RTX_LIMIT}  # max_local_bsz of the tiny profile


def read_rows(directory: Path) -> list[dict[str, Any]]:
    rows = []
    for path in sorted(directory.glob("samples-r*.jsonl")):
        rank = int(path.stem.split("-r")[1])
        rows += [{**json.loads(line), "rank": rank} for line in path.read_text().splitlines()]
    return rows


def steps_of(rows: list[dict[str, Any]], restarts: int) -> set[int]:
    return {row["step"] for row in rows if row["restarts"] == restarts}


class MovingJob:
    """One submitted example job, held until :meth:`start`; ``job_out`` is its Slurm output."""

    def __init__(
        self,
        runner: CommandRunner,
        paths: StatePaths,
        tmp_path: Path,
        submit_argv: list[str],
        env: dict[str, str],
    ):
        self.runner, self.paths = runner, paths
        self.samples, self.job_out = tmp_path / "samples", tmp_path / "job.out"
        submitted = subprocess.run(
            [sys.executable, "-m", "sia_slurm.job.sbatch", "--parsable",
             f"--output={self.job_out}", *submit_argv],
            cwd=REPO,
            env={**os.environ, **env, "PYTHONPATH": str(REPO)},
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
        assert submitted.returncode == 0, submitted.stderr
        self.job_id = submitted.stdout.strip()
        self.sia_id = re.search(r"sia job (\S+)", submitted.stderr)[1]  # type: ignore[index]
        self.spec = read_document(JobSpec, paths.spec(self.sia_id))

    def start(self, gpu_type: str, gpus: int, batch: int) -> None:
        """Run 0 on one node of ``gpu_type`` (the partition it was submitted to)."""
        local_bsz, accum = (int(v) for v in split_batch(batch, gpus, LIMITS[gpu_type]))
        write_document(
            self.paths.assignment(self.sia_id),
            Assignment(self.sia_id, 1, gpu_type, gpu_type, 1, gpus, (), batch, local_bsz, accum,
                       slurm_job_id=self.job_id),
        )  # fmt: skip
        self.runner.run(["scontrol", "release", self.job_id])

    def stop(self, round_index: int, run: int) -> None:
        """Ask run ``run`` to stop for ``round_index`` and wait for its ack."""
        paths, sia_id = self.paths, self.sia_id
        write_document(paths.stop_request(sia_id), StopRequest(sia_id, round_index, time.time()))
        self.runner.run(["scancel", "--batch", "--signal=USR1", self.job_id])
        ack = paths.ack(sia_id, round_index, self.job_id, run)
        wait_for(f"ack-{round_index}", ack.exists, 90, self.job_out)

    def move(
        self, round_index: int, run: int, gpu_type: str, nodes: int, gpus: int, batch: int
    ) -> None:
        """Requeue the stopped job and release it as run ``run`` on ``nodes`` x ``gpus``."""
        job_id, runner = self.job_id, self.runner
        runner.run(["scontrol", "requeuehold", job_id])
        state = lambda: runner.run(["squeue", "-h", "-j", job_id, "-o", "%T"]).stdout.strip()  # noqa: E731
        wait_for("the requeue", lambda: state() == "PENDING", 60, self.job_out)
        SlurmCalls(runner).run([
            "scontrol", "update", f"JobId={job_id}", f"Partition={gpu_type}",
            f"TresPerNode=gres:gpu:{gpus // nodes}", f"NumNodes={nodes}-{nodes}",
            f"NumTasks={nodes}",
        ])  # fmt: skip
        local_bsz, accum = (int(v) for v in split_batch(batch, gpus, LIMITS[gpu_type]))
        write_document(
            self.paths.assignment(self.sia_id),
            Assignment(
                self.sia_id, round_index, gpu_type, gpu_type, nodes, gpus, (), batch, local_bsz,
                accum, slurm_job_id=job_id, slurm_restart_count=run,
            ),
        )  # fmt: skip
        runner.run(["scontrol", "release", job_id])
        runner.run(["scontrol", "update", f"JobId={job_id}", "StartTime=now"])

    def report_from(self, gpu_type: str) -> MetricsReport | None:
        """The job's latest metrics report, if a run on ``gpu_type`` wrote it."""
        path = self.paths.metrics(self.sia_id)
        latest = read_document(MetricsReport, path) if path.exists() else None
        return latest if latest is not None and latest.gpu_type == gpu_type else None

    def wait_for_steps(self, run: int, steps: int, gpu_type: str, timeout_s: float) -> None:
        """``steps`` steps of run ``run``, then a metrics report from ``gpu_type``."""
        wait_for(
            f"{steps} steps on {gpu_type}",
            lambda: len(steps_of(read_rows(self.samples), run)) >= steps,
            timeout_s,
            self.job_out,
        )
        wait_for(f"a report from {gpu_type}", lambda: self.report_from(gpu_type), 30, self.job_out)


# The moves both example tests make: run 0 on 1 t4 GPU (round 1), run 1 on 2 a100 GPUs, run 2
# on 4 rtx GPUs on 2 nodes with accumulation; (round, type, nodes, GPUs, batch) and, per run,
# (type, replicas, local batch, accumulation steps).
PLAN = [(2, "a100", 1, 2, 32), (3, "rtx", 2, 4, 48)]
SHAPES = {0: ("t4", 1, 16, 0), 1: ("a100", 2, 16, 0), 2: ("rtx", 4, 6, 1)}


def move_through_the_plan(
    job: MovingJob, steps: int, first_steps: int | None = None
) -> list[list[int]]:
    """Start ``job`` on 1 t4 GPU, move it through :data:`PLAN` after ``steps`` steps each
    (``first_steps`` on the first run, if given), stop and cancel it; every run's launcher
    judged it from rank 0's record: stopped. The sorted steps each run trained."""
    job.start("t4", 1, 16)
    job.wait_for_steps(0, first_steps or steps, "t4", 180)
    for run, (round_index, gpu_type, nodes, gpus, batch) in enumerate(PLAN, start=1):
        job.stop(round_index, run - 1)
        job.move(round_index, run, gpu_type, nodes, gpus, batch)
        job.wait_for_steps(run, steps, gpu_type, 240)
    job.stop(4, 2)
    job.runner.run(["scancel", job.job_id])
    for run in range(3):
        path = job.paths.job_dir(job.sia_id) / exit_name(job.job_id, run)
        wait_for(f"exit record of run {run}", path.exists, 60, job.job_out)
        record = read_document(RunExit, path)
        assert (record.cause, record.status) == ("stopped", 75), record
    return [sorted(steps_of(read_rows(job.samples), run)) for run in range(3)]


def check_runs_continue(runs: list[list[int]]) -> None:
    """The first run starts at step 0 and each goes on where the one before stopped."""
    assert runs[0][0] == 0
    for before, after in itertools.pairwise(runs):
        assert after == list(range(before[-1] + 1, before[-1] + 1 + len(after)))  # continuous


def check_epochs(rows: list[dict[str, Any]], dataset: int) -> int:
    """No sample twice in an epoch, none skipped in a finished one; the last epoch."""
    epochs: dict[int, Counter[int]] = defaultdict(Counter)
    for row in rows:
        epochs[row["epoch"]].update(row["indices"])
    last = max(epochs)
    for epoch, counts in epochs.items():
        assert max(counts.values()) == 1, f"epoch {epoch} repeated samples"
        if epoch < last:
            assert sorted(counts) == list(range(dataset)), f"epoch {epoch} skipped samples"
    return last
