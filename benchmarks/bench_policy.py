"""Policy solve time per round (reference section 4, "Policy runtime"): a printed table.

Sia on the paper's 64-GPU cluster (6 x 4 T4, 3 x 8 RTX, 2 x 8 A100) with 20-60 active jobs and on
5-type clusters of 256-2048 GPUs with proportional job counts; then the Pollux GA and the Gavel
LP. Each round is a full ``policy.solve`` (estimator calls and matrix building included) on
synthetic estimators with realistic shapes (goodput concave in GPUs, slower across nodes, per-type
speed ratios 1-5x); jobs carry over their allocation, nodes, age and restart count from round to
round, so restart factors and growth caps are exercised. Goals: Sia median < 50 ms at 64 GPUs and
< 300 ms at 2048 GPUs; Pollux >= 10x faster than the original's ~20 s at 64 jobs on 64 GPUs.

``--scale`` (issue 16) times Sia's whole policy stage (goodput rows, program, solve, placement)
at 2,048 to 16,384 GPUs with 1,500 to 12,000 jobs, split by stage, with the solver's certified
gap to the LP bound (its objective over ``L(mu)``, a lower bound on the LP relaxation's optimum);
``--check`` also solves each round's whole program with HiGHS (up to 2,048 GPUs) and prints how far
the round's objective is from that exact optimum. Goals: p95 <= 1 s at 16,384 GPUs, gap to the
LP bound <= 0.5%, to the exact optimum <= 0.1%.

Usage: python benchmarks/bench_policy.py [--rounds N] [--only sia,pollux,gavel] [--quick]
       python benchmarks/bench_policy.py --scale [--sizes 2048,4096,16384] [--rounds N] [--check]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import logging
import re
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.estimators

import numpy as np
from blas import single_threaded

import sia_slurm.policy.sia as sia_policy
from sia_slurm.core import JobKind
from sia_slurm.policy import sia_milp
from sia_slurm.policy.base import Allocation, ClusterView, JobView, PolicyInput
from sia_slurm.policy.placement import Placement, place
from sia_slurm.policy.registry import make_policy
from tests.estimators import make_cluster, random_synthetic_estimator

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


def advance(
    jobs: list[JobView],
    allocation: Allocation,
    seconds: float,
    placement: Placement | None = None,
) -> list[JobView]:
    """Jobs one round later: running their new allocation (on its nodes, where placed), older,
    restarted if it changed."""
    advanced = []
    for job in jobs:
        share = allocation.get(job.job_id)
        config = share.config if share else None
        nodes = placement.assignments.get(job.job_id, ()) if placement else ()
        moved = config is not None and job.current is not None and config != job.current
        seen = max(job.max_gpus_seen, config.gpus if config else 0)
        advanced.append(
            dataclasses.replace(
                job,
                age=job.age + seconds,
                current=config if nodes or placement is None else None,
                placement=nodes,
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


def scale_jobs(gpus: int) -> int:
    """The issue's job counts: 1,500 jobs per 2,048 GPUs."""
    return gpus * 1500 // 2048


spent: Counter[str] = Counter()
clock: Callable[[], float] = time.perf_counter  # --clock cpu: time.process_time


def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its wall time added to ``spent[name]``."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = clock()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += clock() - started

    return wrapper


def exact_gap(holder: dict[str, Any], time_limit_s: float) -> float | None:
    """The round's objective over HiGHS's exact optimum of the same program, minus one."""
    program, chosen = holder.get("program"), holder.get("chosen")
    if program is None or chosen is None:
        return None
    exact = sia_milp.solve_exact(program, time_limit_s)
    if exact.status != "optimal" or exact.chosen is None:
        return None
    optimum = program.objective(exact.chosen)
    return (program.objective(chosen) - optimum) / max(abs(optimum), 1e-9)


