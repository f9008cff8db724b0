"""The controller's side of the job files under ``state_dir``: read them cheaply, trust nothing.

* :class:`DocumentCache` reads specs (through :class:`~sia_slurm.userfiles.JobDirectory`) and
  the controller's own assignments and stop requests, re-parsing a file only when its mtime,
  size or inode changed (a round with hundreds of jobs re-reads only what moved).
* :class:`MetricsInbox` validates each job's ``jobs/<sia_id>/metrics.json`` (owner, size,
  schema, finite positive numbers, a configured GPU type) and hands on only reports of the
  job's current Slurm run that are newer than the last one taken; a bad file is reported once
  per version, never raised.
* :class:`SlurmRecord` (``control/<sia_id>/slurm.json``) is the controller's own record of a
  job, written at first sight: whose it is (Slurm's user id), when it was submitted, which
  Slurm job is current, which ids it replaced and how many restarts those had.
"""

from __future__ import annotations

import logging
import math
import os
import stat
import time
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from sia_slurm.protocol import (
    METRICS_FILE,
    PROFILE_FILE,
    PROFILED_FILE,
    SIA_ID,
    SPEC_FILE,
    Assignment,
    JobSpec,
    MetricsReport,
    ProtocolError,
    StopRequest,
    read_document,
)
from sia_slurm.safefiles import read_json, write_json_atomic
from sia_slurm.userfiles import JobDirectory

logger = logging.getLogger(__name__)

_D = TypeVar("_D", JobSpec, Assignment, StopRequest)
_Version = tuple[int, int, int]


def _version(info: os.stat_result) -> _Version:
    return (info.st_mtime_ns, info.st_size, info.st_ino)


class DocumentCache:
    """Parsed protocol documents keyed by path, re-read when (mtime, size, inode) changes."""

    def __init__(self) -> None:
        self._entries: dict[Path, tuple[_Version, object]] = {}

    def read(self, cls: type[_D], path: Path) -> _D | None:
        """The controller's own document at ``path``, ``None`` if there is none;
        :class:`ProtocolError` if bad."""
        try:
            info = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            self._entries.pop(path, None)
            return None
        except OSError as exc:
            raise ProtocolError(f"{path}: cannot read: {exc.strerror or exc}") from None
        cached = self._entries.get(path)
        if cached is not None and cached[0] == _version(info):
            return cached[1]  # type: ignore[return-value]
        document = read_document(cls, path)
        self._entries[path] = (_version(info), document)
        return document

    def read_spec(self, directory: JobDirectory) -> JobSpec | None:
        """The job's ``spec.json``, read through the user-file door."""
        return self._read_user_file(  # type: ignore[return-value]
            directory, SPEC_FILE, lambda: directory.read_document(JobSpec, SPEC_FILE)
        )

    def read_profile(self, directory: JobDirectory) -> dict[str, Any] | None:
        """The job's own profile document (``profile.json``, the bounded JSON object only:
        the estimator factory checks its values), read through the user-file door; ``None``
        if the job brought none."""
        return self._read_user_file(  # type: ignore[return-value]
            directory, PROFILE_FILE, lambda: directory.read_json(PROFILE_FILE)
        )

    def read_profiled(self, directory: JobDirectory) -> tuple[dict[str, Any] | None, str]:
        """What the job measured while profiling (``profiled.json``: the bounded JSON object
        only; the controller checks its values), read through the user-file door, and which
        write of the file it is (its mtime, size and inode: a rewrite with the same content
        is a new measurement); ``(None, "")`` if it wrote none."""
        info = directory.stat(PROFILED_FILE)
        document = self._read_user_file(  # type: ignore[assignment]
            directory, PROFILED_FILE, lambda: directory.read_json(PROFILED_FILE)
        )
        if document is None or info is None:
            return None, ""
        return document, "-".join(str(part) for part in _version(info))  # type: ignore[return-value]

    def _read_user_file(
        self, directory: JobDirectory, name: str, read: Callable[[], object | None]
    ) -> object | None:
        """``read()`` of the user's file ``name``, or its cached value while the file's
        (mtime, size, inode) is unchanged; ``None`` if there is none."""
        path = directory.path / name
        info = directory.stat(name)
        if info is None:
            self._entries.pop(path, None)
            return None
        cached = self._entries.get(path)
        if cached is not None and cached[0] == _version(info):
            return cached[1]
        value = read()
        if value is not None:
            self._entries[path] = (_version(info), value)
        return value

    def forget(self, path: Path) -> None:
        self._entries.pop(path, None)


