"""The test playing the controller for one elastic example job on the real dev cluster: submit
it with sia-sbatch, then stop it (checkpoint + ack) and move it (requeuehold, reshape, a new
assignment, release) as the controller would, and read back what each run trained on
(``samples-r<rank>.jsonl``, one line per micro-batch: ``launcher/examples/ddp_parts.StepLog``).
Shared by the plain-DDP and the Lightning example's move tests."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from sia_slurm.model.batch import split_batch
from sia_slurm.protocol import (
    Assignment,
    JobSpec,
    MetricsReport,
    StatePaths,
    StopRequest,
    read_document,
    write_document,
)
from sia_slurm.slurm.calls import SlurmCalls
from sia_slurm.slurm.runner import CommandRunner
from tests.launcher.test_slurm_job import RTX_LIMIT, wait_for

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
            [sys.executable, "-m", "launcher.sbatch", "--parsable",
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
