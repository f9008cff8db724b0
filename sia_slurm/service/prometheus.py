"""The Prometheus textfile (``<state_dir>/metrics/sia.prom``), rewritten after every round.

Why a textfile: the controller may be a new process per round (cron), so it cannot serve
``/metrics`` itself; node_exporter's textfile collector (``--collector.textfile.directory``)
picks the file up. It is written to a temporary name and renamed, so the collector never reads a
half-written file. Counters (actions by kind and result) come from the journal, so they keep
counting across processes.

Metric and label names are the code's own (checked against the format's grammar on output); no
user string becomes one. Label values come from the configuration and the code (GPU types,
phases, action kinds), but are escaped all the same: newline, backslash and double quote as the
format says, and every other control character made visible (``\\x1b``), so the file stays one
sample per line and ``cat`` prints no escape sequence.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sia_slurm.cluster import JobPhase
from sia_slurm.controller.idle_waits import WaitCause
from sia_slurm.text import printable

PROM_FILE = "sia.prom"
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_METRIC_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass
class Metric:
    """One metric family: name, help text, type and samples."""

    name: str
    help: str
    kind: str  # "gauge" or "counter"
    samples: list[Sample] = field(default_factory=list)

    def add(self, value: float, **labels: str) -> Metric:
        self.samples.append(Sample(labels, float(value)))
        return self


@dataclass(frozen=True)
class RoundMetrics:
    """What one round contributes to the file (everything :func:`render` needs)."""

    round_index: int
    round_time: float  # the round's wall-clock end, seconds since the epoch
    dry_run: bool
    timings: Mapping[str, float]  # seconds per stage (snapshot_s, policy_s, apply_s, ...)
    solve_seconds: float
    solve_status: str
    jobs_by_phase: Mapping[str, int]
    gpus: Mapping[str, Mapping[str, int]]  # type -> total/usable/allocated/in_use
    actions_this_round: Mapping[tuple[str, str], int]  # (kind, result) -> count
    actions_total: Mapping[tuple[str, str], int]  # (kind, state) -> count, from the journal
    pending_actions: int
    rejected: int
    # Allocations placement could not honour: left unplaced, or placed at one of the policy's
    # fallbacks (Sia's repair_placement; docs/concepts/policies.md).
    unplaced: int = 0
    placed_at_fallback: int = 0
    # Jobs the round left without GPUs while a type they may use had free GPUs where their
    # smallest run fits, by where the round left them out (sia_slurm/controller/idle_waits.py).
    waiting_beside_free: Mapping[str, int] = field(default_factory=dict)


def metrics_of(m: RoundMetrics) -> list[Metric]:
    """The metric families of one round."""
    stage = Metric(
        "sia_round_stage_seconds", "Seconds spent in each stage of the last round.", "gauge"
    )
    for name, seconds in sorted(m.timings.items()):
        stage.add(seconds, stage=name.removesuffix("_s"))
    phases = Metric("sia_jobs", "Managed jobs by phase in the last snapshot.", "gauge")
    for phase in JobPhase:
        phases.add(m.jobs_by_phase.get(phase.value, 0), phase=phase.value)
    gpus = Metric(
        "sia_gpus", "GPUs per type: total, usable, allocated by the last round, in use.", "gauge"
    )
    for gpu_type, counts in sorted(m.gpus.items()):
        for what in ("total", "usable", "allocated", "in_use"):
            gpus.add(counts.get(what, 0), gpu_type=gpu_type, state=what)
    this_round = Metric(
        "sia_round_actions", "Actions of the last round by kind and result.", "gauge"
    )
    for (kind, result), count in sorted(m.actions_this_round.items()):
        this_round.add(count, kind=kind, result=result)
    waiting = Metric(
        "sia_jobs_waiting_beside_free_gpus",
        "Jobs the last round left without GPUs while a GPU type they may use had free GPUs "
        "where their smallest run fits, by where the round left them out.",
        "gauge",
    )
    for cause in WaitCause:
        waiting.add(m.waiting_beside_free.get(cause.value, 0), cause=cause.value)
    total = Metric(
        "sia_actions_total", "Actions journaled since the database was created.", "counter"
    )
    for (kind, state), count in sorted(m.actions_total.items()):
        total.add(count, kind=kind, result=state)
    return [
        Metric("sia_round_index", "Index of the last completed round.", "gauge").add(m.round_index),
        Metric(
            "sia_round_timestamp_seconds", "When the last round ended (Unix time).", "gauge"
        ).add(m.round_time),
        Metric("sia_round_seconds", "Wall-clock seconds of the last round.", "gauge").add(
            m.timings.get("round_s", 0.0)
        ),
        stage,
        Metric(
            "sia_solve_seconds", "Seconds the policy's solver took in the last round.", "gauge"
        ).add(m.solve_seconds, status=m.solve_status),
        Metric("sia_dry_run", "1 when the controller only observes and decides.", "gauge").add(
            1 if m.dry_run else 0
        ),
        phases,
        gpus,
        this_round,
        total,
        Metric("sia_actions_pending", "Journaled actions not yet confirmed.", "gauge").add(
            m.pending_actions
        ),
        Metric("sia_rejected_inputs", "Reports or jobs rejected in the last round.", "gauge").add(
            m.rejected
        ),
        Metric(
            "sia_placement_misses",
            "Allocations of the last round placement could not honour: left unplaced, or "
            "placed at one of the policy's fallbacks.",
            "gauge",
        )
        .add(m.unplaced, outcome="unplaced")
        .add(m.placed_at_fallback, outcome="fallback"),
        waiting,
    ]


def render(metrics: Iterable[Metric]) -> str:
    """The text exposition format (version 0.0.4): HELP and TYPE lines, then samples."""
    lines = []
    for metric in metrics:
        if not _METRIC_NAME.fullmatch(metric.name):
            raise ValueError(f"metric name {metric.name!r} is not a valid Prometheus metric name")
        if metric.kind not in ("gauge", "counter"):
            raise ValueError(f"metric {metric.name}: type {metric.kind!r}; expected gauge, counter")
        lines.append(f"# HELP {metric.name} {_escaped(metric.help)}")
        lines.append(f"# TYPE {metric.name} {metric.kind}")
        for sample in metric.samples:
            lines.append(f"{metric.name}{_labels(sample.labels)} {_number(sample.value)}")
    return "\n".join(lines) + "\n"


def write_textfile(directory: Path, metrics: Iterable[Metric]) -> Path:
    """Atomically replace ``directory/sia.prom`` (readable by the collector: mode 0644)."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / PROM_FILE
    fd, tmp = tempfile.mkstemp(prefix=f".{PROM_FILE}.", dir=directory)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(render(metrics))
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    parts = []
    for key, value in labels.items():
        if not _LABEL_NAME.fullmatch(key):
            raise ValueError(f"metric label name {key!r} is not a valid Prometheus label")
        parts.append(f'{key}="{_escape_label_value(str(value))}"')
    return "{" + ",".join(parts) + "}"


def _escape_label_value(text: str) -> str:
    return _escaped(text).replace('"', '\\"')


def _escaped(text: str) -> str:
    """``text`` in the format's escapes: a newline as ``\\n``, a backslash as ``\\\\`` (and a
    double quote as ``\\"`` in a label value, by the caller). Any other control character is
    first made a visible escape of its own (:func:`~sia_slurm.text.printable`), whose backslash
    is then escaped too: the collector (Go's expfmt) refuses any escape but those three."""
    return "\\n".join(printable(line).replace("\\", "\\\\") for line in text.split("\n"))


def _number(value: float) -> str:
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return repr(int(value)) if value.is_integer() and abs(value) < 2**53 else repr(value)