# ------------------------------------------------------------------------------------------------
# Metrics reports


@dataclass(frozen=True)
class RunId:
    """One Slurm run of a job: its id and Slurm's restart count (``SLURM_RESTART_COUNT``)."""

    slurm_job_id: str
    restart_count: int


class MetricsInbox:
    """Reads each managed job's metrics file; remembers what it has seen, so each report
    counts once and a bad file is reported once per version."""

    def __init__(self, gpu_types: tuple[str, ...]) -> None:
        self.gpu_types = gpu_types
        self._versions: dict[str, _Version] = {}  # sia id -> version of the file last read
        self._valid: dict[str, MetricsReport] = {}  # sia id -> its newest valid report
        # sia id -> the run and time of the newest report handed on (times of one run only
        # are compared: another run's rank 0 may be on a node whose clock differs)
        self._taken: dict[str, tuple[RunId, float]] = {}

    def read(
        self,
        sia_id: str,
        directory: JobDirectory,
        run: RunId,
        rejected: list[str],
        nodes: Sequence[str] = (),
    ) -> tuple[MetricsReport | None, bool]:
        """``(a new report of ``run``, whether ``run`` has reported at all)``. ``nodes``: the
        run's nodes as Slurm says; a report from other nodes is another run's, even with this
        run's identity (Assignment.hands_over: a slurmctld restarted from older state can
        launch one identity twice)."""
        info = directory.stat(METRICS_FILE)
        if info is None:
            self._drop(sia_id)
            return None, False
        version = _version(info)
        if self._versions.get(sia_id) != version:
            self._versions[sia_id] = version
            self._valid.pop(sia_id, None)
            try:
                self._valid[sia_id] = self._validate(sia_id, directory, info)
            except ProtocolError as exc:
                rejected.append(str(exc))
        report = self._valid.get(sia_id)
        if report is None or RunId(report.slurm_job_id, report.slurm_restart_count) != run:
            return None, False  # none yet from this run (the last run's file is still there)
        if report.node_list and nodes and sorted(report.node_list) != sorted(nodes):
            return None, False  # this identity's run elsewhere (left behind, soon killed)
        taken_run, taken_time = self._taken.get(sia_id, (run, -math.inf))
        if taken_run != run or report.time > taken_time:
            self._taken[sia_id] = (run, report.time)
            return report, True
        return None, True

    def keep_only(self, sia_ids: Iterable[str]) -> None:
        """Forget every job not in ``sia_ids`` (finished and gone)."""
        live = set(sia_ids)
        for sia_id in [s for s in self._versions if s not in live]:
            self._drop(sia_id)

    def _drop(self, sia_id: str) -> None:
        self._versions.pop(sia_id, None)
        self._valid.pop(sia_id, None)
        self._taken.pop(sia_id, None)

    def _validate(
        self, sia_id: str, directory: JobDirectory, info: os.stat_result
    ) -> MetricsReport:
        where = directory.where(METRICS_FILE)
        if stat.S_ISLNK(info.st_mode):
            raise ProtocolError(f"{where}: is a symbolic link (not followed)")
        if not stat.S_ISREG(info.st_mode):
            raise ProtocolError(f"{where}: not a regular file")
        report = directory.read_document(MetricsReport, METRICS_FILE)
        if report is None:
            raise ProtocolError(f"{where}: vanished while read")
        if report.sia_id != sia_id:
            raise ProtocolError(f"{where}: sia_id: {report.sia_id!r} is not the job's {sia_id!r}")
        if not report.time > 0:
            raise ProtocolError(f"{where}: time: expected a positive time, got {report.time!r}")
        if report.gpu_type not in self.gpu_types:
            raise ProtocolError(
                f"{where}: gpu_type: {report.gpu_type!r} is not a configured GPU type "
                f"({', '.join(self.gpu_types)})"
            )
        if report.gpus % report.nodes:
            raise ProtocolError(
                f"{where}: gpus: {report.gpus} GPUs do not split evenly over {report.nodes} nodes"
            )
        return report


