"""Speed of the simulator: one 160-job Helios workload under Sia on hetero64, with a breakdown.

Run: ``python benchmarks/bench_sim.py [--workload PATH] [--policy sia]``. Goal (issue 5): under
30 s of wall time on a 2-core machine for ``data/workloads/saturn/workload-1.csv``.

Prints the wall time and where it went, per round stage of the driver (snapshot, controller
round, apply, job stepping) and, inside the controller, its observe stage (admitting jobs and
ingesting metrics reports), the goodput model (fitting throughput models, evaluating goodput
rows), the MILP solve and placement. The model and solver figures come from timing wrappers
installed by this script only; they add a few microseconds per call.
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blas import single_threaded

import sia_slurm.policy.sia as sia_policy
from sia_slurm.model.estimator import JobGoodputEstimator
from sia_slurm.sim.inputs import load_inputs, load_sim_workloads
from sia_slurm.sim.run import SimulationConfig, simulate

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "data" / "workloads" / "saturn" / "workload-1.csv"
CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
GOAL_S = 30.0

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


def main() -> None:
    single_threaded()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", type=Path, default=WORKLOAD)
    parser.add_argument("--policy", default="sia")
    args = parser.parse_args()
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    instrument()
    inputs = load_inputs(CLUSTER)
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
        ("job stepping (advance)", t["advance_s"], ""),
        ("round log", t["log_s"], ""),
    ]
    accounted = sum(t[k] for k in ("snapshot_s", "controller_s", "apply_s", "advance_s", "log_s"))
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
    print(
        f"result: avg JCT {metrics.avg_jct_h:.2f} h, makespan {metrics.makespan_h:.1f} h, "
        f"{metrics.gpu_hours_per_job:.2f} GPU-h/job, {metrics.restarts_per_job:.2f} restarts/job"
    )
    verdict = "OK" if wall < GOAL_S else "OVER"
    print(f"goal: < {GOAL_S:.0f} s wall -> {wall:.1f} s ({verdict})")


if __name__ == "__main__":
    main()
