"""Workloads: which training jobs arrive when, in the Sia artifact's CSV format.

One file is one workload (``data/workloads/philly/workload-1.csv``: 160 jobs over 8 hours)::

    name,time,application,num_replicas,batch_size[,category][,user][,account]

``time`` is the submission second (possibly fractional), ``application`` one of the apps with
traces (:data:`sia_slurm.sim.apps.APPS`), ``num_replicas`` and ``batch_size`` the GPUs and global
batch the user asked for, ``category`` an optional free-form label, ``user`` and ``account`` who
submitted it (what fair shares count against; empty: nobody in particular). Columns may come in
any order.

Loading fails fast with a :class:`WorkloadError` naming file, line and field, e.g.
``workload-1.csv:7: application: expected one of bert, cifar10, ..., got 'resnet'``. A workload must
be non-empty, have unique job names, and list jobs in order of non-negative submission time (the
simulator admits them in file order).
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.csvtable import CsvTableError, read_rows
from sia_slurm.sim.apps import APPS

WORKLOAD_COLUMNS = ("name", "time", "application", "num_replicas", "batch_size")
_OWNER_NAME = re.compile(r"^[A-Za-z0-9_.\-]*$")


class WorkloadError(ValueError):
    """A workload file could not be used; the message says where and why."""


@dataclass(frozen=True)
class WorkloadJob:
    """One job of a workload, as submitted."""

    name: str
    submit_time: float  # seconds since the workload started (the ``time`` column)
    application: str
    num_replicas: int
    batch_size: int
    category: str = ""
    user: str = ""
    account: str = ""


@dataclass(frozen=True)
class Workload:
    """The jobs of one workload file, in submission order."""

    path: Path
    jobs: tuple[WorkloadJob, ...]

    @property
    def name(self) -> str:
        """The file name without ``.csv`` (e.g. ``workload-1``)."""
        return self.path.stem

    def __len__(self) -> int:
        return len(self.jobs)


def load_workloads(path: Path | str, *, apps: Collection[str] = APPS) -> tuple[Workload, ...]:
    """A workload file, or every ``*.csv`` directly in a folder (sorted by file name)."""
    path = Path(path)
    if not path.is_dir():
        return (load_workload(path, apps=apps),)
    files = sorted(p for p in path.iterdir() if p.suffix == ".csv" and p.is_file())
    if not files:
        raise WorkloadError(f"{path}: expected workload files (*.csv) in the folder, found none")
    return tuple(load_workload(file, apps=apps) for file in files)


def load_workload(path: Path | str, *, apps: Collection[str] = APPS) -> Workload:
    """Read and validate one workload CSV; ``apps`` are the application names accepted."""
    path = Path(path)
    jobs: list[WorkloadJob] = []
    first_line: dict[str, int] = {}
    try:
        for lineno, row in read_rows(path, WORKLOAD_COLUMNS):
            job = _parse_job(f"{path}:{lineno}", row, apps)
            if job.name in first_line:
                raise WorkloadError(
                    f"{path}:{lineno}: name: expected a unique job name, got {job.name!r} again "
                    f"(first on line {first_line[job.name]})"
                )
            if jobs and job.submit_time < jobs[-1].submit_time:
                before = jobs[-1]
                raise WorkloadError(
                    f"{path}:{lineno}: time: expected jobs in order of submission time, got "
                    f"{row['time']} after {before.submit_time:g} (line {first_line[before.name]})"
                )
            first_line[job.name] = lineno
            jobs.append(job)
    except CsvTableError as exc:
        raise WorkloadError(str(exc)) from None
    if not jobs:
        raise WorkloadError(f"{path}: expected at least one job, got none")
    return Workload(path=path, jobs=tuple(jobs))


def _parse_job(where: str, row: dict[str, str], apps: Collection[str]) -> WorkloadJob:
    name = row["name"]
    if not name:
        raise WorkloadError(f"{where}: name: expected a job name, got an empty field")
    application = row["application"]
    if application not in apps:
        raise WorkloadError(
            f"{where}: application: expected one of {', '.join(sorted(apps))}, got {application!r}"
        )
    return WorkloadJob(
        name=name,
        submit_time=_submit_time(where, row["time"]),
        application=application,
        num_replicas=_positive_int(where, "num_replicas", row["num_replicas"]),
        batch_size=_positive_int(where, "batch_size", row["batch_size"]),
        category=row.get("category", ""),
        user=_owner_name(where, "user", row.get("user", "")),
        account=_owner_name(where, "account", row.get("account", "")),
    )


def _owner_name(where: str, field: str, text: str) -> str:
    if not _OWNER_NAME.match(text):
        raise WorkloadError(
            f"{where}: {field}: expected a name of letters, digits, '_', '.' or '-', got {text!r}"
        )
    return text


def _submit_time(where: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise WorkloadError(f"{where}: time: expected a number of seconds >= 0, got {text!r}")
    return value


def _positive_int(where: str, field: str, text: str) -> int:
    """A positive integer; ``4.0`` is accepted because the artifact writes some ints as floats."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 1 and value == int(value)):
        raise WorkloadError(f"{where}: {field}: expected a positive integer, got {text!r}")
    return int(value)
