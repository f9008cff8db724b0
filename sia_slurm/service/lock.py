"""One controller at a time: an exclusive ``flock`` on ``<state_dir>/controller.lock``.

Why: two controllers deciding on the same cluster would each issue actions against the other's
(a cron ``--once`` that outlives its minute, or a timer and a loop left running together). The
lock is taken before anything else and held for the process's life (the loop) or its one round
(``--once``); the kernel releases it when the process dies, so a crash never leaves a stale lock.
The holder's pid is written into the file for the refusal message.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path
from types import TracebackType

LOCK_FILE = "controller.lock"
EXIT_LOCKED = 75  # EX_TEMPFAIL: another controller is running; try again later


class LockHeldError(RuntimeError):
    """Another process holds the controller lock."""


class ControllerLock:
    """``with ControllerLock(state_dir):`` — raises :class:`LockHeldError` at once if held."""

    def __init__(self, state_dir: Path) -> None:
        self.path = Path(state_dir) / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _read_pid(fd)
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                who = f" (pid {holder})" if holder else ""
                raise LockHeldError(
                    f"another sia-slurm controller{who} holds {self.path}; "
                    "not starting a second one"
                ) from None
            raise
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> ControllerLock:
        self.acquire()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def _read_pid(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode(errors="replace").strip()
    except OSError:
        return ""
