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

    ``goodput_measured`` and ``goodput_predicted`` (samples per second, M0-equivalent: raw
    samples/s times the statistical efficiency at the batch relative to the job's M0, 1 on
    both for a spec without an M0) are a pair that means the same thing (issue 34), so that
    they can be compared:

    * both are of the *shape the job's newest metrics report measured* (GPU type, nodes,
      GPUs, per-GPU batch and accumulation), which may differ from ``gpu_type``/``gpus``/
      ``batch_size`` (the last decision's, e.g. a rebatch decided after that report, which a
      job that finished first never ran);
    * both use *the report's gradient statistics* for the efficiency: measured is the report's
      throughput (global batch / time of an optimizer step) times it; predicted is the
      throughput the controller predicted for that shape, in the newest decision that assigned
      exactly it, times it. The efficiency is measured by the job, not predicted, and moves as
      it trains; the decision's own goodput carries its round's (a minutes-long demo job goes
      through its app's whole training, ncf from 0.37 to 0.999 at its batch).

    So their ratio is the throughput model's error on what the job ran. ``goodput_predicted``
    is ``None`` when no decision assigned the reported shape; without a report it is the
    goodput of the last decision that gave the job GPUs (nothing measured to set it against)
    and ``goodput_measured`` is ``None``. A database written before decisions kept their
    throughput gives the matching decision's own goodput (its round's statistics). A
    simulation has no measured goodput; its predicted one is the simulator's own.
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
    # Whose job it is, as Slurm says ('' where not known: a simulation, a database of before
    # schema 3 until the job's next snapshot); the site filters and sums GPU-hours by them.
    user: str = ""
    account: str = ""


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
