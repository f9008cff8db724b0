"""The dashboard from a real state database: rounds run by the service against a fake cluster,
read back by ``report_from_db``, rendered, and loaded in headless Chromium."""

from __future__ import annotations

import json
import os
import re
import sqlite3
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # so `tests.*` helpers import however pytest was started
    sys.path.insert(0, str(REPO))

from sia_slurm.cli.main import cli  # noqa: E402
from sia_slurm.config import SiaConfig, load_config  # noqa: E402
from sia_slurm.protocol import JobSpec, MetricsReport, StatePaths, write_document  # noqa: E402
from sia_slurm.report import ReportSourceError, render_site, report_from_db  # noqa: E402
from sia_slurm.report.goodput import measured_goodput  # noqa: E402
from sia_slurm.service import open_controller, run_round  # noqa: E402
from sia_slurm.slurm.observe.jobfiles import SlurmRecord  # noqa: E402
from sia_slurm.state import Store  # noqa: E402
from tests.report.test_site import run_chromium  # noqa: E402
from tests.service.fakes import FakeCluster, write_config  # noqa: E402

FIXTURES = REPO / "tests" / "fixtures" / "slurm-22.05"
T0 = 1_700_000_000.0  # a wall-clock origin, as the real controller records


class ClusterTime:
    """The fake cluster's time as the rounds' clock (it never sleeps: the test advances it)."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def now(self) -> float:
        return self.cluster.time

    def sleep(self, seconds: float) -> None:
        raise AssertionError("a round of the fake run should not sleep")


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> SiaConfig:
    """Three jobs (one submitted late) scheduled round by round until all are done."""
    directory = tmp_path_factory.mktemp("run")
    config = load_config(write_config(directory))
    cluster = FakeCluster(None, time=T0, restart_delay=20.0)
    for i, (app, work) in enumerate((("cifar10", 3e5), ("cifar10", 6e5), ("bert", 2e4))):
        owner = ("alice", "physics") if i < 2 else ("bob", "biology")
        cluster.submit(JobSpec(f"job{i}", app, init_batch_size=0, submit_time=T0), work, *owner)
    with Store.open(config.db_path) as store:
        for index in range(40):
            if index == 2:
                cluster.submit(JobSpec("late", "cifar10", submit_time=cluster.time), 2e5)
            controller, _ = open_controller(config, store)
            run_round(config, cluster, store, controller, False, clock=ClusterTime(cluster))
            if all(job.phase == "done" for job in cluster.jobs.values()):
                break
            cluster.advance(60.0)
    assert all(job.phase == "done" for job in cluster.jobs.values()), "fake run did not finish"
    # The last report a job wrote stays in its directory after it finished; the controller's
    # record says whose job it was (the Slurm backend writes it at first sight).
    paths = StatePaths(config.state_dir)
    for sia_id in ("job0", "job2"):
        paths.job_dir(sia_id).mkdir(parents=True)
        write_document(paths.metrics(sia_id), last_report(sia_id))
    SlurmRecord("10", os.geteuid(), T0).write(paths.slurm_record("job0"))
    # job2 has no record: the controller never knew whose directory it is, so it is not read.
    return config


def last_report(sia_id: str) -> MetricsReport:
    return MetricsReport(sia_id, T0 + 100, "a100", 1, 2, 64, 1, 0.2, 0.05, 1.0, 4.0)


def test_rows_rounds_and_segments_follow_the_database(finished_run: SiaConfig) -> None:
    data = report_from_db(finished_run.db_path, state_dir=finished_run.state_dir)
    assert [t.name for t in data.gpu_types] == ["a100", "t4"]
    assert [t.total for t in data.gpu_types] == [8, 8]
    with sqlite3.connect(finished_run.db_path) as conn:
        db_rounds = conn.execute("SELECT COUNT(*) FROM rounds").fetchone()[0]
        finish = dict(conn.execute("SELECT sia_id, finish_time FROM jobs").fetchall())
        restarts = dict(conn.execute("SELECT sia_id, restarts FROM jobs").fetchall())
    assert len(data.rounds) == db_rounds >= 3
    assert data.rounds[0].time == 0.0 and data.rounds[1].time == 60.0
    assert all(sum(r.allocated.values()) <= 16 for r in data.rounds)
    assert sum(data.rounds[0].allocated.values()) > 0
    jobs = {job.id: job for job in data.jobs}
    assert set(jobs) == {"job0", "job1", "job2", "late"}
    for sia_id, job in jobs.items():
        assert job.state == "done"
        assert job.finish_time == pytest.approx(finish[sia_id] - T0)
        assert job.jct_s == pytest.approx(finish[sia_id] - T0 - job.submit_time)
        assert job.restarts == restarts[sia_id]
        assert job.segments, sia_id
        assert job.segments[0].start >= job.submit_time
        assert job.segments[-1].end == pytest.approx(job.finish_time)
        assert all(s.end > s.start and s.gpus >= 1 for s in job.segments)
        assert job.gpu_type in ("a100", "t4") and job.gpus == job.segments[-1].gpus
        assert job.batch_size > 0
        if sia_id != "job0":  # no report read: the prediction of its last grant
            assert job.goodput_predicted and job.goodput_predicted > 0
    assert jobs["late"].submit_time == 120.0
    # Finished jobs' reports are gone from the database; job0's directory still has its last.
    expected = measured_goodput(last_report("job0"), 0)
    assert jobs["job0"].goodput_measured == pytest.approx(expected)
    # ... of a shape (a100:1x2, 64 per GPU x2) no decision gave it: nothing predicted that
    # (the pair is always of the report's shape: tests/report/test_goodput_pair.py).
    assert jobs["job0"].goodput_predicted is None
    assert jobs["job1"].goodput_measured is None  # wrote none
    assert jobs["job2"].goodput_measured is None  # no record of whose it is: not read
    without = {job.id: job for job in report_from_db(finished_run.db_path).jobs}
    assert without["job0"].goodput_measured is None  # the database alone
    summary = dict(data.summary)
    assert summary["jobs"] == "4/4 done" and "avg JCT" in summary and "makespan" in summary


def test_each_job_shows_whose_it_is_as_slurm_said(finished_run: SiaConfig) -> None:
    owners = {job.id: (job.user, job.account) for job in report_from_db(finished_run.db_path).jobs}
    assert owners == {
        "job0": ("alice", "physics"),
        "job1": ("alice", "physics"),
        "job2": ("bob", "biology"),
        "late": ("", ""),
    }


def test_measured_goodput_is_throughput_times_efficiency() -> None:
    report = MetricsReport("j", 0.0, "t4", 1, 2, 32, 1, 0.5, 0.1, 1.0, 3.0)
    # batch 2*32*2 = 128 per iteration of 1*(0.5-0.1) + 0.5 = 0.9 s
    assert measured_goodput(report, 0) == pytest.approx(128 / 0.9)
    # M0 = 64: scale 2, gain (3+1)/(3/2+1) = 1.6, efficiency 0.8
    assert measured_goodput(report, 64) == pytest.approx(128 / 0.9 * 0.8)


# sacct's runs as captured on 22.05 (tests/fixtures/slurm-22.05/sacct-runs.txt), the fixture's
# jobs renamed to this run's: mv-1 (requeued, then resubmitted) is job0, b1 is late; b2 is no
# job of this database and must not appear.
SACCT_RUNS = (
    (FIXTURES / "sacct-runs.txt").read_text().replace(":mv-1|", ":job0|").replace(":b1|", ":late|")
)
ACCOUNTED = {"job0": (2 * 4 + 2 * 17 + 1 * 3) / 3600, "late": 4 * 30 / 3600, "job1": 0.0}


@pytest.fixture
def accounting_config(finished_run: SiaConfig, tmp_path: Path) -> Path:
    """The run's config with ``slurm.bin_dir`` naming a fake ``scontrol`` (accounting on) and
    a fake ``sacct`` printing :data:`SACCT_RUNS`: what ``status`` and ``report`` both ask."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    runs = tmp_path / "sacct-runs.txt"
    runs.write_text(SACCT_RUNS)
    scripts = {
        "scontrol": 'echo "AccountingStorageType   = accounting_storage/slurmdbd"',
        "sacct": f"cat {runs}",
    }
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    assert finished_run.path is not None
    path = finished_run.path.parent / f"sia-{tmp_path.name}.yaml"
    path.write_text(finished_run.path.read_text() + f"slurm:\n  bin_dir: {bin_dir}\n")
    return path


