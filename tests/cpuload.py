"""Both cores busy, as on a loaded CI machine: where Slurm's races were seen."""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager


def _spin(seconds: float) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not a handler inherited from the suite
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        pass


@contextmanager
def busy_cores(count: int = 2, seconds: float = 600.0) -> Iterator[None]:
    """``count`` processes spinning for at most ``seconds``, killed on the way out."""
    spinners = [multiprocessing.Process(target=_spin, args=(seconds,)) for _ in range(count)]
    for spinner in spinners:
        spinner.start()
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.join()
