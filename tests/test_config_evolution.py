"""Config files across releases (issue 37 item 5): a renamed or removed key is read with a
warning naming file, line, old and new key in the release that retired it and is an error from
the next; a file newer than this sia-slurm reads is refused saying so. The key table is
monkeypatched with retirements at the top level, in a section and under a site's own names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import sia_slurm
from sia_slurm import config_keys
from sia_slurm.cli.main import cli
from sia_slurm.config import ConfigError, parse_config
from sia_slurm.config_evolution import error_from, release, table_problems
from sia_slurm.config_keys import CONFIG_VERSION, KEYS, RETIRED, RetiredKey, reference_markdown

FILE = Path("/etc/sia-slurm/sia.yaml")
BASE = """\
state_dir: /var/lib/sia
gpu_types:
  a100: {profile: dgx}
partitions:
  gpu-a100: {gpu_type: a100, gpus_per_node: 8}
"""
TABLE = (
    RetiredKey("round_secs", "0.2.0", "round_seconds"),
    RetiredKey("restart.timeout_s", "0.2.0", "restart.checkpoint_timeout_s"),
    RetiredKey("gpu_types.<type>.profile_key", "0.2.0", "gpu_types.<type>.profile"),
    RetiredKey("slurm.poll_s", "0.2.0", None, "squeue is read once a round"),
    RetiredKey("metrics_port", "0.2.0", None, "metrics go to a textfile"),
    RetiredKey("partitions.<partition>.weight", "0.2.0", None, "the policy weighs GPU types"),
)
RETIRING_FILE = """\
state_dir: /var/lib/sia
round_secs: 30
metrics_port: 9100
gpu_types:
  a100: {profile_key: dgx}
partitions:
  gpu-a100: {gpu_type: a100, gpus_per_node: 8, weight: 2}
restart:
  timeout_s: 45
slurm:
  poll_s: 5
