"""The measurement of restart time: each grant paired with the moment its job trains.

Pure (reads the controller's SQLite state database and the jobs' logs), so both
``benchmarks/restart_time.py`` (its own calibration run) and ``benchmarks/fidelity.py`` (the
30-job run) measure restarts the same way: :func:`grant_delays` pairs every Start/Move the
controller journalled as done (``actions`` in its state database; ``created`` is when the round
granted the GPUs) with rank 0's first ``restored step ...`` / ``no checkpoint ...: starting from
scratch`` line in the job's stdout after it (the ``--output`` file of ``sia-sbatch``, appended
to across requeues). The line names the round the run was launched for, which must not be older
than the grant's. A grant with no such line before the job's next grant (the job finished, or
was stopped again first) is left out and counted apart.
"""

from __future__ import annotations

import json
import re
import sqlite3
import statistics
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

GRANT_KINDS = ("start", "move")  # journalled actions that (re)start a job on granted GPUs
READY_LINE = re.compile(
    r"(?P<asctime>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(?P<ms>\d{3}) rank0 \S+ \S+ "
    r"\[round=(?P<round>\d+) job=(?P<job>[^\]\s]+)\] "
    r"(?:restored step \d+|no checkpoint in .*: starting from scratch)"
)
ASCTIME_FORMAT = "%Y-%m-%d %H:%M:%S"  # logging's default asctime, local time, then ",mmm"


class RestartTimeError(ValueError):
    """An input cannot be read (names the file and the field) or the calibration failed."""


@dataclass(frozen=True)
class Grant:
    """A Start or Move the controller issued successfully: GPUs granted at ``granted``."""

    sia_id: str
    kind: str
    gpus: int
    nodes: tuple[str, ...]
    round_index: int
    granted: float  # epoch seconds: actions.created


@dataclass(frozen=True)
class ReadyLine:
    """Rank 0 of a run launched for ``round_index`` has restored (or found no checkpoint)."""

    sia_id: str
    round_index: int
    time: float  # epoch seconds


@dataclass(frozen=True)
class GrantDelay:
    """From a grant to the job training on the granted GPUs."""

    sia_id: str
    kind: str  # "start" or "move" (the controller's journalled action kind)
    gpus: int  # GPUs granted
    granted: float  # epoch seconds: actions.created of the Start/Move in the state DB
    ready: float  # epoch seconds: rank 0's first ready line after ``granted``

    @property
    def seconds(self) -> float:
        return self.ready - self.granted


@dataclass(frozen=True)
class Measurement:
    """Every grant of the jobs measured: paired with its ready line, or not (``unready``)."""

    delays: tuple[GrantDelay, ...]
    unready: tuple[Grant, ...]  # no ready line before the job's next grant
    missing_logs: tuple[Path, ...]  # log files that do not exist (their grants are unready)


def read_grants(db: Path) -> list[Grant]:
    """Every Start/Move journalled as ``done`` in the controller's state database, oldest first."""
    if not db.is_file():
        raise RestartTimeError(f"{db}: no state database (has the controller run?)")
    query = (
        "SELECT id, round_index, sia_id, kind, payload, created FROM actions "
        f"WHERE state = 'done' AND kind IN ({', '.join('?' * len(GRANT_KINDS))}) "
        "ORDER BY created, id"
    )
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute(query, GRANT_KINDS).fetchall()
    except sqlite3.Error as exc:
        raise RestartTimeError(f"{db}: table actions: cannot read it: {exc}") from None
    return [_grant(db, *row) for row in rows]


def _grant(
    db: Path, entry_id: int, round_index: int, sia_id: str, kind: str, payload: str, created: float
) -> Grant:
    where = f"{db}: actions id {entry_id}: payload"
    try:
        document = json.loads(payload)
        gpus = document["config"]["gpus"]
        nodes = tuple(str(node) for node, _gpus in document["placement"])
    except (ValueError, KeyError, TypeError) as exc:
        raise RestartTimeError(
            f"{where}: expected {{config: {{gpus}}, placement: [[node, gpus]]}}: {exc!r}"
        ) from None
    if not isinstance(gpus, int) or gpus < 1:
        raise RestartTimeError(f"{where}.config.gpus: expected a positive integer, got {gpus!r}")
    return Grant(sia_id, kind, gpus, nodes, int(round_index), float(created))


