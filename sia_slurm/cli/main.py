"""``sia-slurm``: the administrator's and controller's command.

Each subcommand lives in its own module under ``sia_slurm.cli`` and is registered here, so this
file reads as the table of contents of the tool.
"""

from __future__ import annotations

import click

from sia_slurm import __version__
from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.config_cmd import config
from sia_slurm.cli.controller_cmd import controller
from sia_slurm.cli.devcluster_cmd import dev_cluster
from sia_slurm.cli.explain_cmd import explain
from sia_slurm.cli.profile_cmd import profile
from sia_slurm.cli.report_cmd import report_command
from sia_slurm.cli.setup_cmd import setup_command
from sia_slurm.cli.simulate_cmd import simulate_command
from sia_slurm.cli.status_cmd import status
from sia_slurm.service.logs import configure_text_logging

HELP = """\
Heterogeneity-aware, goodput-optimized scheduling of deep-learning jobs on Slurm.

\b
sia-slurm implements the Sia scheduler (SOSP 2023) for Slurm clusters with one
partition per GPU type. Every round a controller observes the cluster and the
managed jobs, estimates each job's goodput on every GPU type and count, solves
Sia's allocation program and actuates the decision with scontrol.

\b
Configuration is read from the file given with --config or with the
SIA_SLURM_CONFIG environment variable; etc/sia.yaml is a commented example.
Run "sia-slurm COMMAND --help" for the options of each command.
"""


@click.group(help=HELP, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="sia-slurm")
def cli() -> None:
    pass


cli.add_command(config)
cli.add_command(controller)
cli.add_command(dev_cluster)
cli.add_command(explain)
cli.add_command(profile)
cli.add_command(report_command)
cli.add_command(setup_command)
cli.add_command(status)
cli.add_command(simulate_command)


def main() -> None:
    configure_text_logging()  # warnings as escaped text; `controller run` switches to JSON
    cli()
