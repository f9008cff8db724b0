"""SlurmCalls: an ``scontrol update`` that 24.11 and 26.05 refuse with EAGAIN (no accounting
storage; sia_slurm/slurm/calls.py) is sent again; any other failure is not."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from sia_slurm.slurm.calls import UPDATE_MAX_PAUSE_S, UPDATE_PAUSE_S, UPDATE_TRIES, SlurmCalls
from sia_slurm.slurm.runner import CommandError, CommandResult

EAGAIN = "Resource temporarily unavailable for job 7\n"  # 24.11.5's exact stderr


class Refusing:
    """Fails the first ``refusals`` calls with ``stderr``, then succeeds; records argv."""

    def __init__(self, refusals: int, stderr: str = EAGAIN) -> None:
        self.refusals = refusals
        self.stderr = stderr
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        self.calls.append(list(argv))
        if len(self.calls) <= self.refusals:
            raise CommandError(argv, 1, self.stderr)
        return CommandResult(tuple(argv), 0, "done", "")


UPDATE = ["scontrol", "update", "JobId=7", "Partition=rtx"]


def test_an_update_refused_for_now_is_sent_again() -> None:
    runner = Refusing(3)
    pauses: list[float] = []
    assert SlurmCalls(runner, pauses.append).run(UPDATE) == "done"
    assert runner.calls == [UPDATE] * 4
    assert pauses == [UPDATE_PAUSE_S, 2 * UPDATE_PAUSE_S, 4 * UPDATE_PAUSE_S]  # backing off


def test_a_stale_eintr_is_sent_again_too() -> None:
    runner = Refusing(1, "Interrupted system call for job 7\n")  # 24.11.5 under load
    assert SlurmCalls(runner, lambda s: None).run(UPDATE) == "done"
    assert len(runner.calls) == 2


def test_it_gives_up_after_the_last_try() -> None:
    """The pauses outlast a busy spell of slurmctld (about 27 s in all), none over 1 s."""
    runner = Refusing(UPDATE_TRIES)
    pauses: list[float] = []
    with pytest.raises(CommandError, match="Resource temporarily unavailable"):
        SlurmCalls(runner, pauses.append).run(UPDATE)
    assert len(runner.calls) == UPDATE_TRIES
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