def scale_rounds(gpus: int, rounds: int, check: bool) -> dict[str, Any]:
    """Sia's whole policy stage at ``gpus`` GPUs, round after round, split by stage."""
    cluster, speeds = scaled_cluster(gpus)
    jobs = make_jobs(cluster, speeds, scale_jobs(gpus), seed=scale_jobs(gpus))
    policy = make_policy("sia")
    holder: dict[str, Any] = {}
    solve = sia_policy.solve

    def keep(program: Any, *args: Any) -> Any:
        result = solve(program, *args)
        holder.update(program=program, chosen=result.chosen)
        return result

    sia_policy.build_columns = timed("rows", sia_policy.build_columns)
    sia_policy.assemble = timed("program", sia_policy.assemble)
    sia_policy.solve = timed("solve", keep)
    out: dict[str, Any] = {"total": [], "gap": [], "exact": [], "statuses": Counter()}
    out["unplaced"] = 0
    previous = None
    for r in range(rounds):
        spent.clear()
        policy_input = PolicyInput(cluster, tuple(jobs), previous, now=r * 60.0, round_index=r)
        started = clock()
        allocation = policy.solve(policy_input)
        placed = clock()
        placement = place(cluster, allocation, jobs)
        spent["place"] += clock() - placed
        out["total"].append(clock() - started)
        out["unplaced"] = max(out["unplaced"], len(placement.unplaced))
        for name in ("rows", "program", "solve", "place"):
            out.setdefault(name, []).append(spent[name])
        found = re.search(r"gap (-?[0-9.e+-]+)", allocation.info.message)
        out["gap"].append(float(found.group(1)) if found else float("nan"))
        out["statuses"][allocation.info.status] += 1
        if check:
            out["exact"].append(exact_gap(holder, 60.0))
        jobs, previous = advance(jobs, allocation, ROUND_SECONDS, placement), allocation
    sia_policy.build_columns = sia_policy.build_columns.__wrapped__  # type: ignore[attr-defined]
    sia_policy.assemble = sia_policy.assemble.__wrapped__  # type: ignore[attr-defined]
    sia_policy.solve = solve
    return out


def p95(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def print_scale(sizes: list[int], rounds: int, check: bool) -> None:
    print(
        "| GPUs | jobs | rounds | median ms | p95 ms | max ms | p95 rows / program / solve / "
        "place ms | worst gap to LP bound | worst gap to exact | statuses | unplaced |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for gpus in sizes:
        out = scale_rounds(gpus, rounds, check and gpus <= 2048)
        stages = " / ".join(
            f"{p95(out[n]) * 1e3:.0f}" for n in ("rows", "program", "solve", "place")
        )
        exact = [g for g in out["exact"] if g is not None]
        exact_text = f"{max(exact):.2e} ({len(exact)} rounds)" if exact else "-"
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(out["statuses"].items()))
        print(
            f"| {gpus} | {scale_jobs(gpus)} | {rounds} | "
            f"{statistics.median(out['total']) * 1e3:.0f} | {p95(out['total']) * 1e3:.0f} | "
            f"{max(out['total']) * 1e3:.0f} | {stages} | {np.nanmax(out['gap']):.2e} | "
            f"{exact_text} | {statuses} | {out['unplaced']} |",
            flush=True,
        )


def main() -> None:
    single_threaded()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--only", default="sia,pollux,gavel")
    parser.add_argument("--quick", action="store_true", help="smaller clusters, fewer rounds")
    parser.add_argument("--scale", action="store_true", help="Sia's whole stage, 2k-16k GPUs")
    parser.add_argument("--sizes", default="2048,4096,8192,16384")
    parser.add_argument("--check", action="store_true", help="compare with HiGHS's optimum")
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="cpu: this process's CPU time"
    )
    args = parser.parse_args()
    if args.scale:
        global clock
        clock = time.process_time if args.clock == "cpu" else time.perf_counter
        logging.getLogger("sia_slurm").setLevel(logging.ERROR)  # placement's per-job warnings
        print_scale([int(size) for size in args.sizes.split(",")], args.rounds, args.check)
        return
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
