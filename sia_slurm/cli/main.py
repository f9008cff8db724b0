"""``sia-slurm``: the administrator's and controller's command.

Each subcommand lives in its own module under ``sia_slurm.cli`` and is registered here, so this
file reads as the table of contents of the tool. ``dev-cluster`` is the one exception: it lives in
the developer distribution sia-slurm-dev (``sia_slurm_dev.cli``), which a site's controller host
does not install, and is added here only when that package is importable.
"""

from __future__ import annotations

import click

from sia_slurm import __version__
from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.config_cmd import config
from sia_slurm.cli.controller_cmd import controller
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


# What `sia-slurm dev-cluster ...` says where sia-slurm-dev is not installed.
DEV_CLUSTER_MISSING = (
    "the dev cluster is not installed here: it is the separate package sia-slurm-dev "
    "(from a checkout: pip install -e ./dev)"
)


def _dev_cluster_command() -> click.Command:
    """``sia_slurm_dev``'s ``dev-cluster`` group, or where it is not installed a stand-in that
    says how to install it and fails. The dev cluster (Debian roots, chroots, the MariaDB and
    slurmdbd bootstrap) is developer infrastructure: a controller host runs without it, so its
    absence must not break this command's import. Any other import error in it is a bug and
    propagates."""
    try:
        from sia_slurm_dev.cli import dev_cluster
    except ModuleNotFoundError as exc:
        if exc.name != "sia_slurm_dev":
            raise
    else:
        return dev_cluster

    @click.command(
        "dev-cluster",
        # every argument, --help included, reaches the stand-in, which fails with the hint
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        short_help="Run a dev cluster (needs sia-slurm-dev: pip install -e ./dev).",
    )
    def missing_dev_cluster() -> None:
        raise click.ClickException(DEV_CLUSTER_MISSING)

    return missing_dev_cluster


@click.group(help=HELP, context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="sia-slurm")
def cli() -> None:
    pass


cli.add_command(config)
cli.add_command(controller)
cli.add_command(_dev_cluster_command())
cli.add_command(explain)
cli.add_command(profile)
cli.add_command(report_command)
cli.add_command(setup_command)
cli.add_command(status)
cli.add_command(simulate_command)


def main() -> None:
    configure_text_logging()  # warnings as escaped text; `controller run` switches to JSON
    cli()
