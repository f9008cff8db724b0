"""The rows of the ``jobs``, ``rounds`` and ``decisions`` tables, decoded, and their columns.

What :class:`~sia_slurm.state.store.Store` reads back and what offline readers (the dashboard's
:mod:`sia_slurm.report.from_db`) decode from a query of their own: one place that knows how
each column maps to a field, JSON columns included.
"""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from typing import Any

from sia_slurm.core import Decision

GONE = "gone"  # jobs.phase of a job that left the snapshots without finishing


@dataclass(frozen=True)
class JobRow:
    """One row of ``jobs``, decoded."""

    sia_id: str
    spec: dict[str, Any]
    phase: str
    phase_history: list[list[Any]]  # [time, phase] per change
    slurm_job_ids: list[str]
    submit_time: float | None
    first_start: float | None
    finish_time: float | None
    restarts: int
    config: dict[str, Any] | None
    placement: list[list[Any]] | None
    batch: dict[str, int] | None
    message: str
    last_seen: float | None
    remembered: bool
    admitted_round: int | None
    max_gpus_seen: int
    reports_seen: int
    last_report_time: float | None
    user: str = ""  # Slurm's user and account of the job ('' before schema 3's first sight)
    account: str = ""


@dataclass(frozen=True)
class RoundRow:
    """One row of ``rounds``: what :meth:`Store.record_round` writes, and reads back decoded."""

    round_index: int
    time: float
    wall_time: float
    dry_run: bool
    timings: dict[str, float]
    solve_status: str
    solve_seconds: float
    solve_message: str
    gpus: dict[str, dict[str, int]]  # type -> total/usable/allocated/in_use
    jobs_by_phase: dict[str, int]
    rejected: list[str]


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def job_row(row: sqlite3.Row) -> JobRow:
    return JobRow(
        sia_id=row["sia_id"],
        spec=json.loads(row["spec"]),
        phase=row["phase"],
        phase_history=json.loads(row["phase_history"]),
        slurm_job_ids=json.loads(row["slurm_job_ids"]),
        submit_time=row["submit_time"],
        first_start=row["first_start"],
        finish_time=row["finish_time"],
        restarts=row["restarts"],
        config=_loads(row["config"]),
        placement=_loads(row["placement"]),
        batch=_loads(row["batch"]),
        message=row["message"],
        last_seen=row["last_seen"],
        remembered=bool(row["remembered"]),
        admitted_round=row["admitted_round"],
        max_gpus_seen=row["max_gpus_seen"],
        reports_seen=row["reports_seen"],
        last_report_time=row["last_report_time"],
        user=row["user"],
        account=row["account"],
    )


def round_row(row: sqlite3.Row) -> RoundRow:
    """Decode one row of the ``rounds`` table (JSON columns included)."""
    return RoundRow(
        round_index=row["round_index"],
        time=row["time"],
        wall_time=row["wall_time"],
        dry_run=bool(row["dry_run"]),
        timings=json.loads(row["timings"]),
        solve_status=row["solve_status"],
        solve_seconds=row["solve_seconds"],
        solve_message=row["solve_message"],
        gpus=json.loads(row["gpus"]),
        jobs_by_phase=json.loads(row["jobs_by_phase"]),
        rejected=json.loads(row["rejected"]),
    )


def decision_values(d: Decision) -> tuple[Any, ...]:
    return (
        d.sia_id,
        d.phase,
        d.action,
        d.before,
        d.after,
        d.batch_size,
        d.local_bsz,
        d.accum_steps,
        d.goodput,
        d.note,
        d.throughput,
    )


def decision(row: sqlite3.Row) -> Decision:
    return Decision(
        sia_id=row["sia_id"],
        phase=row["phase"],
        action=row["action"],
        before=row["before"],
        after=row["after"],
        batch_size=row["batch_size"],
        local_bsz=row["local_bsz"],
        accum_steps=row["accum_steps"],
        goodput=row["goodput"],
        note=row["note"],
        throughput=row["throughput"],
    )
