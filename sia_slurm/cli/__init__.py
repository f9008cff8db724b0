"""Command-line interface (click). The only layer that prints.

Importing it makes OpenBLAS single-threaded (``OPENBLAS_NUM_THREADS=1`` unless the user set it),
before numpy loads: every matrix here is tiny (a handful of GPU types, a 7-parameter fit), and
OpenBLAS's worker threads only spin. On a busy 2-core machine they made each model fit
(L-BFGS-B) take ~100 ms of CPU instead of 3 ms, most of a simulated round at 2,048 GPUs
(issue 16). Every command, the controller, the simulator's worker processes and ``sia-launch``
start here; ``benchmarks/blas.py`` does the same for the benchmarks.
"""

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

# Every group sets these itself (not only the top-level one): click caches a command's help
# option on first use, so a group run on its own must still accept -h.
CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
