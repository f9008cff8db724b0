"""Command-line interface (click). The only layer that prints.

Importing it makes OpenBLAS single-threaded (``OPENBLAS_NUM_THREADS=1`` unless the user set it),
before numpy loads: :func:`sia_slurm.clicommon.single_threaded_blas` says why. Every command, the
controller and the simulator's worker processes start here; the job side's programs
(``sia-sbatch``, ``sia-launch``) call it themselves, and ``benchmarks/blas.py`` does the same
for the benchmarks.
"""

from sia_slurm.clicommon import CONTEXT_SETTINGS, single_threaded_blas

__all__ = ["CONTEXT_SETTINGS"]

single_threaded_blas()
