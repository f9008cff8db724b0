"""Gavel's hierarchical max-min fairness: water-filling against its first LP alone.

Run: ``python benchmarks/bench_gavel_fill.py [--repeats 5] [--simulate WORKLOAD.csv]``.

Speed table: per cluster load (jobs of 1-8 GPUs on the 64-GPU cluster's three types,
:func:`gavel_instance`, three seeds each), the water-filling's rounds and LPs, and the median
milliseconds of ``solve_lp(..., "max_min_fairness")`` with ``water_filling`` on and off
(medians over ``--repeats`` runs; the same machine, so compare within a row). Gavel decides
every 360 s, so either is far inside a round; the table says what the re-solves cost.

``--simulate``: the workload on hetero64 under Gavel's ``max_min_fairness`` (workers ``any``,
as the simulator runs Gavel), once with each setting: average and p99 JCT, makespan, GPU-hours
per job, the policy's mean milliseconds per round and the wall time (after an unprinted
warm-up run).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests.estimators

from sia_slurm.policy.gavel_fill import water_fill
from sia_slurm.policy.gavel_lp import fill_program, solve_lp
from sia_slurm.policy.parameters import GavelPolicyConfig
from sia_slurm.sim.inputs import load_inputs
from sia_slurm.sim.run import SimulationConfig, simulate
from sia_slurm.sim.workload import load_workload
from tests.estimators import gavel_instance

REPO = Path(__file__).resolve().parents[1]

SIZES = (20, 60, 120)
SEEDS = (0, 1, 2)


def median_ms(instance: tuple, water_filling: bool, repeats: int) -> float:
    """Median milliseconds of ``solve_lp`` on ``instance`` over ``repeats`` runs."""
    throughput, gpus, capacity, weights = instance
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        solve_lp(throughput, gpus, capacity, "max_min_fairness", weights, water_filling)
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def simulate_both(workload_path: str) -> None:
    """The workload under Gavel's max-min fairness, water-filled and first LP alone."""
    inputs = load_inputs(REPO / "etc" / "clusters" / "hetero64.yaml")
    workload = load_workload(workload_path)
    # warm-up: the first run in a process pays seconds of one-off loading (traces, models),
    # counted as policy time; a whole unprinted run takes it (a run of one job per app did not)
    warm = GavelPolicyConfig(objective="max_min_fairness", workers="any")
    simulate(workload, inputs, SimulationConfig("gavel", params=warm))
    print(
        f"{'water_filling':>13} {'avg JCT h':>9} {'p99 JCT h':>9} {'makespan h':>10} "
        f"{'GPU-h/job':>9} {'policy ms':>9} {'wall s':>6}"
    )
    for water_filling in (False, True):
        params = GavelPolicyConfig(
            objective="max_min_fairness", workers="any", water_filling=water_filling
        )
        start = time.perf_counter()
        result = simulate(workload, inputs, SimulationConfig(policy="gavel", params=params))
        wall = time.perf_counter() - start
        metrics = result.metrics()
        policy_ms = statistics.mean(result.solve_ms) if result.solve_ms else 0.0
        print(
            f"{water_filling!s:>13} {metrics.avg_jct_h:>9.3f} {metrics.p99_jct_h:>9.2f} "
            f"{metrics.makespan_h:>10.2f} {metrics.gpu_hours_per_job:>9.2f} "
            f"{policy_ms:>9.1f} {wall:>6.1f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--simulate", metavar="WORKLOAD", help="also simulate this workload")
    args = parser.parse_args()
    print(
        f"{'jobs':>5} {'seed':>4} {'rounds':>6} {'LPs':>4} {'water-fill ms':>13} "
        f"{'first LP ms':>11} {'ratio':>6}"
    )
    for n_jobs in SIZES:
        for seed in SEEDS:
            instance = gavel_instance(seed, n_jobs)
            throughput, gpus, capacity, weights = instance
            runnable = (throughput > 0).any(axis=1)
            filled = water_fill(fill_program(throughput, gpus, capacity), weights, runnable)
            assert filled is not None
            fill = median_ms(instance, True, args.repeats)
            first = median_ms(instance, False, args.repeats)
            print(
                f"{n_jobs:>5} {seed:>4} {filled.rounds:>6} {filled.solves:>4} {fill:>13.1f} "
                f"{first:>11.1f} {fill / first:>6.1f}"
            )

    if args.simulate:
        simulate_both(args.simulate)


if __name__ == "__main__":
    main()
