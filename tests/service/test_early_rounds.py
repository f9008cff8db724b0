"""An early round when a profiling measurement arrives (sia_slurm/service/early.py): the loop
runs it between scheduled rounds, and a user rewriting the file cannot make rounds run more
often than the bounds allow."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from sia_slurm.protocol import PROFILED_FILE
from sia_slurm.service.early import MAX_EARLY_PER_PERIOD, MeasurementWatch, measurement_version
from sia_slurm.service.journaled_round import ReconcileReport, RoundReport
from sia_slurm.service.loop import run_loop


def _job_dir(jobs: Path, sia_id: str) -> Path:
    directory = jobs / sia_id
    directory.mkdir(parents=True)
    return directory


def _write(directory: Path, text: str = "{}") -> None:
    path = directory / PROFILED_FILE
    path.write_text(text)
    stamp = time.time_ns() + len(text)  # a new mtime even within the clock's granularity
    os.utime(path, ns=(stamp, stamp))


def test_the_version_is_the_files_write_and_nothing_outside_the_users_directory(
    tmp_path: Path,
) -> None:
    jobs = tmp_path / "jobs"
    directory = _job_dir(jobs, "a")
    uid = os.getuid()
    assert measurement_version(jobs, "a", uid) is None  # no file yet
    _write(directory)
    first = measurement_version(jobs, "a", uid)
    assert first is not None
    _write(directory, "{ }")
    assert measurement_version(jobs, "a", uid) not in (None, first)
    assert measurement_version(jobs, "a", uid + 1) is None  # not the job user's directory
    assert measurement_version(jobs, "../a", uid) is None  # not a job id
    os.symlink(directory, jobs / "b")
    assert measurement_version(jobs, "b", uid) is None  # a link is never followed


def test_a_new_measurement_is_due_once_per_step_of_a_jobs_profiling(tmp_path: Path) -> None:
    """A job brings one round forward per step of its profiling (the types it has left): a
    rewrite that moved it no further (nothing new measured, or refused) waits for the
    scheduled round."""
    jobs = tmp_path / "jobs"
    dirs = {name: _job_dir(jobs, name) for name in ("a", "b")}
    left = {"a": 3, "b": 3}
    watch = MeasurementWatch(jobs, lambda: [(n, os.getuid(), left[n]) for n in ("a", "b")])
    watch.after_round(scheduled=True)
    assert not watch.due()
    _write(dirs["a"])
    assert watch.due()
    left["a"] = 2  # the early round took a's first type
    watch.after_round(scheduled=False)
    _write(dirs["a"], "{ }")  # its second type, measured: a round forward again
    assert watch.due()
    watch.after_round(scheduled=False)  # ... but this measurement was refused: still 2 left
    _write(dirs["a"], "{  }")
    assert not watch.due()
    _write(dirs["b"])
    assert watch.due()  # b's first
    watch.after_round(scheduled=True)  # a scheduled round: every step may wake one again
    _write(dirs["a"], "{   }")
    assert watch.due()


def test_early_rounds_between_two_scheduled_ones_are_bounded(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    names = [f"j{i}" for i in range(MAX_EARLY_PER_PERIOD + 2)]
    dirs = {name: _job_dir(jobs, name) for name in names}
    watch = MeasurementWatch(jobs, lambda: [(n, os.getuid(), 3) for n in names])
    watch.after_round(scheduled=True)
    early = 0
    for name in names:
        _write(dirs[name])
        if watch.due():
            early += 1
            watch.after_round(scheduled=False)
    assert early == MAX_EARLY_PER_PERIOD


class _Watch:
    """Due once, after the first round."""

    def __init__(self) -> None:
        self.rounds: list[bool] = []
        self.polls = 0

    def after_round(self, *, scheduled: bool) -> None:
        self.rounds.append(scheduled)

    def due(self) -> bool:
        self.polls += 1
        return len(self.rounds) == 1 and self.polls == 2


def test_the_loop_runs_a_round_as_soon_as_a_measurement_is_due() -> None:
    """A 60 s period: the second round comes at the watch's second look (polls of 10 ms), the
    third would be the scheduled one a minute on; the loop is stopped after the second."""
    stop = threading.Event()
    calls: list[float] = []

    def one_round() -> RoundReport:
        calls.append(time.monotonic())
        if len(calls) == 2:
            stop.set()
        return RoundReport(len(calls), False, (), (), ReconcileReport())

    watch = _Watch()
    run_loop(one_round, 60.0, stop, early=watch, poll_s=0.01)  # type: ignore[arg-type]
    assert len(calls) == 2 and calls[1] - calls[0] < 30.0
    assert watch.rounds == [True, False]  # the second round was the early one


def test_a_watch_that_raises_leaves_the_loop_on_schedule() -> None:
    stop = threading.Event()
    calls: list[float] = []

    class Broken(_Watch):
        def due(self) -> bool:
            raise OSError("EIO")

    def one_round() -> RoundReport:
        calls.append(time.monotonic())
        if len(calls) == 3:
            stop.set()
        return RoundReport(len(calls), False, (), (), ReconcileReport())

    run_loop(one_round, 0.05, stop, early=Broken(), poll_s=0.01)  # type: ignore[arg-type]
    assert len(calls) == 3
