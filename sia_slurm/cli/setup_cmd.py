"""``sia-slurm setup``: create the state directory's tree with its owners and modes."""

from __future__ import annotations

import os
import pwd
from pathlib import Path

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.controller_cmd import CONFIG_OPTION, fail, load_config_or_exit
from sia_slurm.state.tree import check, set_up


@click.command(
    "setup",
    context_settings=CONTEXT_SETTINGS,
    help="""Create the controller's state tree, owned by its service account.

\b
STATE_DIR (0755), STATE_DIR/control (0755): the service account's;
STATE_DIR/jobs (1777, sticky like /tmp): where sia-sbatch makes each
job's directory, owned by the job's user. An existing tree gets these
owners and modes. Run as root (or as the account itself). The controller
refuses to start on a tree that others could rewrite; docs/operations.md.
""",
)
@CONFIG_OPTION
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="The state directory [default: the configuration's state_dir].",
)
@click.option(
    "--user",
    "user",
    default=None,
    help="The controller's service account [default: the invoking user].",
)
def setup_command(config_path: Path | None, state_dir: Path | None, user: str | None) -> None:
    if state_dir is None:
        state_dir = load_config_or_exit(config_path).state_dir
    try:
        account = pwd.getpwnam(user) if user else pwd.getpwuid(os.geteuid())
    except KeyError:
        fail(f"--user: no such account {user!r} (create it with `useradd --system {user}`)")
    try:
        done = set_up(Path(state_dir).absolute(), account.pw_uid, account.pw_gid)
    except OSError as exc:
        fail(f"{state_dir}: {exc.strerror or exc} (run as root, or as {account.pw_name})")
    for line in done:
        click.echo(line)
    problems = check(Path(state_dir).absolute(), account.pw_uid)
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    click.echo(f"{state_dir}: ready for the controller as {account.pw_name}")
