"""Keep a C library's own prints off the terminal.

HiGHS, under ``scipy.optimize.milp``, writes some diagnostics with ``printf`` from its C++ code
whatever its options say (``HighsMipSolverData::transformNewIntegerFeasibleSolution
tmpSolver.run();`` in the MIP solver). Python's ``sys.stdout`` never sees them: they go straight
to file descriptors 1 and 2. :func:`captured_fds` points both at a temporary file for the length
of a call and hands back what was written, which the caller logs at debug level.

The redirection is process-wide: another thread writing to fd 1 or 2 during the call is captured
too (and logged with it). The controller and the simulator solve on their main thread.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress


@contextmanager
def captured_fds() -> Iterator[list[str]]:
    """Redirect fds 1 and 2 to a temporary file; on exit the list holds what was written."""
    text: list[str] = []
    for stream in (sys.stdout, sys.stderr):
        with suppress(AttributeError, ValueError, OSError):
            stream.flush()  # Python's buffered text must not land inside the capture
    with tempfile.TemporaryFile(mode="w+b") as sink:
        saved = [os.dup(1), os.dup(2)]
        try:
            os.dup2(sink.fileno(), 1)
            os.dup2(sink.fileno(), 2)
            yield text
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
            sink.seek(0)
            text.append(sink.read().decode("utf-8", "replace"))
