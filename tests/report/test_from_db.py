"""The dashboard from a real state database: rounds run by the service against a fake cluster,
read back by ``report_from_db``, rendered, and loaded in headless Chromium."""

from __future__ import annotations

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
from sia_slurm.report.from_db import measured_goodput  # noqa: E402
from sia_slurm.service import open_controller, run_round  # noqa: E402
from sia_slurm.state import Store  # noqa: E402
from tests.report.test_site import run_chromium  # noqa: E402
from tests.service.fakes import FakeCluster, write_config  # noqa: E402

T0 = 1_700_000_000.0  # a wall-clock origin, as the real controller records


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> SiaConfig:
    """Three jobs (one submitted late) scheduled round by round until all are done."""
    directory = tmp_path_factory.mktemp("run")
    config = load_config(write_config(directory))
    cluster = FakeCluster(None, time=T0, restart_delay=20.0)
    for i, (app, work) in enumerate((("cifar10", 3e5), ("cifar10", 6e5), ("bert", 2e4))):
        cluster.submit(JobSpec(f"job{i}", app, init_batch_size=0, submit_time=T0), work)
    with Store.open(config.db_path) as store:
        for index in range(40):
            if index == 2:
                cluster.submit(JobSpec("late", "cifar10", submit_time=cluster.time), 2e5)
            controller, _ = open_controller(config, store)
            run_round(config, cluster, store, controller, False, clock=lambda: cluster.time)
            if all(job.phase == "done" for job in cluster.jobs.values()):
                break
            cluster.advance(60.0)
    assert all(job.phase == "done" for job in cluster.jobs.values()), "fake run did not finish"
    # The last report a job wrote stays in the spool after it finished.
    write_document(
        StatePaths(config.state_dir).metrics("job0"),
        MetricsReport("job0", T0 + 100, "a100", 1, 2, 64, 1, 0.2, 0.05, 1.0, 4.0),
    )
    return config


def test_rows_rounds_and_segments_follow_the_database(finished_run: SiaConfig) -> None:
    data = report_from_db(finished_run.db_path, spool_dir=finished_run.spool_dir)
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
        assert job.batch_size > 0 and job.goodput_predicted and job.goodput_predicted > 0
    assert jobs["late"].submit_time == 120.0
    # Finished jobs' reports are gone from the database; the spool still has job0's.
    expected = measured_goodput(
        MetricsReport("job0", T0 + 100, "a100", 1, 2, 64, 1, 0.2, 0.05, 1.0, 4.0), 0
    )
    assert jobs["job0"].goodput_measured == pytest.approx(expected)
    assert jobs["job1"].goodput_measured is None
    summary = dict(data.summary)
    assert summary["jobs"] == "4/4 done" and "avg JCT" in summary and "makespan" in summary


def test_measured_goodput_is_throughput_times_efficiency() -> None:
    report = MetricsReport("j", 0.0, "t4", 1, 2, 32, 1, 0.5, 0.1, 1.0, 3.0)
    # batch 2*32*2 = 128 per iteration of 1*(0.5-0.1) + 0.5 = 0.9 s
    assert measured_goodput(report, 0) == pytest.approx(128 / 0.9)
    # M0 = 64: scale 2, gain (3+1)/(3/2+1) = 1.6, efficiency 0.8
    assert measured_goodput(report, 64) == pytest.approx(128 / 0.9 * 0.8)


def test_rendered_database_report_loads_in_chromium(
    finished_run: SiaConfig, tmp_path: Path
) -> None:
    result = CliRunner().invoke(
        cli,
        ["report", "--config", str(finished_run.path), "--out", str(tmp_path / "s"), "--table"],
    )
    assert result.exit_code == 0, result.output
    assert "dashboard:" in result.output and "(4 jobs," in result.output
    table = result.output.splitlines()
    assert table[0].split()[:5] == ["job", "app", "state", "JCT", "restarts"]
    assert any(line.startswith("late ") and " done " in line for line in table)
    dom = run_chromium("--dump-dom", (tmp_path / "s" / "index.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-rendered="yes"' in dom.stdout
    assert dom.stdout.count('class="job-row"') == 4
    assert dom.stdout.count('class="alloc-area"') == 2
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console


def test_missing_database_is_named(tmp_path: Path) -> None:
    with pytest.raises(ReportSourceError, match=r"nope\.db: no state database"):
        report_from_db(tmp_path / "nope.db")
    result = CliRunner().invoke(cli, ["report", "--db", str(tmp_path / "x.db"), "--table"])
    assert result.exit_code == 1 and "x.db: no state database" in result.output


def test_damaged_spool_file_names_file_and_field(finished_run: SiaConfig, tmp_path: Path) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    (spool / "job1.json").write_text('{"sia_id": "job1", "time": "soon"}')
    with pytest.raises(ReportSourceError, match=r"job1\.json: time: expected float"):
        report_from_db(finished_run.db_path, spool_dir=spool)


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
