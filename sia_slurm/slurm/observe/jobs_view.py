"""The view of the jobs one queue read gives: every Slurm job, the managed ones resolved per
sia id (:mod:`sia_slurm.slurm.observe.managed`), and what kept a job from being managed.

Built by :func:`build_view` from the jobs of one ``squeue --json`` (or of pyslurm), for the
snapshot and for the actuator, which asks for a fresh view while it acts
(``SlurmBackend.observe_jobs``). Here rather than in :mod:`sia_slurm.slurm.backend`, so the
actuating side reads the view without importing the backend that composes it.
"""

from __future__ import annotations

import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from sia_slurm.config import SiaConfig
from sia_slurm.protocol import ProtocolError, StatePaths
from sia_slurm.slurm.observe.jobfiles import RecordBook
from sia_slurm.slurm.observe.jsonparse import SlurmJob
from sia_slurm.slurm.observe.managed import (
    ManagedJob,
    first_record,
    foreign_jobs,
    group_managed,
    resolve,
)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobsView:
    """All Slurm jobs of one ``squeue``, split into managed (by sia id) and the rest."""

    jobs: tuple[SlurmJob, ...]
    managed: Mapping[str, ManagedJob]
    problems: tuple[str, ...] = ()
    identity: tuple[str, ...] = ()  # jobs refused as managed, and why
    # sia ids some Slurm job carries or the controller has a record of (managed or not)
    known_ids: frozenset[str] = frozenset()

    @property
    def strays(self) -> list[SlurmJob]:
        return [stray for job in self.managed.values() for stray in job.strays]


class ViewSource(Protocol):
    """What :func:`build_view` reads of the backend (a ``SlurmBackend``)."""

    config: SiaConfig
    paths: StatePaths
    records: RecordBook


def build_view(backend: ViewSource, jobs: tuple[SlurmJob, ...], problems: list[str]) -> JobsView:
    """Split ``jobs`` into managed (resolved per sia id, see :mod:`managed`) and the rest."""
    for problem in problems:
        logger.warning("%s", problem)
    identity: list[str] = []
    records = backend.records.load(identity)
    known = {record.slurm_job_id: sia_id for sia_id, record in records.items()}
    managed = {}
    groups = group_managed(jobs, backend.config.managed_marker, known)
    for sia_id, group in groups.items():
        record = records.get(sia_id)
        first_sight = record is None
        if record is None:
            record = first_record(group, _directory_owner(backend.paths, sia_id))
            if record is None:
                live = [j.job_id for j in group if not j.finished]
                if live:
                    identity.append(
                        f"job {sia_id}: not scheduled: Slurm job(s) {', '.join(live)} carry it, "
                        f"but {backend.paths.jobs_dir / sia_id} is not a directory of their user"
                    )
                continue
        for job in foreign_jobs(group, record):
            identity.append(
                f"job {sia_id}: Slurm job {job.job_id} of uid {job.user_id} carries the sia id "
                f"of uid {record.user_id}'s job: not managed, its GPUs count as taken"
            )
        job = resolve(sia_id, group, record)
        if job is not None:
            managed[sia_id] = replace(job, first_sight=first_sight)
    known_ids = frozenset(groups) | frozenset(records)
    return JobsView(jobs, managed, tuple(problems), tuple(identity), known_ids)


def _directory_owner(paths: StatePaths, sia_id: str) -> int | None:
    """The uid owning ``jobs/<sia_id>/`` (a real directory), ``None`` if there is none."""
    try:
        info = os.stat(paths.job_dir(sia_id), follow_symlinks=False)
    except (OSError, ProtocolError):
        return None
    return info.st_uid if stat.S_ISDIR(info.st_mode) else None
