"""The clock: wall time and sleeping, injectable so tests need not wait.

One for the whole controller: the Slurm backend sleeps on it while it polls Slurm, the
service's rounds stamp the journal and the round's time with it, the loop times the next
round by it. Unit tests pass a fake one."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds since the epoch, and a way to wait (both faked in unit tests)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class WallClock:
    """The real clock."""

    def now(self) -> float:
        return time.time()

    def sleep(self, seconds: float) -> None:
        time.sleep(max(seconds, 0.0))


WALL_CLOCK = WallClock()
