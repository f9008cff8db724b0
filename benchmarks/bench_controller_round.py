"""A full controller round on the real dev cluster: where the time goes.

Brings up a private dev cluster (a100, rtx, t4: 2 nodes x 4 fake GPUs each), submits N managed
protocol jobs (tests/slurm/protocol_job.py reporting the cifar10 seed profile's step times),
and runs service rounds in-process exactly as ``sia-slurm controller run`` does (reconcile,
snapshot, Sia's decision, journal, apply), printing each round's breakdown. Between rounds it
waits, untimed, until every started or moved job reports from its new GPUs, so each round sees
a settled cluster: round 0 starts jobs on 1 GPU, the next rounds grow them (stops with a
checkpoint wait, requeues, updates, releases), later rounds keep or rebatch. Finally one
``controller run --once`` process is timed end to end (interpreter start, imports, loading
the controller's memory from SQLite, the round).

The apply stage of a round with moves is dominated by the jobs themselves: the checkpoint
acknowledgement (polled every 0.25 s) and Slurm taking the GPUs back (COMPLETING -> PENDING).

Usage: PYTHONPATH=. python benchmarks/bench_controller_round.py [--jobs 12] [--rounds 4]
       [--port-base 19817]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sia_slurm.cluster import JobPhase
from sia_slurm.config import SiaConfig, load_config
from sia_slurm.protocol import JobSpec, StatePaths, write_document
from sia_slurm.service import RoundReport, open_controller, run_round
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.state import Store
from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec, controller_config

REPO = Path(__file__).resolve().parent.parent
PROTOCOL_JOB = REPO / "tests" / "slurm" / "protocol_job.py"
SEED_PROFILE = REPO / "profiles" / "cifar10" / "seed.csv"
STAGES = (
    ("reconcile", "reconcile_s"),
    ("snapshot", "snapshot_s"),
    ("observe", "decide_observe_s"),
    ("policy", "decide_policy_s"),
    ("place", "decide_place_s"),
    ("journal", "journal_s"),
    ("apply", "apply_s"),
    ("round", "round_s"),
)


def submit(cluster: DevCluster, paths: StatePaths, sia_id: str) -> str:
    """A held managed job, as sia-sbatch submits it (submitted an hour ago: see the e2e test)."""
    spec = JobSpec(
        sia_id=sia_id,
        app="cifar10",
        max_gpus=4,
        restart_cost=3.0,
        submit_time=time.time() - 3600.0,
        checkpoint_dir=str(paths.job_dir(sia_id)),
    )
    write_document(paths.spec(sia_id), spec)
    script = paths.job_dir(sia_id) / "job.sh"
    script.write_text(
        f"#!/bin/bash\nexec {sys.executable} {PROTOCOL_JOB} --state-dir {paths.state_dir} "
        f"--sia-id {sia_id} --seed-profile {SEED_PROFILE} --profile-type a100=dgx\n"
    )
    argv = ["sbatch", "--parsable", "--hold", "--requeue", "--open-mode=append"]
    argv += ["--gpus-per-node=1", "--partition=t4", f"--comment=sia-slurm:{sia_id}"]
    return cluster.runner().run([*argv, "--output=/dev/null", str(script)]).stdout.strip()


def wait_settled(backend: SlurmBackend, timeout_s: float = 120.0) -> float:
    """Wait until no job is starting (released, or restored but not yet reporting)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout_s:
        jobs = backend.snapshot().jobs
        if not any(job.phase is JobPhase.STARTING for job in jobs):
            return time.monotonic() - t0
        time.sleep(0.5)
    raise SystemExit(f"jobs did not settle within {timeout_s} s")


def action_summary(report: RoundReport) -> str:
    counts: dict[str, int] = {}
    for action in report.actions:
        kind = type(action).__name__.lower()
        counts[kind] = counts.get(kind, 0) + 1
    failed = f", {report.failed} failed" if report.failed else ""
    return (", ".join(f"{k} x{v}" for k, v in sorted(counts.items())) or "none") + failed


def run(config: SiaConfig, config_path: Path, cluster: DevCluster, jobs: int, rounds: int) -> None:
    paths = StatePaths(config.state_dir)
    for i in range(jobs):
        submit(cluster, paths, f"bench-{i:03d}")
    backend = SlurmBackend(config, cluster.runner(timeout_s=60))
    # A second backend watches: a snapshot hands each metrics report on once, and the
    # controller's backend must keep them for its rounds.
    watcher = SlurmBackend(config, cluster.runner(timeout_s=60))
    rows: list[tuple[RoundReport, float]] = []
    with Store.open(config.db_path) as store:
        controller, _ = open_controller(config, store)
        for _ in range(rounds):
            report = run_round(config, backend, store, controller, dry_run=False)
            rows.append((report, wait_settled(watcher)))
    env = {**os.environ, **cluster.env, "PYTHONPATH": str(REPO)}
    log = config.state_dir / "once.jsonl"
    argv = [sys.executable, "-m", "sia_slurm.cli", "controller", "run", "--once"]
    t0 = time.perf_counter()
    argv += ["--config", str(config_path), "--log-file", str(log)]
    subprocess.run(argv, env=env, check=True)
    once_s = time.perf_counter() - t0
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    (once,) = [line for line in lines if line.get("event") == "round"]

    print(f"Controller rounds on the dev cluster ({DEFAULT_SPEC}), {jobs} managed jobs, Sia")
    header = "".join(f"{name:>10}" for name, _ in STAGES)
    print(f"{'round':>5}{header}  {'settle s':>8}  actions")
    for report, settle in rows:
        cells = "".join(f"{report.timings.get(key, 0.0):>10.3f}" for _, key in STAGES)
        print(f"{report.round_index:>5}{cells}  {settle:>8.1f}  {action_summary(report)}")
    print(
        f"one `controller run --once` process, end to end: {once_s:.2f} s "
        f"(its round {once['seconds']:.3f} s, {once['actions']} action(s); the rest is start-up: "
        "interpreter, imports, profiles, the controller's memory from SQLite)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--port-base", type=int, default=19817)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="sia-bench-round-"))
    spec = DevClusterSpec.parse(DEFAULT_SPEC)
    cluster = DevCluster(root / "cluster", port_base=args.port_base)
    cluster.up(spec)
    config_path = root / "sia.yaml"
    config = controller_config(
        spec,
        root / "state",
        round_seconds=10,
        policy_params={"lambda_a": 0.01},  # as etc/sia.yaml: keep equivalent allocations
        checkpoint_timeout_s=30,
    )
    config_path.write_text(config)
    try:
        run(load_config(config_path), config_path, cluster, args.jobs, args.rounds)
    finally:
        cluster.down()


if __name__ == "__main__":
    main()
