"""Two training processes on this machine as torchrun would start them for 2 GPUs (gloo on
CPU): the job's SIA_* variables, ranks 0 and 1, one free port for their rendezvous. Shared by
the job-side tests that check what two replicas compute together."""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

from sia_slurm.job.jobenv import JobEnvironment

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_two_ranks(command: list[str], env: JobEnvironment, timeout_s: float) -> list[int]:
    """Run ``command`` as ranks 0 and 1 of ``env``'s job; their exit statuses."""
    base = {
        **os.environ,
        **env.to_env(),
        "PYTHONPATH": str(REPO),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(command, cwd=REPO, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)})
        for r in range(2)
    ]
    return [p.wait(timeout=timeout_s) for p in procs]
