"""The dashboard's input: one neutral document, whatever produced it.

The controller's state database and a simulation's output directory both become a
:class:`ReportData`; the static site (``site/``) only ever reads this shape, as
``window.SIA_REPORT`` in ``data.js``. Times are seconds since the first submission.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class Segment:
    """A stretch of time a job held ``gpus`` GPUs of ``gpu_type`` (restoring included)."""

    start: float
    end: float
    gpu_type: str
    gpus: int


@dataclass(frozen=True)
class JobRow:
    """One job in the job table and the timeline; ``jct_s`` is ``None`` until it finishes.

    ``accounted_gpu_hours`` is what Slurm accounting (``sacct``) charged the job over all its
    Slurm runs, joined by the job's comment (0.0 for a job sacct has no run of yet). It is
    ``None`` wherever there is no accounting to ask: a simulation, a cluster without slurmdbd,
    a report read from ``--db`` or ``--offline``, and data files written before the field
    existed. The site then leaves the column out altogether rather than show a column of
    dashes: "no accounting" is a property of the whole report, not of a job, and the
    summary's absent ``GPU-h (sacct)`` entry already says it.

    ``note`` says why a job is in its state, where that is not plain: for a job quarantined in
    the last recorded round (``state == "quarantined"``) the controller's reason,
    ``<stage>: <why>``. Empty otherwise; the site adds its column only when some job has one.
    """

    id: str
    app: str
    state: str
    submit_time: float
    gpu_type: str = ""
    gpus: int = 0
    batch_size: int = 0
    goodput_predicted: float | None = None
    goodput_measured: float | None = None
    restarts: int = 0
    finish_time: float | None = None
    jct_s: float | None = None
    segments: tuple[Segment, ...] = ()
    accounted_gpu_hours: float | None = None
    note: str = ""
    # Seconds the job spent profiling its model (docs/profiling.md); None: it never did
    profiling_s: float | None = None


@dataclass(frozen=True)
class RoundPoint:
    """The cluster in one round: GPUs allocated and usable per type, solve time, queue."""

    index: int
    time: float
    allocated: Mapping[str, int]
    usable: Mapping[str, int] = field(default_factory=dict)
    solve_ms: float | None = None
    running: int = 0
    pending: int = 0


@dataclass(frozen=True)
class GpuTypeTotal:
    name: str
    total: int


@dataclass(frozen=True)
class ReportData:
    """Everything the dashboard shows."""

    title: str
    subtitle: str
    gpu_types: tuple[GpuTypeTotal, ...]
    rounds: tuple[RoundPoint, ...]
    jobs: tuple[JobRow, ...]
    summary: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        """A JSON-safe dict (non-finite numbers become ``null``)."""
        payload = asdict(self)
        payload["summary"] = [{"label": k, "value": v} for k, v in self.summary]
        return _finite(payload)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value