def parse_ready_lines(lines: Iterable[str]) -> list[ReadyLine]:
    """The ready lines among a job's log lines (any other line is ignored)."""
    found = []
    for line in lines:
        match = READY_LINE.search(line)
        if match is None:
            continue
        try:
            local = time.mktime(time.strptime(match["asctime"], ASCTIME_FORMAT))
        except ValueError:  # a matching but impossible date: not a line the trainer wrote
            continue
        when = local + int(match["ms"]) / 1000.0
        found.append(ReadyLine(match["job"], int(match["round"]), when))
    return found


def read_ready_lines(path: Path) -> list[ReadyLine]:
    """The ready lines of one log file (undecodable bytes are replaced, not fatal)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return parse_ready_lines(handle)
    except OSError as exc:
        raise RestartTimeError(f"{path}: cannot read the job log: {exc.strerror or exc}") from None


def pair_grants(
    grants: Sequence[Grant], ready: Sequence[ReadyLine]
) -> tuple[list[GrantDelay], list[Grant]]:
    """Each grant with the first ready line of its job at or after it and before the job's next
    grant, launched for its round or a later one; ``(delays, grants without one)``."""
    delays: list[GrantDelay] = []
    unready: list[Grant] = []
    by_job: dict[str, list[Grant]] = {}
    for grant in sorted(grants, key=lambda g: g.granted):
        by_job.setdefault(grant.sia_id, []).append(grant)
    lines = sorted(ready, key=lambda line: line.time)
    for sia_id, job_grants in by_job.items():
        own = [line for line in lines if line.sia_id == sia_id]
        for grant, following in zip(job_grants, [*job_grants[1:], None], strict=True):
            end = following.granted if following is not None else float("inf")
            match = next(
                (
                    line
                    for line in own
                    if grant.granted <= line.time < end and line.round_index >= grant.round_index
                ),
                None,
            )
            if match is None:
                unready.append(grant)
            else:
                delays.append(GrantDelay(sia_id, grant.kind, grant.gpus, grant.granted, match.time))
    delays.sort(key=lambda d: d.granted)
    return delays, unready


def measure(db: Path, logs: Mapping[str, Path]) -> Measurement:
    """Grant delays of the jobs in ``logs`` (sia id -> stdout file); other jobs are ignored."""
    grants = [grant for grant in read_grants(db) if grant.sia_id in logs]
    ready: list[ReadyLine] = []
    missing = []
    for sia_id, path in logs.items():
        if not Path(path).exists():  # never started: Slurm has not opened its output yet
            missing.append(Path(path))
            continue
        ready += [line for line in read_ready_lines(Path(path)) if line.sia_id == sia_id]
    delays, unready = pair_grants(grants, ready)
    return Measurement(tuple(delays), tuple(unready), tuple(missing))


def grant_delays(db: Path, logs: Mapping[str, Path]) -> list[GrantDelay]:
    """Grant -> training delays of the jobs in ``logs`` (sia id -> stdout file), oldest first."""
    return list(measure(db, logs).delays)


def summarize(delays: Sequence[GrantDelay]) -> dict[str, dict[str, float]]:
    """Per kind: count, mean_s, median_s, max_s of the delays (kinds without any are absent)."""
    summary: dict[str, dict[str, float]] = {}
    kinds = {d.kind for d in delays}
    for kind in [*(k for k in GRANT_KINDS if k in kinds), *sorted(kinds - set(GRANT_KINDS))]:
        seconds = [d.seconds for d in delays if d.kind == kind]
        summary[kind] = {
            "count": len(seconds),
            "mean_s": statistics.fmean(seconds),
            "median_s": statistics.median(seconds),
            "max_s": max(seconds),
        }
    return summary


def summarize_by_size(delays: Sequence[GrantDelay]) -> dict[int, dict[str, dict[str, float]]]:
    """:func:`summarize` per number of GPUs granted."""
    return {
        gpus: summarize([d for d in delays if d.gpus == gpus])
        for gpus in sorted({d.gpus for d in delays})
    }
