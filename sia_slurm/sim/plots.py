"""Figures of simulation results (``sia-slurm simulate --plot``): JCT CDF and GPUs over time.

matplotlib is optional (the ``dev`` extra); it is imported only when a figure is drawn, and
:func:`require_matplotlib` lets the CLI refuse ``--plot`` up front with an install hint.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sia_slurm.sim.run import SimulationResult

HOUR = 3600.0


class PlotError(RuntimeError):
    """Plots were asked for but cannot be drawn (matplotlib missing)."""


def require_matplotlib() -> Any:
    """The ``matplotlib.pyplot`` module with a non-interactive backend, or :class:`PlotError`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotError(
            "--plot needs matplotlib: pip install matplotlib (or pip install -e '.[dev]')"
        ) from None
    return plt


def plot_jct_cdf(results: Sequence[SimulationResult], path: Path) -> Path:
    """One CDF of job completion times (hours, log scale) per workload, and the pooled one."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(7, 4.5))
    pooled: list[float] = []
    for result in results:
        jcts = sorted(
            (job.finish_time - job.submit_time) / HOUR
            for job in result.jobs
            if job.finish_time is not None
        )
        pooled += jcts
        if len(results) > 1:
            axes.step(jcts, _fractions(len(jcts)), where="post", alpha=0.35, linewidth=0.8)
    pooled.sort()
    axes.step(pooled, _fractions(len(pooled)), where="post", color="black", label="all jobs")
    axes.set_xscale("log")
    axes.set_xlabel("job completion time (hours)")
    axes.set_ylabel("fraction of jobs")
    policy = results[0].policy if results else ""
    axes.set_title(f"JCT CDF: {policy}, {len(results)} workload(s)")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def plot_gpus(result: SimulationResult, path: Path) -> Path:
    """GPUs held per GPU type over time (stacked), and the active jobs on a second axis."""
    plt = require_matplotlib()
    figure, axes = plt.subplots(figsize=(9, 4))
    times = [r.time / HOUR for r in result.rounds]
    types = list(result.rounds[0].gpus) if result.rounds else []
    stacks = [[r.gpus.get(t, 0) for r in result.rounds] for t in types]
    if times:
        axes.stackplot(times, stacks, labels=types, step="post", alpha=0.8)
        other = axes.twinx()
        other.step(times, [r.contention for r in result.rounds], where="post", color="black")
        other.set_ylabel("active jobs")
    axes.set_xlabel("time (hours)")
    axes.set_ylabel("GPUs held")
    axes.set_title(f"{result.workload}: GPUs per type under {result.policy} on {result.cluster}")
    axes.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path


def _fractions(count: int) -> list[float]:
    return [(i + 1) / count for i in range(count)]