def test_accounted_gpu_hours_are_per_job_and_absent_without_accounting(
    finished_run: SiaConfig,
) -> None:
    data = report_from_db(finished_run.db_path, accounted={"job0": 0.25, "other": 9.0})
    hours = {job.id: job.accounted_gpu_hours for job in data.jobs}
    assert hours == {"job0": 0.25, "job1": 0.0, "job2": 0.0, "late": 0.0}  # no runs: 0.0
    assert ("GPU-h (sacct)", "0.250") in data.summary  # "other" is no job of this run
    assert data.to_json()["jobs"][0]["accounted_gpu_hours"] == 0.25
    without = report_from_db(finished_run.db_path)
    assert {job.accounted_gpu_hours for job in without.jobs} == {None}
    assert "GPU-h (sacct)" not in dict(without.summary)


def test_offline_report_does_not_ask_sacct(accounting_config: Path) -> None:
    result = CliRunner().invoke(cli, ["report", "--config", str(accounting_config), "--offline",
                                      "--table"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "GPU-h (sacct)" not in result.output
    stray = CliRunner().invoke(cli, ["report", "--db", "a", "--table", "--offline"])
    assert stray.exit_code == 2 and "--offline: only with --config" in stray.output


@pytest.mark.heavy
def test_rendered_database_report_loads_in_chromium(
    finished_run: SiaConfig, accounting_config: Path, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli,
        ["report", "--config", str(accounting_config), "--out", str(tmp_path / "s"), "--table"],
    )
    assert result.exit_code == 0, result.output
    assert "dashboard:" in result.output and "(4 jobs," in result.output
    table = result.output.splitlines()
    assert table[0].split()[:7] == ["job", "app", "state", "JCT", "restarts", "GPU-h", "(sacct)"]
    assert any(line.startswith("late ") and " done " in line for line in table)
    # The text table and the site's data both carry what sacct charged each job, over all its
    # Slurm runs (job0's three runs under two Slurm job ids), 0.0 for a job without runs.
    for sia_id in ("job0", "late", "job1"):
        line = next(line for line in table if line.startswith(f"{sia_id} "))
        assert f" {ACCOUNTED[sia_id]:.3f} " in line, line
    site = json.loads((tmp_path / "s" / "report.json").read_text())
    hours = {job["id"]: job["accounted_gpu_hours"] for job in site["jobs"]}
    assert hours == pytest.approx({**ACCOUNTED, "job2": 0.0})
    dom = run_chromium("--dump-dom", (tmp_path / "s" / "index.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-rendered="yes"' in dom.stdout
    assert dom.stdout.count('class="job-row"') == 4
    assert dom.stdout.count('class="alloc-area"') == 2
    assert ">GPU-h (sacct)</th>" in dom.stdout
    cells = re.findall(r'<td class="num accounted">([^<]*)</td>', dom.stdout)
    assert sorted(cells) == sorted(f"{h:.3f}" for h in hours.values()), cells
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console


def test_missing_database_is_named(tmp_path: Path) -> None:
    with pytest.raises(ReportSourceError, match=r"nope\.db: no state database"):
        report_from_db(tmp_path / "nope.db")
    result = CliRunner().invoke(cli, ["report", "--db", str(tmp_path / "x.db"), "--table"])
    assert result.exit_code == 1 and "x.db: no state database" in result.output


@pytest.fixture
def job1_files(tmp_path: Path) -> StatePaths:
    """A state directory where job1, recorded as this account's, has a directory."""
    paths = StatePaths(tmp_path / "state")
    paths.job_dir("job1").mkdir(parents=True)
    SlurmRecord("11", os.geteuid(), T0).write(paths.slurm_record("job1"))
    return paths


def test_damaged_metrics_file_names_file_and_field(
    finished_run: SiaConfig, job1_files: StatePaths
) -> None:
    job1_files.metrics("job1").write_text('{"sia_id": "job1", "time": "soon"}')
    with pytest.raises(ReportSourceError, match=r"jobs/job1/metrics\.json: time: expected float"):
        report_from_db(finished_run.db_path, state_dir=job1_files.state_dir)


def test_metrics_are_read_only_through_the_user_file_door(
    finished_run: SiaConfig, job1_files: StatePaths, tmp_path: Path
) -> None:
    """The job's directory is its user's: a symlink there is not followed (the dashboard
    would otherwise show, or choke on, any file the controller's account can read)."""
    elsewhere = tmp_path / "report.json"
    write_document(elsewhere, last_report("job1"))
    job1_files.metrics("job1").symlink_to(elsewhere)
    with pytest.raises(ReportSourceError, match=r"metrics\.json: cannot read: is a symbolic link"):
        report_from_db(finished_run.db_path, state_dir=job1_files.state_dir)
    job1_files.metrics("job1").unlink()
    write_document(job1_files.metrics("job1"), last_report("job1"))
    data = report_from_db(finished_run.db_path, state_dir=job1_files.state_dir)
    assert {j.id: j for j in data.jobs}["job1"].goodput_measured is not None
    if os.geteuid() == 0:  # the record names the job's user; the file is someone else's
        os.chown(job1_files.metrics("job1"), 4242, 4242)
        with pytest.raises(ReportSourceError, match="owned by uid 4242, but the job's Slurm"):
            report_from_db(finished_run.db_path, state_dir=job1_files.state_dir)


def test_source_options_are_checked(tmp_path: Path) -> None:
    runner = CliRunner()
    none = runner.invoke(cli, ["report", "--out", str(tmp_path)])
    assert none.exit_code == 2 and "exactly one source of --db, --config, --sim" in none.output
    two = runner.invoke(cli, ["report", "--db", "a", "--sim", "b", "--table"])
    assert two.exit_code == 2 and "(got --db, --sim)" in two.output
    idle = runner.invoke(cli, ["report", "--db", "a"])
    assert idle.exit_code == 2 and "give --out DIR, --table, or both" in idle.output
    stray = runner.invoke(cli, ["report", "--db", "a", "--table", "--workload", "w"])
    assert stray.exit_code == 2 and "--workload: only with --sim" in stray.output


def test_rendering_needs_no_server(finished_run: SiaConfig, tmp_path: Path) -> None:
    """The data rides in data.js (no fetch), so the page works from file:// as checked above."""
    index = render_site(report_from_db(finished_run.db_path), tmp_path / "s")
    script = (index.parent / "data.js").read_text()
    assert script.startswith("window.SIA_REPORT = {") and '"late"' in script
