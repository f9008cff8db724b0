"""``sia-sbatch``: submit a training job that the sia-slurm controller manages.

Placeholder until the job-side issue delivers the wrapper (issue 7): it refuses to submit
rather than submitting an unmanaged job.
"""

from __future__ import annotations

import click


@click.command(
    context_settings={"ignore_unknown_options": True, "help_option_names": ["-h", "--help"]},
    help="""Submit a training job managed by the sia-slurm controller.

\b
Not implemented yet: this release ships the controller-side foundation
only. Submit with sbatch directly until sia-sbatch lands.
""",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def cli(args: tuple[str, ...]) -> None:
    click.echo("sia-sbatch: not implemented yet (see issue 7); nothing was submitted", err=True)
    raise SystemExit(2)


def main() -> None:
    cli()
