"""A job's time limit over its whole life, across the runs the controller's moves make.

Slurm enforces ``--time`` per run: a requeued job starts its clock again, so a job moved twice
could run three times its limit. Before each later run starts, the controller sets the job's
``TimeLimit`` to what is left: the limit Slurm had at first sight (kept in the controller's
record, :attr:`SlurmRecord.time_limit_min`, since the controller then changes Slurm's) less
the run time of every earlier run, which Slurm accounting has (``sacct -D``, every run of
every Slurm job carrying the job's comment, :func:`sia_slurm.slurm.observe.sacct.sacct_runs`).
Slurm then ends the run at the limit itself (``TIMEOUT``). Slurm's limits are whole minutes: the
time left is rounded to the nearest minute, so the total may be off by up to 30 s a restart. A
job with nothing left is not started again: it is cancelled, which ends it for good.

Without accounting the earlier runs' time is not known reliably, and each run gets the job's
limit, as Slurm itself does (``status`` and ``config check`` say accounting is off).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from sia_slurm.slurm.observe.sacct import (
    AccountingParseError,
    AccountingReader,
    parse_run_seconds,
    sacct_runs,
)
from sia_slurm.slurm.runner import CommandError, CommandRunner


@dataclass(frozen=True)
class TimeLeft:
    """What is left of a job's limit before a run: ``seconds`` (<= 0: nothing)."""

    limit_min: int
    used_s: float

    @property
    def seconds(self) -> float:
        return self.limit_min * 60 - self.used_s

    def slurm_value(self) -> str:
        """``TimeLimit=`` in whole minutes, the time left rounded to the nearest minute (at
        least 1): Slurm keeps time limits in minutes (it rounds ``2:10`` up to 3, verified
        on 22.05), so each later run may be off by up to 30 s."""
        return str(max(math.floor(self.seconds / 60 + 0.5), 1))


def set_time_limit(job_id: str, left: TimeLeft) -> list[str]:
    return ["scontrol", "update", f"JobId={job_id}", f"TimeLimit={left.slurm_value()}"]


def cancel(job_id: str) -> list[str]:
    return ["scancel", job_id]


@dataclass
class LifeLimits:
    """Looks up the time a job has used over its runs, through ``sacct``."""

    runner: CommandRunner
    accounting: AccountingReader
    marker: str

    def left(
        self, sia_id: str, limit_min: int | None, since: float, runs_before: int
    ) -> TimeLeft | None:
        """What ``sia_id`` may still run, or None: no limit, no earlier run (the first run
        keeps Slurm's own limit), or no accounting to count the earlier runs with."""
        if limit_min is None or runs_before == 0 or not self.accounting.enabled():
            return None
        start = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(max(since - 60, 0)))
        try:
            text = self.runner.run(sacct_runs(start)).stdout
            used = parse_run_seconds(text, self.marker).get(sia_id, 0.0)
        except (CommandError, AccountingParseError):
            return None
        return TimeLeft(limit_min, used)
