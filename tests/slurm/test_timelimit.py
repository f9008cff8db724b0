"""Time limits over a job's whole life (issue 20): what is left after its earlier runs, as
sacct counts them, and the commands that set it or end the job."""

from __future__ import annotations

from pathlib import Path

from sia_slurm.slurm.actuate.timelimit import LifeLimits, TimeLeft, cancel, set_time_limit
from sia_slurm.slurm.observe.jobfiles import SlurmRecord
from sia_slurm.slurm.observe.managed import first_record
from sia_slurm.slurm.observe.sacct import AccountingReader, parse_run_seconds
from sia_slurm.slurm.runner import CommandResult
from tests.slurm.test_managed import slurm_job

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-22.05"


def test_time_left_in_slurm_minutes_and_seconds() -> None:
    left = TimeLeft(limit_min=3, used_s=21)
    assert left.seconds == 159
    # Whole minutes (Slurm rounds 2:39 up to 3): the nearest, at least 1 (0 means no limit).
    assert set_time_limit("17", left) == ["scontrol", "update", "JobId=17", "TimeLimit=3"]
    assert TimeLeft(3, 100).slurm_value() == "1" and TimeLeft(3, 89).slurm_value() == "2"
    assert TimeLeft(3, 179.2).slurm_value() == "1"
    assert TimeLeft(3, 200).seconds < 0 and cancel("17") == ["scancel", "17"]


def test_run_seconds_join_every_run_by_comment() -> None:
    used = parse_run_seconds((FIXTURES / "sacct-runs.txt").read_text(), "sia-slurm")
    assert used["mv-1"] == 4 + 17 + 3  # requeued run, its next run, the resubmitted job's run
    # A requeued job's run in progress has no comment in 22.05's database yet: its job's.
    running = "9|sia-slurm:x|a|u|gres/gpu=1|40|REQUEUED\n9||a|u|gres/gpu=2|5|RUNNING\n"
    assert parse_run_seconds(running, "sia-slurm") == {"x": 45}
    assert parse_run_seconds("8||a|u|gres/gpu=1|5|RUNNING\n", "sia-slurm") == {}


class Runner:
    def __init__(self, storage: str = "slurmdbd") -> None:
        self.storage = storage
        self.calls: list[list[str]] = []

    def run(self, argv: list[str], check: bool = True, **_: object) -> CommandResult:
        self.calls.append(argv)
        if argv[:3] == ["scontrol", "show", "config"]:
            text = f"AccountingStorageType = accounting_storage/{self.storage}\n"
            return CommandResult(tuple(argv), 0, text, "")
        return CommandResult(tuple(argv), 0, (FIXTURES / "sacct-runs.txt").read_text(), "")


def test_left_counts_earlier_runs_only_when_there_are_some() -> None:
    runner = Runner()
    life = LifeLimits(runner, AccountingReader(runner), "sia-slurm")  # type: ignore[arg-type]
    assert life.left("mv-1", None, 0.0, runs_before=2) is None  # no limit
    assert life.left("mv-1", 3, 0.0, runs_before=0) is None  # first run: Slurm's own limit
    assert runner.calls == []  # neither asks Slurm anything
    left = life.left("mv-1", 3, 1_795_000_000.0, runs_before=2)
    assert left == TimeLeft(3, 24.0)
    sacct = runner.calls[-1]
    assert sacct[:2] == ["sacct", "-a"] and "-D" in sacct and "-S" in sacct
    off = Runner("none")
    assert LifeLimits(off, AccountingReader(off), "sia-slurm").left("mv-1", 3, 0.0, 2) is None  # type: ignore[arg-type]


def test_the_limit_at_first_sight_is_recorded_and_kept() -> None:
    job = slurm_job(time_limit=3)  # 22.05: a plain number of minutes
    assert job.time_limit_min == 3
    record = first_record([job], 1000)
    assert record is not None and record.time_limit_min == 3


def test_record_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "slurm.json"
    SlurmRecord("5", 0, 1.0, time_limit_min=3).write(path)
    assert SlurmRecord.read(path) == SlurmRecord("5", 0, 1.0, time_limit_min=3)
    SlurmRecord("5", 0, 1.0).write(path)
    assert SlurmRecord.read(path).time_limit_min is None  # type: ignore[union-attr]
