"""The dev cluster is a distribution of its own (issue 36): sia-slurm-dev, ``dev/`` in the checkout.

``pip install sia-slurm`` on a site's controller host must carry no developer infrastructure
(Debian roots, chroots, the MariaDB and slurmdbd bootstrap), and the controller must import and
run without it. These tests check the three halves of that: the two distributions are released
together, the runtime works with ``sia_slurm_dev`` absent, and the runtime wheel holds none of it.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import sia_slurm

ROOT = Path(__file__).resolve().parents[1]
DEV = ROOT / "dev"

# Run in a fresh interpreter: sia_slurm_dev made unimportable, as where it is not installed
# (a finder first on sys.meta_path raises what Python raises for a missing module), then
# `sia-slurm ARGS...` as its console script runs it.
WITHOUT_DEV_PACKAGE = """
import sys

class NoDevPackage:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "sia_slurm_dev":
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoDevPackage())
from sia_slurm.cli.main import main
sys.argv = ["sia-slurm", *sys.argv[1:]]
main()
"""


def _sia_slurm_without_dev_package(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_DEV_PACKAGE, *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_the_dev_distribution_has_sia_slurms_version_and_pins_it() -> None:
    """Released together: a dev cluster of one version drives the controller of the same."""
    project = tomllib.loads((DEV / "pyproject.toml").read_text())["project"]
    assert project["name"] == "sia-slurm-dev"
    assert project["version"] == sia_slurm.__version__
    assert f"sia-slurm=={sia_slurm.__version__}" in project["dependencies"]


@pytest.mark.heavy
def test_sia_slurm_runs_without_the_dev_package() -> None:
    result = _sia_slurm_without_dev_package("--help")
    assert result.returncode == 0, result.stderr
    assert "controller" in result.stdout
    assert "pip install -e ./dev" in result.stdout  # the dev-cluster entry says what it needs


@pytest.mark.heavy
def test_dev_cluster_without_the_dev_package_says_how_to_install_it() -> None:
    """Whatever follows (``--help`` too, or ``up --spec ...``): one line, and a failure."""
    result = _sia_slurm_without_dev_package("dev-cluster", "--help", "up", "--spec", "a100:1x2")
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "sia-slurm-dev" in lines[0]
    assert "pip install -e ./dev" in lines[0]


def test_dev_cluster_with_the_dev_package_is_its_group() -> None:
    from sia_slurm.cli.main import cli
    from sia_slurm_dev.cli import dev_cluster

    assert cli.commands["dev-cluster"] is dev_cluster


def test_only_the_cli_table_of_contents_imports_the_dev_package() -> None:
    """The runtime package never needs sia_slurm_dev: only ``sia_slurm/cli/main.py`` names it,
    and there the import is guarded (the tests above run it without the package)."""
    importers = []
    for path in sorted((ROOT / "sia_slurm").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            if any(name.split(".")[0] == "sia_slurm_dev" for name in names):
                importers.append(path.relative_to(ROOT).as_posix())
    assert importers == ["sia_slurm/cli/main.py"]


# What building the wheel needs of the checkout is its sources: the rest is skipped for speed
# (and a dev cluster's or build's state, which may hold sockets).
_NOT_COPIED = {
    ".git",
    ".dev-cluster",
    ".pytest_cache",
    ".ruff_cache",
    ".venv",
    "__pycache__",
    "build",
    "dist",
    "var",
    "data",
    "docs",
    "site",
    "tests",
}


def _skipped(directory: str, names: list[str]) -> set[str]:
    return {
        name
        for name in names
        if name in _NOT_COPIED
        or name.endswith(".egg-info")
        or not (
            os.path.isdir(os.path.join(directory, name))
            or os.path.isfile(os.path.join(directory, name))
        )
    }


@pytest.mark.heavy
def test_the_runtime_wheel_carries_no_dev_cluster(tmp_path: Path) -> None:
    """Built from a copy of the checkout (dev/ included, so a packaging rule that picked it up
    would show), not in place: setuptools writes build/ and *.egg-info into the source tree."""
    source = tmp_path / "src"
    shutil.copytree(ROOT, source, ignore=_skipped)
    out = tmp_path / "wheel"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    subprocess.run(
        [*build, "--no-index", "-w", str(out), str(source)],
        check=True,
        capture_output=True,
        env=env,
        timeout=300,
    )
    (wheel,) = out.glob("sia_slurm-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        text = b"\n".join(archive.read(name) for name in names if name.endswith(".py"))
    assert "sia_slurm/cli/main.py" in names  # the wheel is the runtime's
    dev_paths = [
        name
        for name in names
        if {"devcluster", "sia_slurm_dev", "dev"} & set(name.split("/"))
        or Path(name).stem in ("slurmdbd", "devcluster_cmd")
    ]
    assert dev_paths == []
    for bootstrap in (b"mariadb-install-db", b"mariadbd", b"debootstrap"):
        assert bootstrap not in text, bootstrap
