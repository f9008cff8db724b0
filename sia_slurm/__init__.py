"""sia-slurm: the Sia scheduler (SOSP'23) for Slurm clusters."""

__version__ = "0.2.0"
