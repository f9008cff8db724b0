"""Speed of Gavel's hierarchical max-min fairness: water-filling against its first LP alone.

Run: ``python benchmarks/bench_gavel_fill.py [--repeats 5]``. Prints one table: per cluster
load (jobs of 1-8 GPUs on the 64-GPU cluster's three types, :func:`gavel_instance`, three
seeds each), the water-filling's rounds and LPs, and the median milliseconds of
``solve_lp(..., "max_min_fairness")`` with ``water_filling`` on and off (medians over
``--repeats`` runs; the same machine, so compare within a row). Gavel decides every 360 s, so
either is far inside a round; the table says what the re-solves cost.
"""

from __future__ import annotations

import argparse
import statistics
import time

from sia_slurm.policy.gavel_fill import water_fill
from sia_slurm.policy.gavel_lp import fill_program, solve_lp
from sia_slurm.policy.testing import gavel_instance

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
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


if __name__ == "__main__":
    main()
