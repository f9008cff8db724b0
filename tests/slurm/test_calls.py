"""SlurmCalls: an ``scontrol update`` that 24.11 and 26.05 refuse with a stale errno (no
accounting storage; sia_slurm/slurm/actuate/calls.py) is sent again, as copies at once after the
first refusal; any other failure is not."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import pytest

from sia_slurm.slurm.actuate.calls import (
    UPDATE_COPIES,
    UPDATE_MAX_PAUSE_S,
    UPDATE_PAUSE_S,
    UPDATE_TRIES,
    SlurmCalls,
)
from sia_slurm.slurm.runner import CommandError, CommandResult

EAGAIN = "Resource temporarily unavailable for job 7\n"  # 24.11.5's exact stderr


class Refusing:
    """Fails the first ``refusals`` calls with ``stderr``, then succeeds; records argv. Copies
    come from several threads at once: the count is kept under a lock."""

    def __init__(self, refusals: int, stderr: str = EAGAIN) -> None:
        self.refusals = refusals
        self.stderr = stderr
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        with self._lock:
            self.calls.append(list(argv))
            refuse = len(self.calls) <= self.refusals
        if refuse:
            raise CommandError(argv, 1, self.stderr)
        return CommandResult(tuple(argv), 0, "done", "")


class Answers:
    """Answers the n-th call (from 1) with ``stderrs[n - 1]`` (an exit 1), or success past
    the list."""

    def __init__(self, *stderrs: str) -> None:
        self.stderrs = stderrs
        self.calls = 0
        self._lock = threading.Lock()

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        with self._lock:
            self.calls += 1
            n = self.calls
        if n <= len(self.stderrs) and self.stderrs[n - 1]:
            raise CommandError(argv, 1, self.stderrs[n - 1])
        return CommandResult(tuple(argv), 0, "done", "")


UPDATE = ["scontrol", "update", "JobId=7", "Partition=rtx"]


def test_an_update_refused_for_now_is_sent_again_as_copies_at_once() -> None:
    """After the first refusal each try sends UPDATE_COPIES copies; one taken copy is enough."""
    runner = Refusing(1 + UPDATE_COPIES + UPDATE_COPIES - 1)  # the third try's last copy is taken
    pauses: list[float] = []
    assert SlurmCalls(runner, pauses.append).run(UPDATE) == "done"
    assert runner.calls == [UPDATE] * (1 + 2 * UPDATE_COPIES)
    assert pauses == [UPDATE_PAUSE_S, 2 * UPDATE_PAUSE_S]  # backing off


def test_a_stale_eintr_is_sent_again_too() -> None:
    runner = Refusing(1, "Interrupted system call for job 7\n")  # 24.11.5 under load
    assert SlurmCalls(runner, lambda s: None).run(UPDATE) == "done"
    assert len(runner.calls) == 1 + UPDATE_COPIES


def test_a_taken_copy_wins_over_a_copy_that_failed_otherwise() -> None:
    """One copy moved the job, another met a real refusal: the update was made."""
    runner = Answers(EAGAIN, "Invalid job id specified\n", EAGAIN, "")
    assert SlurmCalls(runner, lambda s: None).run(UPDATE) == "done"


def test_a_copy_that_fails_otherwise_is_the_answer_when_none_was_taken() -> None:
    runner = Answers(EAGAIN, EAGAIN, "Job is no longer pending execution for job 7\n", EAGAIN)
    with pytest.raises(CommandError, match="no longer pending"):
        SlurmCalls(runner, lambda s: None).run(UPDATE)
    assert runner.calls == 1 + UPDATE_COPIES  # no further try


def test_it_gives_up_after_the_last_try() -> None:
    """The pauses outlast a busy spell of slurmctld (about 27 s in all), none over 1 s."""
    runner = Refusing(1 + (UPDATE_TRIES - 1) * UPDATE_COPIES)
    pauses: list[float] = []
    with pytest.raises(CommandError, match="Resource temporarily unavailable"):
        SlurmCalls(runner, pauses.append).run(UPDATE)
    assert len(runner.calls) == 1 + (UPDATE_TRIES - 1) * UPDATE_COPIES
    assert len(pauses) == UPDATE_TRIES - 1
    assert max(pauses) == UPDATE_MAX_PAUSE_S and 20 < sum(pauses) < 30


@pytest.mark.parametrize(
    ("argv", "stderr"),
    [
        (UPDATE, "Job is no longer pending execution for job 7\n"),
        (["scontrol", "release", "7"], EAGAIN),  # only updates are known to do it
    ],
)
def test_other_failures_are_not_retried(argv: list[str], stderr: str) -> None:
    runner = Refusing(1, stderr)
    with pytest.raises(CommandError):
        SlurmCalls(runner, lambda s: None).run(argv)
    assert len(runner.calls) == 1
