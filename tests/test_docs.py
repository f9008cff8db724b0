"""The README stays a front door, and the reference pages cover the code they are made from.

The site itself is built with ``mkdocs build --strict`` in scripts/test.sh (broken links, pages
missing from the nav); these tests check what a build cannot: the README's size and contents,
and that the generated references name every command, option and key.
"""

from __future__ import annotations

import re
from pathlib import Path

import click

from sia_slurm.cli.main import cli
from sia_slurm.cli.reference import reference_markdown
from sia_slurm.config_keys import KEYS
from sia_slurm.job.sbatch import cli as sbatch_cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_at_most_250_lines_with_no_run_log() -> None:
    assert len(README.splitlines()) <= 250
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", README), "dated tallies go into docs/results/"
    assert not re.search(r"`[0-9a-f]{7,40}`", README), "commit hashes go into docs/results/"
    assert max(len(line) for line in README.splitlines()) <= 250


def test_every_readme_link_to_a_file_finds_it() -> None:
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README):
        if "://" not in target:
            assert (ROOT / target).exists(), target


def test_every_docs_page_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    for page in (ROOT / "docs").rglob("*.md"):
        assert page.relative_to(ROOT / "docs").as_posix() in nav, page


def _commands(group: click.Group, path: tuple[str, ...]) -> list[tuple[str, ...]]:
    found = []
    for name, command in group.commands.items():
        found.append((*path, name))
        if isinstance(command, click.Group):
            found += _commands(command, (*path, name))
    return found


def test_the_cli_reference_has_every_command_and_option() -> None:
    text = reference_markdown([("sia-slurm", cli), ("sia-sbatch", sbatch_cli)])
    commands = _commands(cli, ("sia-slurm",))
    assert ("sia-slurm", "controller", "run") in commands
    for path in commands:
        assert f"`{' '.join(path)}`" in text, path
    for option in ["--max-gpus", "--batch-size", "--restart-cost", "--dry-run", "--once"]:
        assert f"`{option}" in text or f", {option}" in text, option


def test_the_config_reference_page_is_generated_from_the_key_table() -> None:
    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    assert "<!-- generated: config -->" in page
    assert len(KEYS) > 40