"""


@pytest.fixture
def retired(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(config_keys, "RETIRED", TABLE)


def at(version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sia_slurm, "__version__", version)


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, FILE)
    return [str(issue) for issue in caught.value.issues]


@pytest.mark.usefixtures("retired")
def test_in_the_release_that_retired_them_old_keys_are_read_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    at("0.2.0", monkeypatch)
    config = parse_config(RETIRING_FILE, FILE)
    assert config.round_seconds == 30
    assert config.restart.checkpoint_timeout_s == 45
    assert {g.name: g.profile for g in config.gpu_types} == {"a100": "dgx"}
    assert [str(w) for w in config.warnings] == [
        f"{FILE}:2: round_secs: warning: renamed to round_seconds in sia-slurm 0.2.0; read "
        "under its old name until 0.3.0, an error from then on: rename it",
        f"{FILE}:3: metrics_port: warning: removed in sia-slurm 0.2.0 and ignored: metrics go "
        "to a textfile; delete it (an error from 0.3.0 on)",
        f"{FILE}:5: gpu_types.a100.profile_key: warning: renamed to gpu_types.a100.profile in "
        "sia-slurm 0.2.0; read under its old name until 0.3.0, an error from then on: rename it",
        f"{FILE}:7: partitions.gpu-a100.weight: warning: removed in sia-slurm 0.2.0 and "
        "ignored: the policy weighs GPU types; delete it (an error from 0.3.0 on)",
        f"{FILE}:9: restart.timeout_s: warning: renamed to restart.checkpoint_timeout_s in "
        "sia-slurm 0.2.0; read under its old name until 0.3.0, an error from then on: rename it",
        f"{FILE}:11: slurm.poll_s: warning: removed in sia-slurm 0.2.0 and ignored: squeue is "
        "read once a round; delete it (an error from 0.3.0 on)",
    ]


@pytest.mark.usefixtures("retired")
def test_patch_releases_and_pre_releases_of_that_release_still_warn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for version in ("0.2.3", "0.2.0.dev1", "0.1.9"):
        at(version, monkeypatch)
        assert len(parse_config(RETIRING_FILE, FILE).warnings) == 6, version


@pytest.mark.usefixtures("retired")
@pytest.mark.parametrize("version", ["0.3.0", "0.3.1", "1.0.0"])
def test_from_the_next_release_old_keys_are_errors_naming_the_new_key(
    version: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    at(version, monkeypatch)
    assert errors_of(RETIRING_FILE) == [
        f"{FILE}:2: round_secs: renamed to round_seconds in sia-slurm 0.2.0 (the old name is "
        "no longer read since 0.3.0): rename it",
        f"{FILE}:3: metrics_port: removed in sia-slurm 0.2.0: metrics go to a textfile; delete it",
        f"{FILE}:5: gpu_types.a100.profile_key: renamed to gpu_types.a100.profile in "
        "sia-slurm 0.2.0 (the old name is no longer read since 0.3.0): rename it",
        f"{FILE}:7: partitions.gpu-a100.weight: removed in sia-slurm 0.2.0: the policy weighs "
        "GPU types; delete it",
        f"{FILE}:9: restart.timeout_s: renamed to restart.checkpoint_timeout_s in sia-slurm "
        "0.2.0 (the old name is no longer read since 0.3.0): rename it",
        f"{FILE}:11: slurm.poll_s: removed in sia-slurm 0.2.0: squeue is read once a round; "
        "delete it",
    ]  # each once: no "unknown key" besides


@pytest.mark.usefixtures("retired")
def test_a_moved_value_is_validated_at_its_old_line(monkeypatch: pytest.MonkeyPatch) -> None:
    at("0.2.0", monkeypatch)
    (error,) = errors_of(BASE + "restart:\n  timeout_s: -4\n")
    assert error == (
        f"{FILE}:7: restart.checkpoint_timeout_s: expected a non-negative number of seconds, got -4"
    )


@pytest.mark.usefixtures("retired")
def test_old_and_new_name_together_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    at("0.2.0", monkeypatch)
    (error,) = errors_of(BASE + "round_seconds: 60\nround_secs: 30\n")
    assert error == (
        f"{FILE}:7: round_secs: renamed to round_seconds in sia-slurm 0.2.0, which this file "
        "sets too: delete the old name"
    )


@pytest.mark.usefixtures("retired")
def test_a_rename_into_a_section_that_is_not_a_mapping_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        config_keys, "RETIRED", (RetiredKey("timeout_s", "0.2.0", "restart.checkpoint_timeout_s"),)
    )
    at("0.2.0", monkeypatch)
    errors = errors_of(BASE + "restart: 5\ntimeout_s: 30\n")
    assert (
        f"{FILE}:7: timeout_s: renamed to restart.checkpoint_timeout_s in sia-slurm 0.2.0, but "
        "restart.checkpoint_timeout_s cannot be set here"
    ) in errors


def test_a_file_of_a_newer_config_version_is_refused_saying_so() -> None:
    newer = f"config_version: {CONFIG_VERSION + 1}\n" + BASE + "future_key: 1\n"
    assert errors_of(newer) == [
        f"{FILE}:1: config_version: {CONFIG_VERSION + 1} is newer than this sia-slurm "
        f"({sia_slurm.__version__}) reads ({CONFIG_VERSION}): upgrade sia-slurm, or use a "
        f"config file written for config_version {CONFIG_VERSION}"
    ]  # and not "unknown key: future_key"


@pytest.mark.parametrize("value", ["0", "-1", "'1'", "1.5", "true"])
def test_a_bad_config_version_is_an_error(value: str) -> None:
    (error,) = errors_of(f"config_version: {value}\n" + BASE)
    assert error.startswith(f"{FILE}:1: config_version: expected an integer >= 1, got ")


def test_the_current_config_version_and_none_are_the_same() -> None:
    with_version = parse_config(f"config_version: {CONFIG_VERSION}\n" + BASE, FILE)
    assert with_version.warnings == ()
    assert with_version == parse_config(BASE, FILE)


def test_release_numbers() -> None:
    assert release("0.1.0") == (0, 1)
    assert release("1.12.3.dev4") == (1, 12)
    assert release("2.0") == (2, 0)
    with pytest.raises(ValueError, match="not a release version"):
        release("next")
    assert error_from(RetiredKey("a", "0.9.2", None)) == "0.10.0"


def test_the_retired_table_is_consistent_with_the_key_table() -> None:
    assert table_problems(RETIRED, KEYS) == []
    assert table_problems(TABLE, KEYS) == []
    bad = (
        RetiredKey("round_seconds", "0.2.0", None),
        RetiredKey("colour", "soon", "color"),
        RetiredKey("gpu_types.<type>.x", "0.2.0", "partitions.<partition>.gpu_type"),
        RetiredKey("colour", "0.2.0", None),
        RetiredKey("shares.accounts.<account>", "0.2.0", None),
    )
    assert table_problems(bad, KEYS) == [
        "round_seconds: retired, yet still a current key",
        "colour: not a release version: 'soon' (expected MAJOR.MINOR[.PATCH])",
        "colour: replaced by color, which is not a key",
        "gpu_types.<type>.x: partitions.<partition>.gpu_type names a placeholder it lacks",
        "colour: retired twice",
        "shares.accounts.<account>: retired, yet still a current key",
        "shares.accounts.<account>: a retired key must end in a fixed name",
    ]


@pytest.mark.usefixtures("retired")
def test_the_reference_lists_retired_keys() -> None:
    text = reference_markdown()
    assert "## Retired keys" in text
    assert "| `restart.timeout_s` | 0.2.0 | `restart.checkpoint_timeout_s` |" in text
    assert "| `slurm.poll_s` | 0.2.0 | removed: squeue is read once a round |" in text
    assert "| `config_version` |" in text


@pytest.mark.usefixtures("retired")
def test_config_check_prints_the_warnings_and_passes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    at("0.2.0", monkeypatch)
    path = tmp_path / "sia.yaml"
    path.write_text(BASE + "restart:\n  timeout_s: 45\n")
    result = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert result.exit_code == 0, result.output
    assert (
        f"{path}:7: restart.timeout_s: warning: renamed to restart.checkpoint_timeout_s"
        in result.output
    )
    assert result.output.splitlines()[-1] == f"{path}: OK"
    at("0.3.0", monkeypatch)
    result = CliRunner().invoke(cli, ["config", "check", str(path)])
    assert result.exit_code == 1
    assert f"{path}:7: restart.timeout_s: renamed to restart.checkpoint_timeout_s" in result.output
    assert f"{path}: 1 problem(s); configuration not usable" in result.output


@pytest.mark.usefixtures("retired")
def test_every_command_that_reads_the_file_repeats_the_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from sia_slurm.cli.controller_cmd import load_config_or_exit

    at("0.2.0", monkeypatch)
    path = tmp_path / "sia.yaml"
    path.write_text(BASE + "round_secs: 30\n")
    assert load_config_or_exit(path).round_seconds == 30
    warning = f"{path}:6: round_secs: warning: renamed to round_seconds in sia-slurm 0.2.0"
    assert capsys.readouterr().err.startswith(warning)
    load_config_or_exit(path, echo_warnings=False)  # the controller logs them instead
    assert capsys.readouterr().err == ""


@pytest.mark.usefixtures("retired")
def test_the_controller_logs_the_warnings_once_per_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.service.fakes import FakeCluster, write_config

    at("0.2.0", monkeypatch)
    config = write_config(tmp_path)
    config.write_text(config.read_text().replace("round_seconds:", "round_secs:"))
    cluster = FakeCluster(tmp_path / "cluster.json")
    log = tmp_path / "controller.log"
    result = CliRunner().invoke(
        cli,
        ["controller", "run", "--once", "--config", str(config), "--log-file", str(log)],
        obj={"backend_factory": lambda _config: cluster},
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    assert "warning" not in result.output  # in the log, not twice
    events = [json.loads(line) for line in log.read_text().splitlines()]
    (warning,) = [event for event in events if event.get("event") == "config-warning"]
    assert warning["level"] == "warning" and warning["key"] == "round_secs"
    assert warning["message"].startswith(f"{config}:")
    assert "round_secs: warning: renamed to round_seconds in sia-slurm 0.2.0" in warning["message"]
