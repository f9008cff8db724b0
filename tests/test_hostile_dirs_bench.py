"""benchmarks/bench_hostile_dirs.py at a tiny size: it runs, its table has its rows, and what
it counts says each lost submission once (no timing: speed goals are the benchmark's)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.bench_hostile_dirs import HOSTILE_JOBS, KINDS, measure, table

SAID = {"lost", "fifo", "symlink", "huge", "specdir"}  # an old spec.json lstat finds


def test_the_benchmark_runs_small_and_says_each_lost_submission_once(tmp_path: Path) -> None:
    rows = measure(tmp_path, jobs=6, sizes=[200], rounds=2)
    assert [(r.case, r.directories, r.jobs) for r in rows] == [
        ("honest jobs only", 0, 6),
        ("+ hostile metrics (4 jobs)", 0, 10),
        ("+ hostile dirs", 200, 10),
        ("+ hostile dirs, re-dated", 200, 10),
    ]
    assert all(len(r.later_s) == 1 for r in rows)
    lines = table(rows)
    assert len(lines) == 1 + len(rows)
    assert lines[0].split()[:3] == ["case", "dirs", "jobs"]
    assert all(line.startswith(r.case) for line, r in zip(lines[1:], rows, strict=True))
    honest, _, dirs, _ = rows
    assert (honest.first_logged, honest.later_logged) == (0, 0)
    lost = sum(KINDS[i % len(KINDS)] in SAID for i in range(200))
    assert lost <= dirs.first_logged <= lost + len(HOSTILE_JOBS)  # + the bad metrics files
    assert dirs.later_logged <= 1  # the file rewritten every ms may say something new
