"""Every command has a man-page-like --help; sia-sbatch refuses to submit until implemented."""

from __future__ import annotations

import click
import pytest
from click.testing import CliRunner

from sia_slurm.cli.main import cli
from sia_slurm.job.sbatch import cli as sbatch_cli


def all_commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            found += all_commands(command, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


COMMANDS = all_commands(cli)


def test_expected_commands_exist() -> None:
    for command in [
        ("config", "check"),
        ("dev-cluster", "up"),
        ("dev-cluster", "down"),
        ("dev-cluster", "status"),
        ("dev-cluster", "config"),
    ]:
        assert command in COMMANDS


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "sia-slurm")
def test_help_reads_like_a_man_page_summary(command: tuple[str, ...]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0, result.output
    usage, _, rest = result.output.partition("\n")
    assert usage.startswith(f"Usage: {' '.join(['cli', *command])}")
    description = rest.strip().split("\n\n")[0]
    assert len(description) > 20, f"no description for {command}: {result.output}"
    assert description[0].isupper()
    assert "-h, --help" in result.output


def test_top_level_help_names_the_paper_and_the_config() -> None:
    text = CliRunner().invoke(cli, ["--help"]).output
    assert "Sia scheduler (SOSP 2023)" in text
    assert "SIA_SLURM_CONFIG" in text


def test_version() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and "sia-slurm, version" in result.output


def test_config_check_ok_and_errors(tmp_path) -> None:
    runner = CliRunner()
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "etc" / "sia.yaml"
    ok = runner.invoke(cli, ["config", "check", str(example)])
    assert ok.exit_code == 0 and ok.output.splitlines()[-1] == f"{example}: OK"
    # Where the shares come from (issue 20): no shares: in the example, accounting not asked.
    assert ok.output.splitlines()[0].startswith(f"{example}: shares: equal shares per user;")
    bad = tmp_path / "bad.yaml"
    bad.write_text("state_dir: /x\nround_seconds: -1\npartitions: {a: {gpu_type: a}}\n")
    result = runner.invoke(cli, ["config", "check", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:2: round_seconds: expected a positive number of seconds, got -1" in result.output
    assert f"{bad}: 2 problem(s); configuration not usable" in result.output


def test_config_check_warns_about_a_zero_change_penalty(tmp_path) -> None:
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "etc" / "sia.yaml"
    config = tmp_path / "sia.yaml"
    config.write_text(example.read_text().replace("lambda_a: 0.01", "lambda_a: 0"))
    result = CliRunner().invoke(cli, ["config", "check", str(config)])
    assert result.exit_code == 0
    assert f"{config}: warning: policy.lambda_a is 0" in result.output
    assert f"{config}: OK" in result.output


def test_config_check_uses_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("SIA_SLURM_CONFIG", str(tmp_path / "missing.yaml"))
    result = CliRunner().invoke(cli, ["config", "check"])
    assert result.exit_code == 1
    assert f"{tmp_path / 'missing.yaml'}: file not found" in result.output


def test_dev_cluster_bad_spec_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["dev-cluster", "up", "--spec", "a100:2by4"])
    assert result.exit_code == 2
    assert "bad cluster spec part 'a100:2by4'" in result.output


def test_dev_cluster_config_passes_config_check(tmp_path) -> None:
    runner = CliRunner()
    made = runner.invoke(
        cli,
        ["dev-cluster", "config", "--spec", "a100:1x2,t4:2x4", "--state-dir", str(tmp_path / "s"),
         "--round-seconds", "6", "--dry-run"],
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    config = tmp_path / "sia.yaml"
    config.write_text(made.output)
    checked = runner.invoke(cli, ["config", "check", str(config)])
    assert checked.exit_code == 0, checked.output
    assert "t4: {gpu_type: t4, gpus_per_node: 4}" in made.output
    assert "dry_run: true" in made.output and "round_seconds: 6.0" in made.output
    bad = runner.invoke(cli, ["dev-cluster", "config", "--spec", "x", "--state-dir", "/tmp/s"])
    assert bad.exit_code == 2 and "bad cluster spec part 'x'" in bad.output


def test_sia_sbatch_needs_a_training_command(tmp_path, monkeypatch) -> None:
    """Argument errors are exit 2 with one line naming the problem (more in tests/job)."""
    from pathlib import Path

    example = Path(__file__).resolve().parent.parent / "etc" / "sia.yaml"
    config = tmp_path / "sia.yaml"
    config.write_text(example.read_text().replace("/var/lib/sia-slurm", str(tmp_path / "state")))
    monkeypatch.setenv("SIA_SLURM_CONFIG", str(config))
    result = CliRunner().invoke(sbatch_cli, ["--app", "cifar10"])
    assert result.exit_code == 2, result.output
    assert "training command" in result.output
    assert CliRunner().invoke(sbatch_cli, ["--help"]).exit_code == 0


def test_the_config_references_example_is_real_output(tmp_path, monkeypatch) -> None:
    """docs/reference/config.md shows `cat bad.yaml` and `sia-slurm config check bad.yaml`;
    both must hold."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "docs" / "reference" / "config.md").read_text()
    block = readme.split("```console\n$ cat bad.yaml\n", 1)[1].split("\n```", 1)[0]
    content, output = block.split("$ sia-slurm config check bad.yaml\n")
    (tmp_path / "bad.yaml").write_text(content)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["config", "check", "bad.yaml"])
    assert result.exit_code == 1
    assert result.output.strip() == output.strip()
