"""What the controller reads from ``scontrol show config`` (captured from the dev cluster,
Slurm 22.05.8), and the warnings ``config check --live`` derives from it."""

from __future__ import annotations

from pathlib import Path

from sia_slurm.slurm.settings import SlurmSettings, parse_settings

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
    assert first.startswith("Slurm 23.11.4 is not a release sia-slurm has verified (22.05)")
    assert second.startswith("MinJobAge=60 s is shorter than 3 rounds (180 s)")
    assert parse_settings("").warnings(60)[0].startswith("Slurm (version not shown) is not")
