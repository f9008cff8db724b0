"""Parsing Slurm accounting's output (captured from 22.05 with the dev cluster's accounting,
tests/fixtures/slurm-22.05/sacctmgr-*.txt; 24.11 and 26.05 by
scripts/capture_accounting_fixtures.py, the same shapes) and turning it into shares and GPU
limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from sia_slurm.policy.shares import JobOwner
from sia_slurm.policy.site_accounting import SiteAccounting
from sia_slurm.slurm.observe.sacct import (
    AccountingParseError,
    AccountingReader,
    accounting_enabled,
    gpu_count,
    parse_associations,
    parse_gpu_hours,
    parse_qos,
    typed_gpu_counts,
)
from sia_slurm.slurm.runner import CommandResult

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-22.05"
RELEASES = ("22.05", "24.11", "26.05")


def site(release: str = "22.05") -> SiteAccounting:
    fixtures = FIXTURES.parent / f"slurm-{release}"
    return SiteAccounting(
        parse_associations((fixtures / "sacctmgr-assoc.txt").read_text()),
        parse_qos((fixtures / "sacctmgr-qos.txt").read_text()),
    )


def test_gpu_count_reads_untyped_gpus_only() -> None:
    assert gpu_count("gres/gpu=4") == 4
    assert gpu_count("cpu=2,gres/gpu=12,node=1") == 12
    assert gpu_count("gres/gpu:a100=2") is None
    assert gpu_count("") is None


@pytest.mark.parametrize("release", RELEASES)
def test_captured_associations_and_qos(release: str) -> None:
    accounting = site(release)
    rows = {(a.account, a.user): a for a in accounting.associations}
    assert rows[("biology", "")].grp_gpus == 4 and rows[("biology", "")].parent == "root"
    assert rows[("physics", "")].share == 2
    assert rows[("physics", "root")].max_gpus_per_job == 8
    assert rows[("physics", "root")].qos == ("normal", "short")
    assert accounting.qos["short"].gpus_per_user == 6
    assert accounting.qos["short"].gpus_per_job == 4
    assert accounting.qos["normal"].grp_gpus is None
    assert accounting.ancestors("biology") == ["biology", "root"]


def test_association_shares_become_the_policy_shares() -> None:
    shares = site().shares()
    assert shares.account_share("physics") == 2 and shares.account_share("biology") == 1
    assert shares.account_of("root", "biology") == "biology"  # the job's own Slurm account


def test_limits_over_live_jobs() -> None:
    owners = [
        JobOwner("b1", "root", "biology", "normal"),
        JobOwner("b2", "root", "biology", "short"),
        JobOwner("p1", "root", "physics", "short"),
    ]
    limits = {limit.name: limit for limit in site().limits(owners)}
    assert limits["account biology GrpTRES"].gpus == 4
    assert limits["account biology GrpTRES"].job_ids == {"b1", "b2"}
    assert limits["job b1 MaxTRESPerJob"].gpus == 8  # the user association's
    assert limits["job b2 MaxTRESPerJob"].gpus == 4  # QOS short's is tighter
    assert limits["qos short MaxTRESPerUser root"].job_ids == {"b2", "p1"}
    assert limits["qos short MaxTRESPerUser root"].gpus == 6
    assert not any(name.startswith("account physics") for name in limits)


def test_typed_limits_are_read_per_type() -> None:
    assert typed_gpu_counts("gres/gpu=4,gres/gpu:t4=3,gres/gpu:a100=2") == (
        ("a100", 2),
        ("t4", 3),
    )
    assert typed_gpu_counts("cpu=2,gres/gpu=4") == ()
    # Shaped as the 22.05 fixture's rows, with typed TRES as sacctmgr prints them.
    accounting = SiteAccounting(
        parse_associations(
            "siadev|biology||root|1|gres/gpu=4,gres/gpu:a100=2||normal\n"
            "siadev|biology|root||1||gres/gpu:a100=1|big\n"
        ),
        parse_qos("big|gres/gpu:t4=5|gres/gpu:a100=3|gres/gpu:a100=2,gres/gpu:t4=4\n"),
    )
    owners = [JobOwner("b1", "root", "biology", "big"), JobOwner("b2", "root", "biology", "")]
    limits = {limit.name: limit for limit in accounting.limits(owners)}
    assert limits["account biology GrpTRES"].gpu_type is None
    assert limits["account biology GrpTRES"].gpus == 4
    grp = limits["account biology GrpTRES a100"]
    assert (grp.gpus, grp.gpu_type, grp.job_ids) == (2, "a100", {"b1", "b2"})
    assert limits["job b1 MaxTRESPerJob a100"].gpus == 1  # the user's, under QOS big's 2
    assert limits["job b1 MaxTRESPerJob t4"].gpus == 4  # QOS big's
    assert limits["qos big GrpTRES t4"].gpus == 5
    assert limits["qos big MaxTRESPerUser root a100"].gpus == 3
    assert limits["job b2 MaxTRESPerJob a100"].job_ids == {"b2"}  # no QOS: the association's


def test_bad_output_is_quoted() -> None:
    with pytest.raises(AccountingParseError, match="expected 8"):
        parse_associations("siadev|physics\n")
    with pytest.raises(AccountingParseError, match="Share 'lots'"):
        parse_associations("siadev|a|||lots|||\n")


class Runner:
    """Answers show config and sacctmgr from the fixtures; counts calls."""

    def __init__(self, storage: str) -> None:
        self.storage = storage
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], check: bool = True, **_: object) -> CommandResult:
        self.calls.append(argv)
        if argv[:3] == ["scontrol", "show", "config"]:
            out = f"AccountingStorageType   = accounting_storage/{self.storage}\n"
        elif "assoc" in argv:
            out = (FIXTURES / "sacctmgr-assoc.txt").read_text()
        else:
            out = (FIXTURES / "sacctmgr-qos.txt").read_text()
        return CommandResult(argv, 0, out, "")


def test_reader_reads_every_few_minutes_and_not_without_accounting() -> None:
    assert accounting_enabled("AccountingStorageType   = accounting_storage/slurmdbd")
    assert not accounting_enabled("AccountingStorageType   = accounting_storage/none")
    runner = Runner("slurmdbd")
    reader = AccountingReader(runner, refresh_s=300)  # type: ignore[arg-type]
    first = reader.read(0.0)
    assert first is not None and reader.read(100.0) is first
    assert len(runner.calls) == 3  # config once, assoc and qos once
    reader.read(400.0)
    assert len(runner.calls) == 5
    off = Runner("none")
    assert AccountingReader(off).read(0.0) is None  # type: ignore[arg-type]
    assert len(off.calls) == 1


def test_sacct_runs_of_one_sia_job_are_joined_by_comment() -> None:
    hours = parse_gpu_hours((FIXTURES / "sacct-runs.txt").read_text(), "sia-slurm")
    # mv-1: 2 GPUs for 4 s (requeued), 2 GPUs for 17 s, then resubmitted as job 2: 1 GPU, 3 s.
    assert hours["mv-1"] == pytest.approx((2 * 4 + 2 * 17 + 1 * 3) / 3600)
    assert hours["b1"] == pytest.approx(4 * 30 / 3600)
    assert "other" not in hours and set(hours) == {"b1", "b2", "mv-1"}
    with pytest.raises(AccountingParseError, match="ElapsedRaw"):
        parse_gpu_hours("1|sia-slurm:x|a|u|gres/gpu=1|soon|RUNNING\n", "sia-slurm")


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_sacct_runs_of_later_releases_parse_alike(release: str) -> None:
    """A requeued run keeps its row (REQUEUED) and its comment on 24.11 and 26.05 too."""
    text = (FIXTURES.parent / f"slurm-{release}" / "sacct-runs.txt").read_text()
    rows = [line.split("|") for line in text.splitlines()]
    hours = parse_gpu_hours(text, "sia-slurm")
    assert set(hours) == {"b1", "mv-1"}
    moved = [r for r in rows if r[1] == "sia-slurm:mv-1"]
    assert [r[-1] for r in moved] == ["REQUEUED"]
    assert hours["mv-1"] == pytest.approx(2 * int(moved[0][5]) / 3600)
