"""What every sia-slurm program's command line shares: the controller's (``sia_slurm.cli``) and
the job side's (``sia-sbatch``, ``sia-launch``), which must not import the controller's CLI.

:func:`single_threaded_blas` makes OpenBLAS single-threaded (``OPENBLAS_NUM_THREADS=1`` unless
the user set it): every matrix here is tiny (a handful of GPU types, a 7-parameter fit), and
OpenBLAS's worker threads only spin. On a busy 2-core machine they made each model fit
(L-BFGS-B) take ~100 ms of CPU instead of 3 ms, most of a simulated round at 2,048 GPUs
(issue 16). ``sia_slurm.cli`` calls it when imported (every ``sia-slurm`` command, the
controller, the simulator's worker processes), and so do ``sia-sbatch`` and ``sia-launch``
(whose children, ``sbatch`` and the job's workers, inherit the variable);
``benchmarks/blas.py`` does the same for the benchmarks. Importing this module has no effect.
"""

from __future__ import annotations

import os

# Every group sets these itself (not only the top-level one): click caches a command's help
# option on first use, so a group run on its own must still accept -h.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}


def single_threaded_blas() -> None:
    """``OPENBLAS_NUM_THREADS=1`` in this process's environment unless the user set it; takes
    effect for OpenBLAS when it is called before numpy loads, and for every child process."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
