"""Speed of the goodput model: row evaluation with batch-size optimisation, and fitting.

Run: ``python benchmarks/bench_model.py``. Prints two tables. Goals (issue 3): evaluating 1000
jobs x 20 configurations with batch-size optimisation in < 50 ms, and a median fit of a 30-point
profile in < 20 ms, on a 2-core machine.

"cold" rows rebuild each job's candidate/throughput grid (first round, or the round after a job's
model was refitted); "warm" rows are later rounds where only the gradient statistics changed,
which is the common case: a job's grid is cached until one of its types is refitted. "per job"
calls ``JobGoodputEstimator.evaluate`` once per job (the GoodputEstimator protocol); "batched"
calls ``evaluate_jobs`` once for all jobs (one numpy pass over jobs x configurations x candidates).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from sia_slurm.core import Configuration
from sia_slurm.model.efficiency import GradientStats
from sia_slurm.model.estimator import JobGoodputEstimator, evaluate_jobs
from sia_slurm.model.fit import Observation, fit_observations
from sia_slurm.protocol.profile import load_profiles, read_trace_points

REPO = Path(__file__).resolve().parents[1]
NUM_JOBS = 1000
REPEATS = 5
FIT_POINTS = 30
FIT_DRAWS = 10  # random 30-point profiles per placements file


def sia_configurations() -> list[Configuration]:
    """Sia's configuration set for the paper's 64-GPU cluster plus one Quadro: 20 columns."""
    shapes = {"t4": (6, 4), "rtx": (3, 8), "dgx": (2, 8)}
    configs = []
    for gpu_type, (nodes, per_node) in shapes.items():
        count = 1
        while count <= per_node:
            configs.append(Configuration(gpu_type, 1, count))
            count *= 2
        configs += [Configuration(gpu_type, k, k * per_node) for k in range(2, nodes + 1)]
    configs.append(Configuration("quad", 1, 1))
    return configs


def make_jobs(rng: np.random.Generator) -> list[JobGoodputEstimator]:
    """Jobs of the six apps; every other one has run on 4 RTX GPUs (so projection is used)."""
    apps = list(load_profiles(REPO / "profiles").apps.values())
    jobs = []
    for i in range(NUM_JOBS):
        app = apps[i % len(apps)]
        stats = GradientStats(1.0, float(rng.uniform(0.0, 50.0)))
        job = JobGoodputEstimator.from_profile(app, grad_stats=stats)
        if i % 2:
            seed = app.seed["rtx"][-1]
            job.observe(
                "rtx",
                Observation(1, 4, seed.local_bsz, seed.step_time * 1.3, seed.step_time * 0.3),
            )
        jobs.append(job)
    return jobs


def per_job(jobs: list[JobGoodputEstimator], configs: list[Configuration]) -> None:
    for job in jobs:
        job.evaluate(configs)


def batched(jobs: list[JobGoodputEstimator], configs: list[Configuration]) -> None:
    evaluate_jobs(jobs, configs)


def time_rounds(
    evaluate: Callable[[list[JobGoodputEstimator], list[Configuration]], None],
    jobs: list[JobGoodputEstimator],
    configs: list[Configuration],
    rng: np.random.Generator,
) -> tuple[list[float], list[float]]:
    cold, warm = [], []
    for _ in range(REPEATS):
        for job in jobs:
            job._plans.clear()  # benchmark only: force the grid to be rebuilt
        start = time.perf_counter()
        evaluate(jobs, configs)
        cold.append(time.perf_counter() - start)
        for job in jobs:
            job.update_grad_stats(GradientStats(1.0, float(rng.uniform(0.0, 50.0))))
        start = time.perf_counter()
        evaluate(jobs, configs)
        warm.append(time.perf_counter() - start)
    return cold, warm


def time_fits(rng: np.random.Generator) -> list[float]:
    times = []
    for path in sorted((REPO / "data" / "traces").glob("*/placements-*.csv")):
        points = read_trace_points(path)
        for _ in range(FIT_DRAWS):
            chosen = rng.choice(len(points), size=min(FIT_POINTS, len(points)), replace=False)
            sample = [points[i] for i in chosen]
            start = time.perf_counter()
            fit_observations(sample)
            times.append(time.perf_counter() - start)
    return times


def main() -> None:
    rng = np.random.default_rng(0)
    configs = sia_configurations()
    jobs = make_jobs(rng)
    start = time.perf_counter()
    for job in jobs:
        job.evaluate(configs)  # fits every type once (memoised across jobs of one app)
    first = time.perf_counter() - start
    results = {
        name: time_rounds(fn, jobs, configs, rng)
        for name, fn in [("per job", per_job), ("batched", batched)]
    }

    print(f"Goodput rows: {NUM_JOBS} jobs x {len(configs)} configurations, 50 batch candidates")
    print(f"{'case':<58} {'median ms':>10} {'min ms':>8} {'us/job':>8}")
    for mode, (cold, warm) in results.items():
        for name, samples in [
            ("warm (grad stats changed, models unchanged)", warm),
            ("cold (grids rebuilt, models already fitted)", cold),
        ]:
            median = statistics.median(samples)
            label = f"{mode}, {name}"
            print(
                f"{label:<58} {median * 1e3:>10.1f} {min(samples) * 1e3:>8.1f} "
                f"{median / NUM_JOBS * 1e6:>8.1f}"
            )
    print(f"{'per job, first round (fits + grids, new jobs)':<58} {first * 1e3:>10.1f}")

    fits = time_fits(rng)
    fits_ms = sorted(t * 1e3 for t in fits)
    print(f"\nFit time: {len(fits)} random {FIT_POINTS}-point profiles from the placements files")
    print(f"{'median ms':>10} {'p95 ms':>8} {'max ms':>8}")
    print(
        f"{statistics.median(fits_ms):>10.2f} {fits_ms[int(0.95 * len(fits_ms))]:>8.2f} "
        f"{fits_ms[-1]:>8.2f}"
    )


if __name__ == "__main__":
    main()
