"""An early round when a profiling run's measurement arrives (docs/profiling.md).

A job profiling a new model runs on one GPU type at a time, and each type's measurement
(``jobs/<sia id>/profiled.json``) is what the controller needs before it can move the job to
the next type. Between the measurement and the next round the job only trains on a type it
will leave: on average half a round per type, a minute and a half of a 60 s controller's time
for a three-type cluster, before the job is scheduled like any other. So the systemd loop
(:func:`~sia_slurm.service.loop.run_loop`) watches the profiling jobs' measurement files
between rounds and runs the next round as soon as one is written.

The file is the user's, and a user could rewrite it every second to make the controller run a
round every second. So a job brings a round forward at most once per step of its profiling
(the types it has left to measure: a rewrite that measured nothing new, or a refused
document, changes nothing there), at most :data:`MAX_EARLY_PER_PERIOD` early rounds run
between two scheduled ones in all, and the watch looks at no more than :data:`MAX_WATCHED`
jobs. A file is only ever
``lstat``-ed, relative to the job's directory opened and checked as the job's user's
(:class:`~sia_slurm.userfiles.JobDirectory`): it is read in the round, through the user-file
door, like any other. Under cron's ``--once`` there is no loop between rounds, and no early
round.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from sia_slurm.protocol import PROFILED_FILE, ProtocolError
from sia_slurm.userfiles import JobDirectory

logger = logging.getLogger(__name__)

MAX_EARLY_PER_PERIOD = 16  # early rounds between two scheduled rounds, all jobs together
MAX_WATCHED = 64  # profiling jobs whose files are looked at between rounds
POLL_S = 1.0  # seconds between two looks

Version = tuple[int, int, int] | None  # (mtime_ns, size, inode) of the file; None: no file
# (sia id, the job user's uid, how far its profiling is: the types it has left to measure)
ProfilingJobs = Callable[[], Iterable[tuple[str, int, int]]]


def measurement_version(jobs_dir: Path, sia_id: str, uid: int) -> Version:
    """Which write of job ``sia_id``'s ``profiled.json`` is there now (``None``: none, or the
    job's directory is not one the controller reads)."""
    try:
        with JobDirectory(jobs_dir, sia_id, uid) as directory:
            info = directory.stat(PROFILED_FILE)
    except (ProtocolError, OSError):  # UserFileError is one
        return None
    return None if info is None else (info.st_mtime_ns, info.st_size, info.st_ino)


@dataclass
class MeasurementWatch:
    """Whether a profiling job has written a new measurement since the last round.

    ``profiling_jobs`` names the jobs the controller is profiling, and how far each is (it is
    asked after every round); ``version`` says which write of a job's file is there (tests
    replace it)."""

    jobs_dir: Path
    profiling_jobs: ProfilingJobs
    version: Callable[[Path, str, int], Version] = measurement_version
    _armed: dict[str, tuple[int, int, Version]] = field(default_factory=dict)
    _woken: set[tuple[str, int]] = field(default_factory=set)  # (job, step) that woke a round
    _early: int = 0  # early rounds since the last scheduled one

    def after_round(self, *, scheduled: bool) -> None:
        """Note each profiling job's file as the round left it; a scheduled round lets every
        job bring the next one forward again."""
        if scheduled:
            self._woken.clear()
            self._early = 0
        else:
            self._early += 1
        jobs = sorted(self.profiling_jobs())[:MAX_WATCHED]
        self._armed = {
            sia_id: (uid, step, self.version(self.jobs_dir, sia_id, uid))
            for sia_id, uid, step in jobs
        }

    def due(self) -> bool:
        """Whether a job wrote its measurement since the last round and may bring the next
        round forward (then it may not again at the same step of its profiling until a
        scheduled round has run)."""
        if self._early >= MAX_EARLY_PER_PERIOD:
            return False
        for sia_id, (uid, step, seen) in self._armed.items():
            if (sia_id, step) in self._woken:
                continue
            now = self.version(self.jobs_dir, sia_id, uid)
            if now is not None and now != seen:
                self._woken.add((sia_id, step))
                logger.info("job %s wrote a profiling measurement: a round now", sia_id)
                return True
        return False
