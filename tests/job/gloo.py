"""Training processes on this machine as torchrun would start them for 2 (or ``count``) GPUs
(gloo on CPU): the job's SIA_* variables, ranks 0..count-1, one free port for their
rendezvous. Shared by the job-side tests that check what replicas compute together. The ranks
are forked from a zygote that has imported PyTorch (tests/zygote.py): 2 s of CPU each saved."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from sia_slurm.job.jobenv import JobEnvironment
from tests import zygote

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_ranks(
    command: list[str],
    env: JobEnvironment,
    timeout_s: float,
    *,
    count: int = 2,
    unset: tuple[str, ...] = (),
    preload: tuple[str, ...] = zygote.TORCH,
) -> list[int]:
    """Run ``command`` as ranks 0..count-1 of ``env``'s job, without the variables ``unset``;
    their exit statuses."""
    base = {
        **os.environ,
        **env.to_env(),
        "PYTHONPATH": str(REPO),
        "WORLD_SIZE": str(count),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "OMP_NUM_THREADS": "1",
    }
    for name in unset:
        base.pop(name, None)
    ranks = [
        zygote.popen(
            command, cwd=REPO, env={**base, "RANK": str(r), "LOCAL_RANK": str(r)}, preload=preload
        )
        for r in range(count)
    ]
    return [rank.wait(timeout=timeout_s) for rank in ranks]


def run_two_ranks(command: list[str], env: JobEnvironment, timeout_s: float) -> list[int]:
    """Run ``command`` as ranks 0 and 1 of ``env``'s job; their exit statuses."""
    return run_ranks(command, env, timeout_s)
