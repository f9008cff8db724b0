"""The job side of sia-slurm: the sbatch wrapper, the torchrun launcher, training helpers."""
