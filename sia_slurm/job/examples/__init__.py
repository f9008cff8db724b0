"""Example training scripts made elastic with :mod:`sia_slurm.job.elastic` (no downloads)."""
