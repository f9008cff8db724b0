"""Run a benchmark with single-threaded OpenBLAS, as the CLI does (``sia_slurm/clicommon.py``).

The variable must be set before numpy loads, and a benchmark imports numpy at its top, so
:func:`single_threaded` re-executes the script with ``OPENBLAS_NUM_THREADS=1`` when it is unset.
"""

from __future__ import annotations

import os
import sys


def single_threaded() -> None:
    """Re-run this script with ``OPENBLAS_NUM_THREADS=1`` unless the variable is already set."""
    if "OPENBLAS_NUM_THREADS" not in os.environ:
        os.environ["OPENBLAS_NUM_THREADS"] = "1"
        os.execv(sys.executable, [sys.executable, *sys.argv])
