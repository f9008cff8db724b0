"""Simulating many workloads at once, one worker process per workload.

Workloads are independent, so they run in a :class:`~concurrent.futures.ProcessPoolExecutor`.
A :class:`WorkloadTask` carries everything a worker needs (paths and the parsed workload) and
is picklable; each worker reloads the cluster and profiles (cheap) and writes its own round log.
With one process the tasks run in the calling process, which keeps tests and small runs simple.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.sim.artifact_metrics import PooledMetrics, pooled_metrics
from sia_slurm.sim.inputs import load_inputs
from sia_slurm.sim.run import SimulationConfig, SimulationResult, simulate
from sia_slurm.sim.workload import Workload


@dataclass(frozen=True)
class WorkloadTask:
    """One workload to simulate under one configuration."""

    label: str  # unique among the tasks of a run; used in file names
    workload: Workload
    cluster: Path
    config: SimulationConfig
    log_path: Path | None = None  # round log (JSON lines); None: not written
    profiles: Path | None = None
    traces: Path | None = None
    verbose: bool = False  # let the controller's warnings through


def workload_labels(workloads: Sequence[Workload]) -> list[str]:
    """A file-name-safe label per workload: its name, or ``folder_name`` where names repeat."""
    names = [w.name for w in workloads]
    labels = []
    for w in workloads:
        label = w.name if names.count(w.name) == 1 else f"{w.path.parent.name}_{w.name}"
        labels.append(re.sub(r"[^A-Za-z0-9_.\-]", "_", label))
    seen: dict[str, int] = {}
    unique = []
    for label in labels:
        seen[label] = seen.get(label, 0) + 1
        unique.append(label if seen[label] == 1 else f"{label}_{seen[label]}")
    return unique


def run_task(task: WorkloadTask) -> SimulationResult:
    """Simulate one workload (in a worker process or in this one)."""
    package_logger = logging.getLogger("sia_slurm")
    level = package_logger.level
    if not task.verbose:
        # The controller logs a warning per unplaceable job per round; a congested workload
        # would print thousands. The round log records what happened instead.
        package_logger.setLevel(logging.ERROR)
    try:
        inputs = load_inputs(task.cluster, profiles_dir=task.profiles, traces_dir=task.traces)
        if task.log_path is None:
            return simulate(task.workload, inputs, task.config)
        with open(task.log_path, "w", encoding="utf-8") as log:
            return simulate(task.workload, inputs, task.config, log=log)
    finally:
        package_logger.setLevel(level)


def run_tasks(
    tasks: Sequence[WorkloadTask],
    processes: int | None = None,
    on_done: Callable[[WorkloadTask, SimulationResult], None] | None = None,
) -> dict[str, SimulationResult]:
    """Run every task, ``processes`` at a time (default: the number of cores); results by label.

    ``on_done`` is called in this process as each task completes (in completion order).
    """
    workers = max(1, min(processes or os.cpu_count() or 1, len(tasks)))
    results: dict[str, SimulationResult] = {}

    def finish(task: WorkloadTask, result: SimulationResult) -> None:
        results[task.label] = result
        if on_done is not None:
            on_done(task, result)

    if workers == 1:
        for task in tasks:
            finish(task, run_task(task))
        return results
    with ProcessPoolExecutor(max_workers=workers, initializer=_silence_stdout) as pool:
        futures = {pool.submit(run_task, task): task for task in tasks}
        for future in as_completed(futures):
            finish(futures[future], future.result())
    return results


def _silence_stdout() -> None:
    """Worker processes print nothing themselves; HiGHS (C code under scipy's ``milp``) writes
    stray debug lines straight to file descriptor 1, which would break the progress lines."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def pool_results(results: Sequence[SimulationResult]) -> PooledMetrics:
    """Metrics pooled over several workloads' results (:func:`~.metrics.pooled_metrics`)."""
    return pooled_metrics(
        [result.metrics() for result in results],
        [result.jobs for result in results],
        [result.solve_ms for result in results],
    )
