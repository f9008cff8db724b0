"""What the dashboard's two sources share: their error, configuration strings, the summary.

The controller's state database (:mod:`sia_slurm.report.from_db`) and a simulation's output
(:mod:`sia_slurm.report.from_sim`) both become a :class:`~sia_slurm.report.report_data.ReportData`;
they name a configuration the same way (a :class:`~sia_slurm.core.Configuration`'s ``str``),
refuse what they cannot read with the same error, and summarise the same rows the same way.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.report.report_data import JobRow, RoundPoint

NO_CONFIG = "-"


class ReportSourceError(ValueError):
    """A report source (database, simulation output) cannot be read; names file and field."""


def parse_config(text: str) -> tuple[str, int, int] | None:
    """``"a100:1x4"`` -> ``("a100", 1, 4)`` (a :class:`~sia_slurm.core.Configuration`'s str);
    ``"-"`` -> ``None``."""
    if text == NO_CONFIG:
        return None
    gpu_type, sep, shape = text.rpartition(":")
    nodes, x, gpus = shape.partition("x")
    if not sep or not x or not nodes.isdigit() or not gpus.isdigit():
        raise ReportSourceError(f"configuration: expected TYPE:NODESxGPUS or '-', got {text!r}")
    return gpu_type, int(nodes), int(gpus)


def summary_pairs(
    jobs: Sequence[JobRow], rounds: Sequence[RoundPoint], extra: Mapping[str, str] | None = None
) -> tuple[tuple[str, str], ...]:
    """Jobs done, average and p99 JCT, makespan, restarts per job, the GPU-hours Slurm
    accounting charged (when known), jobs quarantined (when any), median solve time."""
    jcts = sorted(j.jct_s for j in jobs if j.jct_s is not None)
    done = [j for j in jobs if j.jct_s is not None and j.finish_time is not None]
    pairs: list[tuple[str, str]] = [("jobs", f"{len(done)}/{len(jobs)} done")]
    if jcts:
        pairs.append(("avg JCT", _duration(statistics.fmean(jcts))))
        pairs.append(("p99 JCT", _duration(jcts[int(0.99 * len(jcts))])))
        start = min(j.submit_time for j in done)
        finish = max(j.finish_time for j in done if j.finish_time is not None)
        pairs.append(("makespan", _duration(finish - start)))
    if jobs:
        pairs.append(("restarts/job", f"{sum(j.restarts for j in jobs) / len(jobs):.2f}"))
    accounted = [j.accounted_gpu_hours for j in jobs if j.accounted_gpu_hours is not None]
    if accounted:  # Slurm accounting's charge, all runs of all jobs (absent without it)
        pairs.append(("GPU-h (sacct)", f"{sum(accounted):.3f}"))
    quarantined = sum(j.state == QUARANTINED for j in jobs)
    if quarantined:  # not scheduled this round; the job table's note says why
        pairs.append(("quarantined", str(quarantined)))
    solve = sorted(r.solve_ms for r in rounds if r.solve_ms is not None)
    if solve:
        pairs.append(("rounds", str(len(rounds))))
        pairs.append(("median solve", f"{solve[len(solve) // 2]:.1f} ms"))
    pairs += list((extra or {}).items())
    return tuple(pairs)


def _duration(seconds: float) -> str:
    if not math.isfinite(seconds):
        return "-"
    if seconds >= 3600:
        return f"{seconds / 3600:.2f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.0f} s"
