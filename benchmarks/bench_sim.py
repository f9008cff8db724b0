"""Speed of the simulator: one 160-job Helios workload under Sia on hetero64, with a breakdown.

Run: ``python benchmarks/bench_sim.py [--workload PATH] [--policy sia]``. Goal (issue 5): under
30 s of wall time on a 2-core machine for ``data/workloads/saturn/workload-1.csv``.

``--scale 32`` (issue 16) runs the paper's cluster and workload scaled up together
(``benchmarks/scaled_workload.py``: 2,048 GPUs, 32 Helios workloads merged, 5,120 jobs, ~900
rounds; ``--trace philly`` for Philly). Goal: under 3 minutes, the policy stage (goodput rows,
program, solve, placement) p95 <= 300 ms per round. The per-round policy stage is also given in
CPU time of this process (``SiaPolicy.solve`` plus placement), which a busy machine inflates
less than the wall time.

Prints the wall time and where it went, per round stage of the driver (snapshot, controller
round, apply, job stepping) and, inside the controller, its observe stage (admitting jobs and
ingesting metrics reports), the goodput model (fitting throughput models, evaluating goodput
rows), the MILP solve and placement. The model and solver figures come from timing wrappers
installed by this script only; they add a few microseconds per call.
"""

from __future__ import annotations

import argparse
import csv
import functools
import logging
import os
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blas import single_threaded
from scaled_workload import scaled_cluster_text, scaled_rows

import sia_slurm.controller.decide as controller_round
import sia_slurm.policy.sia as sia_policy
from sia_slurm.model.estimator import JobGoodputEstimator
from sia_slurm.sim.inputs import load_inputs, load_sim_workloads
from sia_slurm.sim.run import SimulationConfig, simulate

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "data" / "workloads" / "saturn" / "workload-1.csv"
CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
GOAL_S = 30.0
SCALED_GOAL_S = 180.0

spent: Counter[str] = Counter()
calls: Counter[str] = Counter()


