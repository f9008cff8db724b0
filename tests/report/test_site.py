"""The static dashboard, rendered and loaded in headless Chromium (Debian's package).

Chromium is installed by scripts/install.sh; if it is missing this test fails (it is never
skipped), because the dashboard is only known to work once a real browser ran its script.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from sia_slurm.report import GpuTypeTotal, JobRow, ReportData, RoundPoint, Segment, render_site


def chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path is None:
        pytest.fail("chromium not found: run scripts/install.sh (apt-get install chromium)")
    return path


def run_chromium(*args: str) -> subprocess.CompletedProcess[str]:
    command = [
        chromium(),
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--enable-logging=stderr",
        "--v=0",
        *args,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)


def sample(jobs: int = 5) -> ReportData:
    rows = []
    for i in range(jobs):
        done = i % 2 == 0
        rows.append(
            JobRow(
                id=f"job-{i}",
                app="cifar10" if done else "bert",
                state="done" if done else "running",
                submit_time=60.0 * i,
                gpu_type="a100" if done else "t4",
                gpus=2 * (i + 1),
                batch_size=256,
                goodput_predicted=100.0 + i,
                goodput_measured=90.0 + i if done else None,
                restarts=i,
                finish_time=600.0 + 60 * i if done else None,
                jct_s=600.0 if done else None,
                segments=(Segment(60.0 * i, 60.0 * i + 300, "t4", 1),),
            )
        )
    rounds = tuple(
        RoundPoint(r, 60.0 * r, {"a100": r % 8, "t4": 3}, {"a100": 8, "t4": 8}, 4.0 + r, 3, 2)
        for r in range(12)
    )
    return ReportData(
        title="Test report",
        subtitle="synthetic",
        gpu_types=(GpuTypeTotal("a100", 8), GpuTypeTotal("t4", 8)),
        rounds=rounds,
        jobs=tuple(rows),
        summary=(("jobs", str(jobs)), ("avg JCT (h)", "0.17")),
    )


@pytest.mark.heavy
def test_site_loads_without_console_errors(tmp_path: Path) -> None:
    index = render_site(sample(5), tmp_path / "site")
    # A data file written before jobs had accounted GPU-hours (the field absent, not null)
    # renders as a report without accounting: no sacct column.
    data_js = index.parent / "data.js"
    old = data_js.read_text().replace(',"accounted_gpu_hours":null', "")
    assert "accounted_gpu_hours" not in old
    data_js.write_text(old)
    # One launch both dumps the DOM and takes the screenshot (a launch is ~1 s of CPU).
    screenshot = tmp_path / "shot.png"
    result = run_chromium(
        "--window-size=1250,1800", f"--screenshot={screenshot}", "--dump-dom", index.as_uri()
    )
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert 'data-rendered="yes"' in dom, "app.js did not finish rendering"
    assert dom.count('class="job-row"') == 5
    assert len(re.findall(r'class="alloc-area"', dom)) == 2  # one area per GPU type
    assert dom.count('class="segment"') == 5
    assert 'class="cdf"' in dom
    headers = len(re.findall(r"<th[ >]", dom))  # the goodput headers carry a title
    # jobs + cluster tables, and the accounts table's, hidden: no job has a user or account
    assert "GPU-h (sacct)" not in dom and headers == 10 + 5 + 4
    assert re.search(r'<section id="accounts" hidden', dom)
    assert re.search(r'<form id="filters"[^>]* hidden', dom)
    assert "time (min)" in dom  # 12 rounds of 60 s: minutes, not 0.00-0.18 h
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
    assert screenshot.stat().st_size > 10_000


@pytest.mark.heavy
def test_broken_data_is_shown_not_hidden(tmp_path: Path) -> None:
    """A data file without the report makes the page say so (and log it), not render blank."""
    index = render_site(sample(1), tmp_path / "site")
    (index.parent / "data.js").write_text("window.SOMETHING_ELSE = 1;\n")
    result = run_chromium("--dump-dom", index.as_uri())
    assert "report error: data.js did not define window.SIA_REPORT" in result.stdout
    assert any(":CONSOLE" in line for line in result.stderr.splitlines())


def test_missing_templates_are_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"app\.js"):
        render_site(sample(1), tmp_path / "out", site_dir=tmp_path)


def test_non_finite_numbers_become_null() -> None:
    data = sample(1)
    row = data.jobs[0]
    bad = ReportData(
        data.title,
        data.subtitle,
        data.gpu_types,
        data.rounds,
        (JobRow(row.id, row.app, row.state, 0.0, goodput_predicted=float("inf")),),
    )
    assert bad.to_json()["jobs"][0]["goodput_predicted"] is None


def owned_sample() -> ReportData:
    """Four jobs of two users in two accounts, one with Slurm accounting's charge, over 3 days."""
    base = sample(4)
    owners = [("alice", "physics"), ("bob", "physics"), ("carol", "biology"), ("alice", "physics")]
    jobs = tuple(
        replace(
            job,
            user=user,
            account=account,
            segments=(Segment(3600.0 * 30 * i, 3600.0 * 30 * i + 7200, "a100", 2 + i),),
            accounted_gpu_hours=5.0 if i == 0 else 0.0,
        )
        for i, (job, (user, account)) in enumerate(zip(base.jobs, owners, strict=True))
    )
    return replace(base, jobs=jobs)


@pytest.mark.heavy
def test_jobs_filter_by_user_and_account_and_gpu_hours_sum_per_account(tmp_path: Path) -> None:
    """Issue 36: each job shows its user and account, the page filters by them (the query
    string, which the filter bar sets), GPU-hours are summed per account, and the time axes use
    the run's own scale (days for a 3-day run)."""
    index = render_site(owned_sample(), tmp_path / "site")
    whole = run_chromium("--dump-dom", index.as_uri())
    assert whole.returncode == 0, whole.stderr[-2000:]
    dom = whole.stdout
    assert 'data-rendered="yes"' in dom
    assert dom.count('class="job-row"') == 4
    assert '<th class="owner">user</th>' in dom and "4 jobs" in dom
    accounts = re.findall(r'<tr class="account-row">(.*?)</tr>', dom)
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in accounts]
    # held GPU-hours: 2 h x (2 + 3 + 5) GPUs for physics (jobs 0, 1, 3), 2 h x 4 for biology
    assert cells == [
        ["physics", "alice, bob", "3", "20.000", "5.000"],
        ["biology", "carol", "1", "8.000", "0.000"],
    ]
    assert "time (d)" in dom
    physics = run_chromium("--dump-dom", index.as_uri() + "?account=physics&user=alice")
    dom = physics.stdout
    assert dom.count('class="job-row"') == 2, dom[-3000:]
    assert "2 of 4 jobs" in dom
    assert dom.count('class="segment"') == 2
    assert re.search(r'<option value="alice" selected', dom)
    assert len(re.findall(r'<tr class="account-row">', dom)) == 2  # the accounts: every job
