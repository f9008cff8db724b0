"""mkdocs hook: fills the reference pages from the code at build time.

A page that holds ``<!-- generated: cli -->`` gets the command-line reference rendered from the
click commands (:mod:`sia_slurm.cli.reference`), ``<!-- generated: config -->`` every config key
from the loader's table (:mod:`sia_slurm.config_keys`). ``mkdocs build --strict`` runs in
``scripts/test.sh``, so a page and the code cannot disagree on what a command or key is.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

# The checkout these pages document, before any installed copy of the package, and its dev
# package (dev/: `sia-slurm dev-cluster` is documented too); imported while mkdocs loads this
# hook (it restores sys.path afterwards).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dev"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from sia_slurm import config_keys
from sia_slurm.cli import reference
from sia_slurm.cli.main import cli
from sia_slurm.job.launch import cli as launch_cli
from sia_slurm.job.sbatch import cli as sbatch_cli

MARKERS = ("<!-- generated: cli -->", "<!-- generated: config -->")


def cli_reference() -> str:
    """Every command of the three programs a site installs, as Markdown."""
    return reference.reference_markdown(
        [("sia-slurm", cli), ("sia-sbatch", sbatch_cli), ("sia-launch", launch_cli)]
    )


def on_page_markdown(markdown: str, **_: Any) -> str:
    if MARKERS[0] in markdown:
        markdown = markdown.replace(MARKERS[0], cli_reference())
    if MARKERS[1] in markdown:
        markdown = markdown.replace(MARKERS[1], config_keys.reference_markdown())
    return markdown
