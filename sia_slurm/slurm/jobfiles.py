"""The controller's side of the job files under ``state_dir``: read them cheaply, trust nothing.

* :class:`DocumentCache` reads specs and assignments, re-parsing a file only when its mtime or
  size changed (a round with hundreds of jobs re-reads only what moved).
* :class:`MetricsSpool` validates every ``spool/<sia_id>.json`` (size, schema, finite positive
  numbers, the sia id of a managed job, the file owner) and hands on only reports newer than the
  last one taken from that job; a bad file is reported once per version, never raised.
* :class:`SlurmRecord` (``jobs/<sia_id>/slurm.json``) is the backend's own bookkeeping for a job
  that was resubmitted under a new Slurm job id: which id is current, which ids it replaced,
  and how many restarts the replaced ones had (Slurm's restart count starts again at 0).
"""

from __future__ import annotations

import logging
import math
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sia_slurm.protocol import (
    MAX_FILE_BYTES,
    Assignment,
    JobSpec,
    MetricsReport,
    ProtocolError,
    StatePaths,
    read_document,
    read_json,
    write_json_atomic,
)

logger = logging.getLogger(__name__)

_D = TypeVar("_D", JobSpec, Assignment)


class DocumentCache:
    """Parsed protocol documents keyed by path, re-read when (mtime, size) changes."""

    def __init__(self) -> None:
        self._entries: dict[Path, tuple[tuple[int, int], object]] = {}

    def read(self, cls: type[_D], path: Path) -> _D | None:
        """The document at ``path``, ``None`` if there is none; :class:`ProtocolError` if bad."""
        try:
            info = path.stat()
        except FileNotFoundError:
            self._entries.pop(path, None)
            return None
        except OSError as exc:
            raise ProtocolError(f"{path}: cannot read: {exc.strerror or exc}") from None
        key = (info.st_mtime_ns, info.st_size)
        cached = self._entries.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]  # type: ignore[return-value]
        document = read_document(cls, path)
        self._entries[path] = (key, document)
        return document

    def forget(self, path: Path) -> None:
        self._entries.pop(path, None)


# ------------------------------------------------------------------------------------------------
# The metrics spool


@dataclass
class SpoolScan:
    """One pass over the spool: new valid reports, messages for bad files, and for every
    managed job the time of its newest valid report (new or not)."""

    reports: list[MetricsReport] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    latest: dict[str, float] = field(default_factory=dict)


class MetricsSpool:
    """Reads ``spool/`` each round; remembers what it has seen, so each report counts once."""

    def __init__(self, paths: StatePaths, gpu_types: tuple[str, ...]) -> None:
        self.paths = paths
        self.gpu_types = gpu_types
        self._versions: dict[str, tuple[int, int, int]] = {}  # file name -> (mtime, size, ino)
        self._valid: dict[str, MetricsReport] = {}  # sia id -> newest valid report
        self._taken: dict[str, float] = {}  # sia id -> time of the newest report handed on

    def scan(self, specs: Mapping[str, JobSpec]) -> SpoolScan:
        """Validate changed files; ``specs`` are the managed jobs of this round by sia id."""
        result = SpoolScan()
        try:
            entries = list(os.scandir(self.paths.spool_dir))
        except FileNotFoundError:
            entries = []
        present = set()
        for entry in entries:
            if not entry.name.endswith(".json") or entry.name.startswith("."):
                continue  # temporary files of atomic writers
            present.add(entry.name)
            self._scan_entry(entry, specs, result)
        for name in set(self._versions) - present:
            del self._versions[name]
        for sia_id in [s for s in self._valid if f"{s}.json" not in present]:
            del self._valid[sia_id]  # the job's file is gone (job finished and cleaned up)
            self._taken.pop(sia_id, None)
        for sia_id, report in self._valid.items():
            if sia_id in specs:
                result.latest[sia_id] = report.time
                if report.time > self._taken.get(sia_id, -math.inf):
                    result.reports.append(report)
                    self._taken[sia_id] = report.time
        return result

    def _scan_entry(
        self, entry: os.DirEntry[str], specs: Mapping[str, JobSpec], result: SpoolScan
    ) -> None:
        path = Path(entry.path)
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            return  # vanished between listing and stat: next round
        version = (info.st_mtime_ns, info.st_size, info.st_ino)
        if self._versions.get(entry.name) == version:
            return
        self._versions[entry.name] = version
        try:
            report = self._validate(path, info, specs)
        except ProtocolError as exc:
            result.rejected.append(str(exc))
            return
        self._valid[report.sia_id] = report

    def _validate(
        self, path: Path, info: os.stat_result, specs: Mapping[str, JobSpec]
    ) -> MetricsReport:
        if not stat.S_ISREG(info.st_mode):
            raise ProtocolError(f"{path}: not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise ProtocolError(f"{path}: larger than {MAX_FILE_BYTES} bytes")
        sia_id = path.name[: -len(".json")]
        spec = specs.get(sia_id)
        if spec is None:
            raise ProtocolError(f"{path}: no managed job {sia_id!r} in Slurm")
        if spec.owner_uid is not None and info.st_uid != spec.owner_uid:
            raise ProtocolError(
                f"{path}: owned by uid {info.st_uid}, but job {sia_id} belongs to uid "
                f"{spec.owner_uid}"
            )
        report = read_document(MetricsReport, path)
        if report.sia_id != sia_id:
            raise ProtocolError(f"{path}: sia_id: {report.sia_id!r} does not match the file name")
        if not report.time > 0:
            raise ProtocolError(f"{path}: time: expected a positive time, got {report.time!r}")
        if report.gpu_type not in self.gpu_types:
            raise ProtocolError(
                f"{path}: gpu_type: {report.gpu_type!r} is not a configured GPU type "
                f"({', '.join(self.gpu_types)})"
            )
        if report.gpus % report.nodes:
            raise ProtocolError(
                f"{path}: gpus: {report.gpus} GPUs do not split evenly over {report.nodes} nodes"
            )
        return report


# ------------------------------------------------------------------------------------------------
# The backend's own record of resubmitted jobs


@dataclass(frozen=True)
class SlurmRecord:
    """``jobs/<sia_id>/slurm.json``: present only after a resubmission.

    ``slurm_job_id`` is the job that now carries the sia id; ``superseded`` the ids it
    replaced (cancelled, or to be cancelled); ``restart_base`` the restarts those had, added
    to Slurm's restart count of the current job.
    """

    slurm_job_id: str
    restart_base: int = 0
    superseded: tuple[str, ...] = ()

    @classmethod
    def read(cls, path: Path) -> SlurmRecord | None:
        if not path.exists():
            return None
        payload = read_json(path)
        try:
            record = cls(
                slurm_job_id=str(payload["slurm_job_id"]),
                restart_base=int(payload.get("restart_base", 0)),
                superseded=tuple(str(j) for j in payload.get("superseded", [])),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ProtocolError(f"{path}: bad backend record: {exc!r}") from None
        if record.restart_base < 0:
            raise ProtocolError(f"{path}: restart_base: expected >= 0, got {record.restart_base}")
        return record

    def write(self, path: Path) -> None:
        write_json_atomic(
            path,
            {
                "slurm_job_id": self.slurm_job_id,
                "restart_base": self.restart_base,
                "superseded": list(self.superseded),
            },
        )
