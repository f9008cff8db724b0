"""The lost-submission scan looks at a bounded number of spec files per round, from where the
last round stopped, and says each lost job with the message of its first sight."""

from __future__ import annotations

import os
from pathlib import Path

from sia_slurm.slurm.observe.jobfiles import LostSubmissions


def _lost(jobs: Path, names: list[str], written: float) -> None:
    for name in names:
        (jobs / name).mkdir(parents=True)
        spec = jobs / name / "spec.json"
        spec.write_text("{}")
        os.utime(spec, (written, written))


def test_a_bounded_scan_finds_every_lost_job_within_its_rounds(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    names = [f"job-{i}" for i in range(7)]
    _lost(jobs, names, 1000.0)
    (jobs / "known").mkdir()
    scan = LostSubmissions(jobs, budget=3)
    found = [len(scan.scan({"known"}, 5000.0, 60.0)) for _ in range(4)]
    assert found == [3, 6, 7, 7]
    whole = LostSubmissions(jobs, budget=len(names)).scan({"known"}, 5000.0, 60.0)
    assert scan.scan({"known"}, 5000.0, 60.0) == whole


def test_re_dating_a_spec_makes_no_new_message_and_a_known_id_drops_out(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    _lost(jobs, ["a", "b"], 1000.0)
    scan = LostSubmissions(jobs)
    first = scan.scan(set(), 5000.0, 60.0)
    os.utime(jobs / "a" / "spec.json", (2000.0, 2000.0))
    assert scan.scan(set(), 5000.0, 60.0) == first
    (later,) = scan.scan({"a"}, 5000.0, 60.0)  # Slurm knows "a" again
    assert later.startswith("lost submission: job b:")


def test_a_symlink_in_jobs_is_no_job_directory(tmp_path: Path) -> None:
    jobs = tmp_path / "jobs"
    _lost(jobs, ["real"], 1000.0)
    (jobs / "link").symlink_to(jobs / "real")
    (said,) = LostSubmissions(jobs).scan(set(), 5000.0, 60.0)
    assert said.startswith("lost submission: job real:")