# ------------------------------------------------------------------------------------------------
# The backend's own record of resubmitted jobs


@dataclass(frozen=True)
class SlurmRecord:
    """``control/<sia_id>/slurm.json``: the controller's record of a job, from first sight.

    ``user_id`` and ``submit_time`` are Slurm's, taken from the job's first Slurm job (never
    from a file the user wrote): the job is managed only while its Slurm job belongs to that
    user, and its age and queue order count from that time across resubmissions.
    ``slurm_job_id`` is the job that now carries the sia id; ``superseded`` the ids it
    replaced (cancelled, or to be cancelled); ``restart_base`` the restarts those had, added
    to Slurm's restart count of the current job. ``failed_runs`` and ``slurm_failed_runs``
    name the runs (``<job id>.<restart count>``) that the controller brought back after they
    failed, by the job's own code and by Slurm's doing: what the retry budgets are spent on.
    """

    slurm_job_id: str
    user_id: int
    submit_time: float
    restart_base: int = 0
    superseded: tuple[str, ...] = ()
    failed_runs: tuple[str, ...] = ()
    slurm_failed_runs: tuple[str, ...] = ()
    # The job's TimeLimit (minutes) at first sight, before the controller set the time left on
    # a later run: its limit over its whole life (slurm/actuate/timelimit.py). None: unlimited.
    time_limit_min: int | None = None

    def with_failure(self, run: RunId, users_fault: bool) -> SlurmRecord:
        """This record with ``run`` counted as a failed run (once, however often called)."""
        name = f"{run.slurm_job_id}.{run.restart_count}"
        if name in self.failed_runs or name in self.slurm_failed_runs:
            return self
        if users_fault:
            return replace(self, failed_runs=(*self.failed_runs, name))
        return replace(self, slurm_failed_runs=(*self.slurm_failed_runs, name))

    @classmethod
    def read(cls, path: Path) -> SlurmRecord | None:
        try:
            os.stat(path, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise ProtocolError(f"{path}: cannot read: {exc.strerror or exc}") from None
        payload = read_json(path)
        try:
            record = cls(
                slurm_job_id=_text(payload["slurm_job_id"]),
                user_id=_integer(payload["user_id"]),
                submit_time=float(payload["submit_time"]),
                restart_base=_integer(payload.get("restart_base", 0)),
                superseded=tuple(_text(j) for j in payload.get("superseded", [])),
                failed_runs=tuple(_text(r) for r in payload.get("failed_runs", [])),
                slurm_failed_runs=tuple(_text(r) for r in payload.get("slurm_failed_runs", [])),
                time_limit_min=(
                    None
                    if payload.get("time_limit_min") is None
                    else _integer(payload["time_limit_min"])
                ),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"{path}: bad controller record: {exc!r}") from None
        if record.restart_base < 0 or record.user_id < 0:
            raise ProtocolError(f"{path}: restart_base, user_id: expected integers >= 0")
        return record

    def write(self, path: Path) -> None:
        write_json_atomic(
            path,
            {
                "slurm_job_id": self.slurm_job_id,
                "user_id": self.user_id,
                "submit_time": self.submit_time,
                "restart_base": self.restart_base,
                "superseded": list(self.superseded),
                "failed_runs": list(self.failed_runs),
                "slurm_failed_runs": list(self.slurm_failed_runs),
                "time_limit_min": self.time_limit_min,
            },
        )


def _text(value: object) -> str:
    if not isinstance(value, str | int) or isinstance(value, bool):
        raise TypeError(f"expected a job id, got {value!r}")
    return str(value)


def _integer(value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"expected an integer, got {value!r}")
    return value


class RecordBook:
    """Every ``control/<sia_id>/slurm.json``, re-read only when a file changed."""

    def __init__(self, control_dir: Path) -> None:
        self.control_dir = control_dir
        self._cache: dict[str, tuple[_Version, SlurmRecord]] = {}

    def load(self, problems: list[str]) -> dict[str, SlurmRecord]:
        """The records by sia id; a bad one is named in ``problems`` and left out."""
        try:
            entries = [e for e in os.scandir(self.control_dir) if e.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            entries = []
        records: dict[str, SlurmRecord] = {}
        for entry in entries:
            path = Path(entry.path) / "slurm.json"
            try:
                info = os.stat(path, follow_symlinks=False)
            except OSError:
                continue  # no record yet (or it vanished): nothing to say
            cached = self._cache.get(entry.name)
            if cached is not None and cached[0] == _version(info):
                records[entry.name] = cached[1]
                continue
            try:
                record = SlurmRecord.read(path)
            except ProtocolError as exc:
                problems.append(str(exc))
                continue
            if record is not None:
                self._cache[entry.name] = (_version(info), record)
                records[entry.name] = record
        for gone in set(self._cache) - set(records):
            del self._cache[gone]
        return records


# What the controller says of a job Slurm has forgotten before it ever saw it (see below).
LOST_SUBMISSION = "lost submission"


# The most spec files one round looks at for lost submissions: a user with 100,000 job
# directories costs a round this many lstat calls (about 0.1 s on 2 cores), not one per
# directory; a lost submission among more is found within len(jobs/) / LOST_SCAN_BUDGET rounds.
LOST_SCAN_BUDGET = 10_000


class LostSubmissions:
    """Jobs submitted with ``sia-sbatch`` that neither Slurm nor the controller knows: a
    ``jobs/<id>/spec.json`` older than ``min_age_s`` whose id is not in ``known`` (the ids of
    the live Slurm jobs and of the controller's records, ``control/<id>/slurm.json``).

    Seen in the chaos soak (docs/reliability.md): slurmctld SIGKILLed 1.5 s after it accepted a
    submission, before it saved its state; restarted, it purged the job ("Purged files for
    defunct batch JobId=24") and later gave the id to another job. ``sia-sbatch`` had exited 0.
    The controller cannot submit for the user (``sbatch --uid`` is root's), so it says so: the
    user resubmits. Only names and an ``lstat`` are read (the directory is the user's: nothing
    is opened or followed; an entry that is no real directory, a symlink to one say, is no job
    directory sia-sbatch made, and is passed over).

    ``jobs/`` is every user's, so its size is any user's choice. Each round lists it (names
    only) and looks at the spec files of at most ``budget`` candidates, from where the last
    round stopped; what it found is remembered per id, with the message of its first sight (so
    re-dating a spec makes no new message), until the directory goes or Slurm knows the id
    (benchmarks/bench_hostile_dirs.py).
    """

    def __init__(self, jobs_dir: Path, budget: int = LOST_SCAN_BUDGET) -> None:
        self.jobs_dir = jobs_dir
        self.budget = budget
        self._cursor = ""  # the name the next look starts after
        self._found: dict[str, str] = {}  # id -> its message

    def scan(self, known: set[str], now: float, min_age_s: float) -> list[str]:
        """The lost submissions found so far that are still lost, sorted."""
        try:
            fd = os.open(self.jobs_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except FileNotFoundError:
            self._found.clear()
            return []
        try:
            with os.scandir(fd) as entries:  # d_type: is_dir costs no system call
                names = sorted(
                    e.name
                    for e in entries
                    if e.name not in known
                    and SIA_ID.fullmatch(e.name)
                    and e.is_dir(follow_symlinks=False)
                )
            present = set(names)
            self._found = {n: m for n, m in self._found.items() if n in present}
            for name in self._next(names):
                if name in self._found:
                    continue
                try:
                    info = os.stat(f"{name}/{SPEC_FILE}", dir_fd=fd, follow_symlinks=False)
                except OSError:
                    continue
                if now - info.st_mtime >= min_age_s:
                    self._found[name] = _lost_message(name, info.st_mtime)
        finally:
            os.close(fd)
        return sorted(self._found.values())

    def _next(self, names: list[str]) -> list[str]:
        """Up to ``budget`` of ``names`` (sorted) after the cursor, wrapping round."""
        if len(names) <= self.budget:
            self._cursor = ""
            return names
        start = bisect_right(names, self._cursor)
        chosen = (names[start:] + names[:start])[: self.budget]
        self._cursor = chosen[-1]
        return chosen


def _lost_message(name: str, written: float) -> str:
    return (
        f"{LOST_SUBMISSION}: job {name}: spec.json written "
        f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(written))}, but no Slurm job "
        "carries its id and the controller never saw one (Slurm did not keep the submission: "
        "slurmctld crashed before it saved it, or sia-sbatch was killed before it "
        "submitted): submit it again"
    )
