"""One version, written once (sia_slurm.__version__; pyproject.toml reads it), printed by
every program a site installs."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import sia_slurm
from sia_slurm.cli.main import cli
from sia_slurm.job.launch import cli as launch_cli
from sia_slurm.job.sbatch import cli as sbatch_cli


@pytest.mark.parametrize(
    ("name", "command"),
    [("sia-slurm", cli), ("sia-sbatch", sbatch_cli), ("sia-launch", launch_cli)],
)
def test_every_program_prints_the_one_version(name: str, command) -> None:  # type: ignore[no-untyped-def]
    result = CliRunner().invoke(command, ["--version"], prog_name=name)
    assert result.exit_code == 0, result.output
    assert result.output == f"{name}, version {sia_slurm.__version__}\n"


def test_the_version_is_written_once_and_installed_as_written() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", sia_slurm.__version__)
    pyproject = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    assert 'dynamic = ["version"]' in pyproject
    assert not re.search(r'^version = "', pyproject, re.M)  # written nowhere else
    assert importlib.metadata.version("sia-slurm") == sia_slurm.__version__
