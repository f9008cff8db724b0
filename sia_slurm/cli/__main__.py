"""``python -m sia_slurm.cli`` runs the ``sia-slurm`` command."""

from sia_slurm.cli.main import main

main()