def timed(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its wall time added to ``spent[name]``."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - started
            calls[name] += 1

    return wrapper


def instrument() -> None:
    """Wrap the model fit, the Sia goodput matrix and the MILP solve with timers."""
    JobGoodputEstimator._fit = timed("fit", JobGoodputEstimator._fit)  # type: ignore[method-assign]
    sia_policy.build_columns = timed("columns", sia_policy.build_columns)
    sia_policy.solve = timed("milp", sia_policy.solve)


stage_cpu: list[float] = []


def cpu_timed(function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` with its CPU time appended to ``stage_cpu`` (one entry per call)."""

    @functools.wraps(function)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            stage_cpu.append(time.process_time() - started)

    return wrapper


def scaled_inputs(scale: int, trace: str, folder: Path) -> tuple[Path, Path]:
    """Write the ``scale``-times cluster and workload into ``folder``; their paths."""
    cluster = folder / "cluster.yaml"
    cluster.write_text(scaled_cluster_text(scale, CLUSTER))
    rows = scaled_rows(trace, scale)
    workload = folder / f"{trace}-x{scale}.csv"
    with workload.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return cluster, workload


def main() -> None:
    single_threaded()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--policy", default="sia")
    parser.add_argument("--scale", type=int, default=0, help="cluster and jobs x N (issue 16)")
    parser.add_argument("--trace", default="saturn", choices=("saturn", "philly"))
    args = parser.parse_args()
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    instrument()
    cluster_path = CLUSTER
    if args.scale:
        folder = Path(tempfile.mkdtemp(prefix="bench-sim-"))
        cluster_path, args.workload = scaled_inputs(args.scale, args.trace, folder)
    sia_policy.SiaPolicy.solve = cpu_timed(sia_policy.SiaPolicy.solve)  # type: ignore[method-assign]
    controller_round.place = cpu_timed(controller_round.place)
    inputs = load_inputs(cluster_path)
    (workload,) = load_sim_workloads(args.workload, inputs)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = simulate(workload, inputs, SimulationConfig(policy=args.policy))
    wall = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    metrics = result.metrics()
    t = result.timings
    policy = t["controller.policy_s"]
    rows = [
        ("snapshot (simulated cluster)", t["snapshot_s"], ""),
        ("controller round", t["controller_s"], ""),
        ("  observe: admit jobs, ingest reports", t["controller.observe_s"], ""),
        ("  policy", policy, ""),
    ]
    if calls["columns"]:
        columns = spent["columns"]
        rows += [
            ("    goodput matrix", columns, f"{calls['columns']} rounds"),
            ("      model fitting", spent["fit"], f"{calls['fit']} fits"),
            ("      goodput evaluation, rest", columns - spent["fit"], ""),
            ("    MILP solve (HiGHS)", spent["milp"], f"{calls['milp']} solves"),
            ("    rest (assembly, release)", policy - columns - spent["milp"], ""),
        ]
    elif calls["fit"]:
        rows.append(("    model fitting", spent["fit"], f"{calls['fit']} fits"))
    rows += [
        ("  placement", t["controller.place_s"], ""),
        (
            "  diff into actions",
            t["controller_s"] - t["controller.observe_s"] - policy - t["controller.place_s"],
            "",
        ),
        ("apply actions", t["apply_s"], ""),
        ("idle waits, unplaced allocations", t["waits_s"], ""),
        ("job stepping (advance)", t["advance_s"], ""),
        ("round log", t["log_s"], ""),
    ]
    accounted = sum(
        t[k] for k in ("snapshot_s", "controller_s", "apply_s", "waits_s", "advance_s", "log_s")
    )
    rows.append(("setup (traces, profiles) and rest", wall - accounted, ""))
    ms = result.solve_ms
    print(
        f"bench_sim: {workload.path}, {len(workload)} jobs, {args.policy} on "
        f"{inputs.cluster.name}, {len(result.rounds)} rounds"
    )
    print(f"{'stage':40} {'seconds':>8} {'share':>6}  note")
    for name, seconds, note in rows:
        print(f"{name:40} {seconds:8.2f} {seconds / wall:6.1%}  {note}")
    print(f"{'total wall':40} {wall:8.2f}")
    # On a shared machine the wall time includes waiting for a core; the CPU time does not.
    print(f"{'total CPU time of this process':40} {cpu:8.2f}")
    print(
        f"policy stage per round: median {statistics.median(ms):.1f} ms, "
        f"p95 {sorted(ms)[int(0.95 * len(ms))]:.1f} ms"
    )
    if args.policy == "sia" and stage_cpu and len(stage_cpu) % 2 == 0:
        per_round = sorted(a + b for a, b in zip(stage_cpu[::2], stage_cpu[1::2], strict=True))
        print(
            f"policy stage + placement per round, CPU: median "
            f"{statistics.median(per_round) * 1e3:.1f} ms, "
            f"p95 {per_round[int(0.95 * len(per_round))] * 1e3:.1f} ms, "
            f"max {per_round[-1] * 1e3:.1f} ms"
        )
    print(
        f"result: avg JCT {metrics.avg_jct_h:.4f} h, p99 JCT {metrics.p99_jct_h:.2f} h, "
        f"makespan {metrics.makespan_h:.2f} h, "
        f"{metrics.gpu_hours_per_job:.2f} GPU-h/job, {metrics.restarts_per_job:.2f} restarts/job"
    )
    waits = result.wait_totals()
    job_rounds = max(metrics.active_job_rounds, 1)
    print(
        f"waits (issue 38): {waits.job_rounds} job-rounds waiting beside free GPUs, "
        f"{waits.unplaced_allocations} allocations unplaced "
        f"({waits.unplaced_allocations / job_rounds:.3%} of {metrics.active_job_rounds} job-rounds)"
    )
    goal = SCALED_GOAL_S if args.scale else GOAL_S
    verdict = "OK" if wall < goal else "OVER"
    print(f"goal: < {goal:.0f} s wall -> {wall:.1f} s ({verdict}); load {os.getloadavg()}")


if __name__ == "__main__":
    main()
