"""What the controller reads from ``scontrol show config`` (captured from the dev cluster,
Slurm 22.05.8), and the warnings ``config check --live`` derives from it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pytest

from sia_slurm.config import parse_config
from sia_slurm.service.loop import _describe
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.runner import CommandResult
from sia_slurm.slurm.slurm_conf import SlurmSettings, parse_settings

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-22.05"


def test_the_dev_clusters_config_is_read() -> None:
    settings = parse_settings((FIXTURES / "show-config.txt").read_text())
    assert settings == SlurmSettings(version="22.05.8", min_job_age_s=600, cred_expire_s=30)
    assert settings.release == "22.05"
    assert settings.warnings(round_seconds=60) == []


def test_missing_keys_are_slurms_defaults() -> None:
    assert parse_settings("") == SlurmSettings(version="", min_job_age_s=300, cred_expire_s=120)


def test_an_unverified_release_and_a_short_min_job_age_are_warned_about() -> None:
    settings = parse_settings("SLURM_VERSION = 23.11.4\nMinJobAge = 60 sec\n")
    first, second = settings.warnings(round_seconds=60)
    assert first.startswith(
        "Slurm 23.11.4 is not a release sia-slurm has verified (22.05, 24.11, 26.05)"
    )
    assert second.startswith("MinJobAge=60 s is shorter than 3 rounds (180 s)")
    assert parse_settings("").warnings(60)[0].startswith("Slurm (version not shown) is not")


class _ConfigRunner:
    """Answers ``scontrol show config`` with the captured output; records what it ran."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        self.calls.append(list(argv))
        text = (FIXTURES / "show-config.txt").read_text()
        return CommandResult(tuple(argv), 0, text.replace("600 sec", "100 sec"), "")


def test_the_loop_says_which_slurm_it_talks_to(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger("sia_slurm"), "propagate", True)
    config = parse_config(
        f"state_dir: {tmp_path}\nround_seconds: 60\n"
        "partitions:\n  t4: {gpu_type: t4, gpus_per_node: 4}\n"
    )
    runner = _ConfigRunner()
    backend = SlurmBackend(config, runner)
    with caplog.at_level(logging.INFO, logger="sia_slurm.service.loop"):
        _describe(backend)
        _describe(object())  # a backend without a description: nothing said
    said = [(r.levelname, r.getMessage()) for r in caplog.records]
    assert said[0] == ("INFO", "cluster: Slurm 22.05.8")
    assert said[1][0] == "WARNING" and "MinJobAge=100 s is shorter than 3 rounds" in said[1][1]
    assert len(said) == 2
    assert backend.actuator.calls.cred_expire() == 30 and len(runner.calls) == 1  # read once


@pytest.mark.parametrize(
    ("release", "version"), [("22.05", "22.05.8"), ("24.11", "24.11.5"), ("26.05", "26.05.5")]
)
def test_the_config_of_every_release_is_read(release: str, version: str) -> None:
    """``scontrol show config`` of each captured release (scripts/capture_slurm_fixtures.py):
    the same keys and AuthInfo form on all three."""
    path = FIXTURES.parent / f"slurm-{release}" / "show-config.txt"
    settings = parse_settings(path.read_text())
    assert settings == SlurmSettings(version=version, min_job_age_s=600, cred_expire_s=30)
    assert settings.release == release
