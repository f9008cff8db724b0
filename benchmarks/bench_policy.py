"""Policy solve time per round (reference section 4, "Policy runtime"): a printed table.

Sia on the paper's 64-GPU cluster (6 x 4 T4, 3 x 8 RTX, 2 x 8 A100) with 20-60 active jobs and on
5-type clusters of 256-2048 GPUs with proportional job counts; then the Pollux GA and the Gavel
LP. Each round is a full ``policy.solve`` (estimator calls and matrix building included) on
synthetic estimators with realistic shapes (goodput concave in GPUs, slower across nodes, per-type
speed ratios 1-5x); jobs carry over their allocation, age and restart count from round to round,
so restart factors and growth caps are exercised. Goals: Sia median < 50 ms at 64 GPUs and
< 300 ms at 2048 GPUs; Pollux >= 10x faster than the original's ~20 s at 64 jobs on 64 GPUs.

Usage: python benchmarks/bench_policy.py [--rounds N] [--only sia,pollux,gavel] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time

import numpy as np

from sia_slurm.core import JobKind
from sia_slurm.policy.base import Allocation, ClusterView, JobView, PolicyInput
from sia_slurm.policy.registry import make_policy
from sia_slurm.policy.testing import make_cluster, random_synthetic_estimator

PAPER_CLUSTER = [("t4", 6, 4, 1.0), ("rtx", 3, 8, 1.8), ("a100", 2, 8, 5.0)]
FIVE_TYPES = [("t4", 4, 1.0), ("rtx", 8, 1.8), ("v100", 8, 3.0), ("quad", 4, 2.2), ("a100", 8, 5.0)]
ROUND_SECONDS = 60.0


def paper_cluster() -> tuple[ClusterView, list[float]]:
    return make_cluster([(t, n, g) for t, n, g, _ in PAPER_CLUSTER]), [s for *_, s in PAPER_CLUSTER]


def scaled_cluster(total_gpus: int) -> tuple[ClusterView, list[float]]:
    """Five GPU types sharing ``total_gpus`` evenly."""
    target = total_gpus // len(FIVE_TYPES)
    nodes = [target // g for _, g, _ in FIVE_TYPES]
    leftover = total_gpus - sum(n * g for n, (_, g, _) in zip(nodes, FIVE_TYPES, strict=True))
    for i, (_, g, _) in sorted(enumerate(FIVE_TYPES), key=lambda item: -item[1][1]):
        nodes[i] += leftover // g
        leftover %= g
    spec = [(t, n, g) for n, (t, g, _) in zip(nodes, FIVE_TYPES, strict=True)]
    return make_cluster(spec), [s for *_, s in FIVE_TYPES]


def make_jobs(cluster: ClusterView, speeds: list[float], count: int, seed: int) -> list[JobView]:
    rng = np.random.default_rng(seed)
    kinds = [JobKind.ADAPTIVE] * 8 + [JobKind.STRONG_SCALING, JobKind.RIGID]
    return [
        JobView(
            job_id=f"job{i}",
            kind=kinds[int(rng.integers(len(kinds)))],
            estimator=random_synthetic_estimator(rng, cluster.gpu_types, speeds),
            age=float(rng.uniform(0, 7200)),
            submit_time=float(i),
            restart_cost=float(rng.uniform(25, 250)),
            requested_gpus=int(rng.choice([1, 1, 2, 4, 8])),
        )
        for i in range(count)
    ]


def advance(jobs: list[JobView], allocation: Allocation, seconds: float) -> list[JobView]:
    """Jobs one round later: running their new allocation, older, restarted if it changed."""
    advanced = []
    for job in jobs:
        share = allocation.get(job.job_id)
        config = share.config if share else None
        moved = config is not None and job.current is not None and config != job.current
        seen = max(job.max_gpus_seen, config.gpus if config else 0)
        advanced.append(
            dataclasses.replace(
                job,
                age=job.age + seconds,
                current=config,
                restarts=job.restarts + int(moved),
                max_gpus_seen=seen,
            )
        )
    return advanced


def time_rounds(name: str, cluster: ClusterView, jobs: list[JobView], rounds: int) -> list[float]:
    policy = make_policy(name)
    # Gavel re-plans only every 360 s round and keeps its allocation in between: time those.
    seconds = 360.0 if name == "gavel" else ROUND_SECONDS
    previous = None
    times = []
    for r in range(rounds):
        policy_input = PolicyInput(cluster, tuple(jobs), previous, now=r * seconds, round_index=r)
        started = time.perf_counter()
        allocation = policy.solve(policy_input)
        times.append(time.perf_counter() - started)
        jobs, previous = advance(jobs, allocation, seconds), allocation
    return times


def row(name: str, label: str, jobs: int, times: list[float]) -> str:
    ordered = sorted(times)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return (
        f"| {name:6} | {label:24} | {jobs:5d} | {len(times):6d} | "
        f"{statistics.median(times) * 1e3:9.1f} | {p95 * 1e3:8.1f} |"
    )


def cases(name: str, quick: bool) -> list[tuple[str, ClusterView, list[float], int]]:
    cluster, speeds = paper_cluster()
    out = [("paper 64 GPUs", cluster, speeds, n) for n in (20, 40, 60)]
    if name == "pollux":
        out.append(("paper 64 GPUs", cluster, speeds, 64))
        sizes = [] if quick else [256]
    else:
        sizes = [256, 512] if quick else [256, 512, 1024, 2048]
    for gpus in sizes:
        big, big_speeds = scaled_cluster(gpus)
        label = f"{big.total_capacity} GPUs, 5 types"
        out.append((label, big, big_speeds, min(1500, int(0.75 * gpus))))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", default="sia,pollux,gavel")
    parser.add_argument("--quick", action="store_true", help="smaller clusters, fewer rounds")
    args = parser.parse_args()
    print("| policy | cluster                  |  jobs | rounds | median ms |   p95 ms |")
    print("|--------|--------------------------|-------|--------|-----------|----------|")
    for name in args.only.split(","):
        for label, cluster, speeds, count in cases(name, args.quick):
            rounds = args.rounds if name != "pollux" else max(3, args.rounds // 4)
            if args.quick:
                rounds = max(3, rounds // 4)
            jobs = make_jobs(cluster, speeds, count, seed=count)
            print(row(name, label, count, time_rounds(name, cluster, jobs, rounds)), flush=True)


if __name__ == "__main__":
    main()
