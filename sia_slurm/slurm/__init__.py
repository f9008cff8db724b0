"""Everything that talks to Slurm: the command runner, output parsers, the dev cluster."""
