"""Slurm backend cost per round on the real dev cluster: wall time and Slurm commands issued.

Brings up a private dev cluster (6 nodes x 4 fake GPUs), submits 200 managed jobs held (as
sia-sbatch does; tests/slurm/protocol_job.py is the job), starts 20 of them, and then times:

* ``snapshot`` of the 200 managed jobs (3 commands whatever the job count);
* a round of ``apply`` without stops: 4 starts + 8 rebatches;
* a round of ``apply`` with 4 stops (signal, shared ack wait, requeue) + 4 starts.

No policy runs: the actions are fixed. Goal: snapshot + apply (no solver) < 1 s. Commands
are counted through a wrapping CommandRunner.

Usage: PYTHONPATH=. python benchmarks/bench_backend.py [--jobs 200] [--running 20]
       [--port-base 19840]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from sia_slurm.cluster import BatchChoice, JobPhase, Rebatch, Start, Stop
from sia_slurm.config import parse_config
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import JobSpec, StatePaths, write_document
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.runner import CommandResult, CommandRunner
from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec, controller_config

REPO = Path(__file__).resolve().parent.parent
PROTOCOL_JOB = REPO / "tests" / "slurm" / "protocol_job.py"
T = TypeVar("T")
NODES = [f"{t}-{i}" for t in ("a100", "rtx", "t4") for i in (1, 2)]


class CountingRunner:
    """Counts every command (by program and verb) on its way to the real runner."""

    def __init__(self, inner: CommandRunner) -> None:
        self.inner = inner
        self.counts: Counter[str] = Counter()

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        self.counts[" ".join(argv[:2]) if argv[0] == "scontrol" else argv[0]] += 1
        return self.inner.run(argv, check=check)

    def take(self) -> Counter[str]:
        counts, self.counts = self.counts, Counter()
        return counts


def submit(runner: CommandRunner, paths: StatePaths, sia_id: str) -> str:
    write_document(paths.spec(sia_id), JobSpec(sia_id=sia_id, app="cifar10"))
    script = paths.job_dir(sia_id) / "job.sh"
    script.write_text(
        f"#!/bin/bash\nexec {sys.executable} {PROTOCOL_JOB} --state-dir {paths.state_dir} "
        f"--sia-id {sia_id}\n"
    )
    out = runner.run(
        [
            "sbatch",
            "--parsable",
            "--hold",
            "--requeue",
            "--open-mode=append",
            "--gpus-per-node=1",
            "--partition=t4",
            f"--comment=sia-slurm:{sia_id}",
            "--output=/dev/null",
            str(script),
        ]
    ).stdout
    return out.strip()


def start(sia_id: str, round_index: int, slot: int) -> Start:
    node = NODES[slot // 4]
    gpu_type = node.split("-")[0]
    return Start(
        sia_id,
        round_index,
        Configuration(gpu_type, 1, 1),
        (NodeShare(node, 1),),
        BatchChoice(32, 32, 0),
    )


def wait_running(backend: SlurmBackend, sia_ids: set[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        phases = {j.sia_id: j.phase for j in backend.snapshot().jobs if j.sia_id in sia_ids}
        if all(phases.get(s) is JobPhase.RUNNING for s in sia_ids):
            return
        time.sleep(0.5)
    raise SystemExit(f"jobs did not all report within {timeout_s} s")


def timed(
    label: str,
    runner: CountingRunner,
    rows: list[tuple[str, float, Counter[str]]],
    fn: Callable[[], T],
) -> T:
    runner.take()
    t0 = time.perf_counter()
    result = fn()
    rows.append((label, time.perf_counter() - t0, runner.take()))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--running", type=int, default=20)
    parser.add_argument("--port-base", type=int, default=19840)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sia-bench-backend-"))
    cluster = DevCluster(root / "cluster", port_base=args.port_base)
    cluster.up(DevClusterSpec.parse(DEFAULT_SPEC))
    try:
        run(cluster, root / "state", args.jobs, args.running)
    finally:
        cluster.down()


def run(cluster: DevCluster, state_dir: Path, jobs: int, running: int) -> None:
    paths = StatePaths(state_dir)
    spec = DevClusterSpec.parse(DEFAULT_SPEC)
    config = parse_config(controller_config(spec, state_dir, checkpoint_timeout_s=30))
    runner = CountingRunner(cluster.runner(timeout_s=60))
    backend = SlurmBackend(config, runner)
    ids = [f"bench-{i:03d}" for i in range(jobs)]
    for sia_id in ids:
        submit(cluster.runner(), paths, sia_id)
    rows: list[tuple[str, float, Counter[str]]] = []
    timed(
        f"apply: {running} starts",
        runner,
        rows,
        lambda: backend.apply([start(s, 1, i) for i, s in enumerate(ids[:running])]),
    )
    wait_running(backend, set(ids[:running]))
    timed(f"snapshot ({jobs} managed jobs)", runner, rows, backend.snapshot)
    free = [running + k for k in range(4)]  # GPU slots 20..23 are still free
    round_a = [start(ids[running + k], 2, free[k]) for k in range(4)]
    round_a += [Rebatch(s, 2, BatchChoice(64, 32, 1)) for s in ids[:8]]
    results = timed("apply: 4 starts + 8 rebatches", runner, rows, lambda: backend.apply(round_a))
    assert all(r.ok for r in results), [r.message for r in results if not r.ok]
    wait_running(backend, set(ids[running : running + 4]))
    timed(f"snapshot ({jobs} managed jobs)", runner, rows, backend.snapshot)
    round_b = [Stop(s, 3) for s in ids[8:12]]
    round_b += [start(ids[running + 4 + k], 3, 8 + k) for k in range(4)]  # the stopped slots
    results = timed("apply: 4 stops + 4 starts", runner, rows, lambda: backend.apply(round_b))
    assert all(r.ok for r in results), [r.message for r in results if not r.ok]
    print(
        f"Slurm backend on the dev cluster ({DEFAULT_SPEC}), {jobs} managed jobs, {running} running"
    )
    print(f"{'step':<34} {'wall s':>8} {'cmds':>5}  commands")
    for label, seconds, counts in rows:
        detail = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
        print(f"{label:<34} {seconds:>8.3f} {sum(counts.values()):>5}  {detail}")


if __name__ == "__main__":
    main()
