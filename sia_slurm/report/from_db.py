"""The dashboard from the controller's state database (``<state_dir>/sia.db``).

What comes from where (schema: :mod:`sia_slurm.state.schema`):

* GPU types and their totals: the last round's ``rounds.gpus`` (else the last snapshot's nodes);
* one :class:`RoundPoint` per ``rounds`` row: GPUs the round allocated and GPUs usable per
  type, the policy's solve time, running (incl. restoring) and pending jobs;
* one :class:`JobRow` per ``jobs`` row: phase, restarts, submission and finish; the GPU type,
  GPU count and batch of the last decision that gave the job GPUs (a finished job has no
  current configuration any more, its last decision still says what it ran on); the timeline
  segments from the per-round decisions (a segment per run of rounds with the same
  configuration, ending at the next change, the job's finish or the last round; a round that
  quarantined the job counts with the configuration it held, which stays its own);
* the jobs the *last* round quarantined (a ``decisions`` row with action
  :data:`~sia_slurm.controller.quarantine.QUARANTINED`): state ``quarantined`` and the reason,
  ``<stage>: <why>``, as the row's ``note`` (see :func:`quarantined_rows`); a job out of
  quarantine shows its phase again;
* the *measured* and *predicted* goodput of a job, a pair that means the same thing
  (:mod:`~sia_slurm.report.goodput`, issue 34): both are for the shape the job's newest metrics
  report measured (GPU type, nodes, GPUs, per-GPU batch, accumulation), and both apply the
  statistical efficiency of that report's gradient statistics at its batch relative to M0. Measured:
  the report's throughput times it. Predicted: the throughput the controller predicted for that
  shape in the newest decision that assigned exactly it, times it. So the two differ by the
  throughput model's error on what the job ran, and by nothing else: not by a batch or a move
  decided after the report (which the job may never have run), not by statistics that moved since
  the decision (a demo job goes through its whole training in minutes). Without a report the
  predicted goodput is the last granting decision's own; a database written before decisions kept
  their throughput (schema 1) gives the matching decision's own goodput, with the statistics of its
  round. Reports of finished jobs are dropped from the database, so for them the job's metrics file
  (``<state_dir>/jobs/<id>/metrics.json``, the last report the job wrote) is read when a state
  directory is given;
* the *accounted* GPU-hours of a job, when the caller passes what Slurm accounting charged
  each job over all its Slurm runs (``sia-slurm report --config`` asks ``sacct`` exactly as
  ``sia-slurm status`` does); without it every row's ``accounted_gpu_hours`` is ``None``.

Times are shown in seconds since the first submission. The database is opened read-only in
spirit (nothing is written; the store's open never migrates an up-to-date schema).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path

from sia_slurm.controller import Decision
from sia_slurm.controller.profiling import PROFILING_NOTE
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.protocol import METRICS_FILE, MetricsReport, ProtocolError, StatePaths, from_json
from sia_slurm.report.goodput import DecisionPoint, goodput_pair
from sia_slurm.report.report_data import GpuTypeTotal, JobRow, ReportData, RoundPoint, Segment
from sia_slurm.report.sources import NO_CONFIG, ReportSourceError, parse_config, summary_pairs
from sia_slurm.slurm.observe.jobfiles import SlurmRecord
from sia_slurm.state import RoundRow, Store, StoreError
from sia_slurm.state.rows import GONE, round_row
from sia_slurm.state.rows import JobRow as StoredJob
from sia_slurm.userfiles import JobDirectory

UNKNOWN_APP = "?"  # the app of a job the controller has no row of (never read)


def report_from_db(
    db_path: Path,
    *,
    state_dir: Path | None = None,
    title: str | None = None,
    accounted: Mapping[str, float] | None = None,
) -> ReportData:
    """Read ``db_path`` (and optionally the jobs' last metrics files under ``state_dir``) into
    a :class:`ReportData`.

    ``accounted``: GPU-hours per sia job from Slurm accounting (``None``: no accounting). A
    job sacct has no run of (never started, or its runs not yet recorded) is charged 0.0, as
    ``status`` shows it.
    """
    try:
        store = Store.open(Path(db_path), create=False)
    except StoreError as exc:
        raise ReportSourceError(str(exc)) from None
    try:
        rounds = _rounds(store)
        jobs = store.jobs()
        decisions = _decisions(store)
        quarantined = store.decisions(rounds[-1].round_index) if rounds else {}
        reports = _stored_reports(store)
        nodes = store.last_nodes()
    finally:
        store.close()
    if state_dir is not None:
        paths = StatePaths(Path(state_dir))
        for job in jobs:
            if job.sia_id not in reports:
                report = _last_report(paths, job.sia_id)
                if report is not None:
                    reports[job.sia_id] = report
    origin = _origin(jobs, rounds)
    end = max([r.time for r in rounds] + [j.finish_time or 0.0 for j in jobs] + [origin])
    gpu_types = _gpu_types(rounds, nodes)
    rows = tuple(
        _job_row(job, decisions.get(job.sia_id, []), reports.get(job.sia_id), origin, end)
        for job in sorted(jobs, key=lambda j: (j.submit_time or 0.0, j.sia_id))
    )
    last_time = rounds[-1].time - origin if rounds else 0.0
    rows = quarantined_rows(rows, quarantined.values(), last_time)
    if accounted is not None:
        rows = tuple(replace(row, accounted_gpu_hours=accounted.get(row.id, 0.0)) for row in rows)
    points = tuple(_round_point(r, origin) for r in rounds)
    return ReportData(
        title=title or f"sia-slurm: {Path(db_path).parent.name or db_path}",
        subtitle=f"controller state database {db_path}",
        gpu_types=gpu_types,
        rounds=points,
        jobs=rows,
        summary=summary_pairs(rows, points),
    )


# ----------------------------------------------------------------------------------------------
# Reading


def _rounds(store: Store) -> list[RoundRow]:
    rows = store.conn.execute("SELECT * FROM rounds ORDER BY round_index").fetchall()
    decoded = []
    for row in rows:
        where = f"{store.path}: rounds.round_index={row['round_index']}"
        try:
            decoded.append(round_row(row))
        except (ValueError, TypeError) as exc:
            raise ReportSourceError(f"{where}: {exc}") from None
    return decoded


def _decisions(store: Store) -> dict[str, list[DecisionPoint]]:
    rows = store.conn.execute(
        "SELECT d.round_index, d.sia_id, d.action, d.before, d.after, d.batch_size, d.goodput, "
        "d.note, d.local_bsz, d.accum_steps, d.throughput, r.time FROM decisions d "
        "JOIN rounds r ON r.round_index = d.round_index ORDER BY d.sia_id, d.round_index"
    ).fetchall()
    by_job: dict[str, list[DecisionPoint]] = {}
    for row in rows:
        held = row["action"] == QUARANTINED  # sat the round out, keeping what it held
        by_job.setdefault(row["sia_id"], []).append(
            DecisionPoint(
                row["round_index"],
                row["time"],
                row["before"] if held else row["after"],
                row["batch_size"],
                row["goodput"],
                held,
                str(row["note"] or "").startswith(PROFILING_NOTE),
                row["local_bsz"],
                row["accum_steps"],
                row["throughput"],
            )
        )
    return by_job


def _stored_reports(store: Store) -> dict[str, MetricsReport]:
    """The newest stored report of every job (those the controller still remembers)."""
    rows = store.conn.execute("SELECT id, sia_id, report FROM reports ORDER BY id").fetchall()
    newest: dict[str, MetricsReport] = {}
    for row in rows:
        where = f"{store.path}: reports.id={row['id']}"
        try:
            report = from_json(MetricsReport, json.loads(row["report"]), where)
        except (ProtocolError, ValueError) as exc:
            raise ReportSourceError(str(exc)) from None
        current = newest.get(row["sia_id"])
        if current is None or report.time >= current.time:
            newest[row["sia_id"]] = report
    return newest


def _last_report(paths: StatePaths, sia_id: str) -> MetricsReport | None:
    """The job's last metrics report, or ``None`` if it never wrote one (or the controller
    never recorded whose job it is). The file is the job's user's, so it is read through the
    user-file door as that user's (``control/<id>/slurm.json`` says who). A damaged file is
    an error (naming file and field), as everywhere else."""
    try:
        record = SlurmRecord.read(paths.slurm_record(sia_id))
        if record is None:
            return None
        with JobDirectory(paths.jobs_dir, sia_id, record.user_id) as directory:
            return directory.read_document(MetricsReport, METRICS_FILE)
    except ProtocolError as exc:
        raise ReportSourceError(str(exc)) from None


# ----------------------------------------------------------------------------------------------
# Building the rows


def _origin(jobs: Sequence[StoredJob], rounds: Sequence[RoundRow]) -> float:
    times = [j.submit_time for j in jobs if j.submit_time is not None]
    times += [r.time for r in rounds]
    return min(times) if times else 0.0


def _gpu_types(rounds: Sequence[RoundRow], nodes: Iterable[object]) -> tuple[GpuTypeTotal, ...]:
    totals: dict[str, int] = {}
    if rounds:
        for gpu_type, entry in rounds[-1].gpus.items():
            totals[gpu_type] = int(entry.get("total", 0))
    else:
        for node in nodes:
            name, total = node.gpu_type, node.total_gpus  # type: ignore[attr-defined]
            totals[name] = totals.get(name, 0) + total
    return tuple(GpuTypeTotal(name, total) for name, total in sorted(totals.items()))


def _round_point(row: RoundRow, origin: float) -> RoundPoint:
    phases = row.jobs_by_phase
    return RoundPoint(
        index=row.round_index,
        time=row.time - origin,
        allocated={t: int(e.get("allocated", 0)) for t, e in sorted(row.gpus.items())},
        usable={t: int(e.get("usable", 0)) for t, e in sorted(row.gpus.items())},
        solve_ms=row.solve_seconds * 1000.0,
        running=phases.get("running", 0) + phases.get("starting", 0),
        pending=phases.get("pending", 0),
    )


def _job_row(
    job: StoredJob,
    decisions: Sequence[DecisionPoint],
    report: MetricsReport | None,
    origin: float,
    end: float,
) -> JobRow:
    submit = job.submit_time if job.submit_time is not None else origin
    finish = job.finish_time if job.phase in ("done", "failed") else None
    # A quarantined round decided nothing: batch and goodput come from the last real grant.
    granted = [d for d in decisions if d.after != NO_CONFIG and not d.quarantined]
    last = granted[-1] if granted else None
    config = parse_config(last.after) if last else None
    if job.config is not None:  # holds GPUs now: the snapshot's view is the truth
        config = (job.config["gpu_type"], job.config["nodes"], job.config["gpus"])
    batch = (job.batch or {}).get("batch_size") or (last.batch_size if last else 0)
    segment_end = finish if finish is not None else (job.last_seen or end)
    init_batch_size = int(job.spec.get("init_batch_size") or 0)
    if report is not None:
        predicted, measured = goodput_pair(report, decisions, init_batch_size)
    else:  # nothing measured to set it against: what the controller expects of its grant
        predicted, measured = (last.goodput if last and last.goodput > 0 else None), None
    return JobRow(
        id=job.sia_id,
        app=str(job.spec.get("app", "")),
        state=job.phase if job.phase != GONE else "gone",
        submit_time=submit - origin,
        gpu_type=config[0] if config else "",
        gpus=config[2] if config else 0,
        batch_size=int(batch),
        goodput_predicted=predicted,
        goodput_measured=measured,
        restarts=job.restarts,
        finish_time=None if finish is None else finish - origin,
        jct_s=None if finish is None or job.phase != "done" else finish - submit,
        segments=segments_from_decisions(decisions, segment_end, origin),
        profiling_s=profiling_time(decisions),
        user=job.user,
        account=job.account,
    )


def profiling_time(decisions: Sequence[DecisionPoint]) -> float | None:
    """How long the job profiled: from its first decision to the first that no longer says
    it profiles (``None`` if it never profiled; to its last decision while it still does)."""
    if not decisions or not decisions[0].profiling:
        return None
    after = next((d for d in decisions if not d.profiling), decisions[-1])
    return after.time - decisions[0].time


def quarantined_rows(
    rows: Sequence[JobRow], quarantined: Iterable[Decision], last_time: float
) -> tuple[JobRow, ...]:
    """``rows`` with the jobs the last round quarantined shown as such: state
    ``quarantined`` and the controller's reason as ``note``, whatever the phase the database
    holds (a job the backend could not read is missing from that round's snapshot, so its
    row may say ``gone``). Only the last round counts: a job quarantined earlier and decided
    since shows its phase.

    A quarantined job without a row (the backend never read it, so never recorded it) is
    still a job of the cluster that is not being scheduled: it is added at the end, with app
    ``?``, the configuration it holds if any, and the last round's time as its submission
    (the earliest time the database knows of it)."""
    reasons = {d.sia_id: d for d in quarantined if d.action == QUARANTINED}
    shown = tuple(
        replace(row, state=QUARANTINED, note=reasons[row.id].note) if row.id in reasons else row
        for row in rows
    )
    known = {row.id for row in rows}
    unread = []
    for sia_id in sorted(set(reasons) - known):
        config = parse_config(reasons[sia_id].before)
        unread.append(
            JobRow(
                id=sia_id,
                app=UNKNOWN_APP,
                state=QUARANTINED,
                submit_time=last_time,
                gpu_type=config[0] if config else "",
                gpus=config[2] if config else 0,
                note=reasons[sia_id].note,
            )
        )
    return (*shown, *unread)


def segments_from_decisions(
    decisions: Sequence[DecisionPoint], end: float, origin: float
) -> tuple[Segment, ...]:
    """Runs of rounds with the same granted configuration; each ends where the next decision
    changes it (or the job ends at ``end``)."""
    segments: list[Segment] = []
    current: tuple[float, str] | None = None
    for point in decisions:
        if current is not None and point.after != current[1]:
            segments.append(_segment(current, point.time, origin))
            current = None
        if current is None and point.after != NO_CONFIG:
            current = (point.time, point.after)
    if current is not None and end > current[0]:
        segments.append(_segment(current, end, origin))
    return tuple(segments)


def _segment(current: tuple[float, str], end: float, origin: float) -> Segment:
    config = parse_config(current[1])
    assert config is not None
    return Segment(current[0] - origin, end - origin, config[0], config[2])
