"""The dashboard from a real (tiny) simulation: ``sia-slurm simulate`` on the dev cluster's
shape, read back by ``report_from_sim``, rendered, and loaded in headless Chromium."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.cli.main import cli  # noqa: E402
from sia_slurm.cli.report_cmd import gpu_history  # noqa: E402
from sia_slurm.report import ReportSourceError, report_from_sim  # noqa: E402
from tests.report.test_site import run_chromium  # noqa: E402

DEV_CLUSTER = REPO / "etc" / "clusters" / "dev.yaml"
WORKLOAD = """name,time,application,num_replicas,batch_size
c-0,0,cifar10,1,128
c-1,30,cifar10,2,256
n-2,200,ncf,1,256
"""


@pytest.fixture(scope="module")
def sim_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sim")
    (root / "w.csv").write_text(WORKLOAD)
    out = root / "out"
    args = ["simulate", str(root / "w.csv"), "--cluster", str(DEV_CLUSTER), "-j", "1"]
    result = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out


def log_lines(out: Path) -> list[dict]:  # type: ignore[type-arg]
    return [json.loads(line) for line in (out / "rounds-w.jsonl").read_text().splitlines()]


def test_jobs_and_rounds_follow_the_simulation(sim_out: Path) -> None:
    data = report_from_sim(sim_out)
    summary = json.loads((sim_out / "summary.json").read_text())
    jct_h = summary["workloads"]["w"]["metrics"]["jct_h"]
    lines = log_lines(sim_out)
    assert [(t.name, t.total) for t in data.gpu_types] == [("a100", 8), ("rtx", 8), ("t4", 8)]
    assert len(data.rounds) == len(lines)
    for point, line in zip(data.rounds, lines, strict=True):
        assert point.time == line["time"] and point.index == line["round"]
        assert sum(point.allocated.values()) == sum(line["gpus"].values())
        assert point.solve_ms == line["timings_ms"]["policy"]
        assert point.running + point.pending == line["contention"]
    jobs = {job.id: job for job in data.jobs}
    assert list(jobs) == ["c-0", "c-1", "n-2"]
    assert [jobs[j].submit_time for j in jobs] == [0.0, 30.0, 200.0]
    for name, job in jobs.items():
        grants = sum(
            1 for line in lines for a in line["actions"]
            if a["job"] == name and a["action"] in ("start", "move")
        )  # fmt: skip
        assert job.state == "done" and job.restarts == grants - 1
        assert job.jct_s == pytest.approx(jct_h[name] * 3600)
        assert job.finish_time == pytest.approx(job.submit_time + job.jct_s)
        assert job.segments and job.segments[-1].end == pytest.approx(job.finish_time)
        assert job.segments[0].start >= job.submit_time
        starts = [s.start for s in job.segments]
        assert starts == sorted(starts)
        assert job.goodput_predicted is not None and job.goodput_predicted > 0
        assert job.goodput_measured is None  # the simulator measures nothing
        assert (job.gpu_type, job.gpus) == (job.segments[-1].gpu_type, job.segments[-1].gpus)
    assert dict(data.summary)["jobs"] == "3/3 done"


@pytest.mark.heavy
def test_rendered_simulation_report_loads_in_chromium(sim_out: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["report", "--sim", str(sim_out), "--out", str(tmp_path / "s"), "--table"]
    )
    assert result.exit_code == 0, result.output
    history = gpu_history(report_from_sim(sim_out).jobs[0])
    table = result.output.splitlines()
    assert any(line.startswith("c-0 ") and line.endswith(history) for line in table)
    dom = run_chromium("--dump-dom", (tmp_path / "s" / "index.html").as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert 'data-rendered="yes"' in dom.stdout
    assert dom.stdout.count('class="job-row"') == 3
    assert dom.stdout.count('class="alloc-area"') == 3
    segments = sum(len(job.segments) for job in report_from_sim(sim_out).jobs)
    assert dom.stdout.count('class="segment"') == segments
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console


def test_bad_simulation_outputs_are_named(sim_out: Path, tmp_path: Path) -> None:
    with pytest.raises(ReportSourceError, match=r"summary\.json: not found"):
        report_from_sim(tmp_path)
    copy = tmp_path / "copy"
    shutil.copytree(sim_out, copy)
    with pytest.raises(ReportSourceError, match=r"no workload 'x' \(it has w\)"):
        report_from_sim(copy, workload="x")
    lines = (copy / "rounds-w.jsonl").read_text().splitlines()
    lines[1] = lines[1].replace('"time": ', '"time": "late", "was": ')
    (copy / "rounds-w.jsonl").write_text("\n".join(lines) + "\n")
    with pytest.raises(ReportSourceError, match=r"rounds-w\.jsonl:2: time: expected a number"):
        report_from_sim(copy)
    summary = json.loads((copy / "summary.json").read_text())
    summary["workloads"]["v"] = summary["workloads"]["w"]
    (copy / "summary.json").write_text(json.dumps(summary))
    with pytest.raises(ReportSourceError, match=r"holds 2 workloads; pick one with --workload"):
        report_from_sim(copy)
    result = CliRunner().invoke(cli, ["report", "--sim", str(copy), "--table"])
    assert result.exit_code == 1 and "pick one with --workload (v, w)" in result.output
