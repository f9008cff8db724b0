"""``sia-slurm simulate``: outputs, and bad inputs reported with exit status 2 and no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sia_slurm.cli.main import cli

REPO = Path(__file__).resolve().parents[2]
PHILLY_1 = REPO / "data" / "workloads" / "philly" / "workload-1.csv"
HEADER = "name,time,application,num_replicas,batch_size\n"


def invoke(*args: str | Path) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["simulate", *map(str, args)])
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    return result.exit_code, result.output


@pytest.mark.heavy
def test_simulate_writes_summary_round_logs_and_plots(tmp_path: Path) -> None:
    folder = tmp_path / "workloads"
    folder.mkdir()
    for name in ("a.csv", "b.csv"):
        (folder / name).write_text(PHILLY_1.read_text())
    out = tmp_path / "out"
    code, output = invoke(
        folder, "--policy", "fifo", "--jobs", "3", "-j", "1", "--out", out, "--plot", "--seed", "3"
    )
    assert code == 0, output
    assert "simulating 2 workload(s) on hetero64 (64 GPUs) with fifo" in output
    assert "[1/2] a: 3/3 jobs done" in output and "[2/2] b: 3/3 jobs done" in output
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["policy"], summary["cluster"], summary["seed"]) == ("fifo", "hetero64", 3)
    assert summary["round_s"] == 60.0 and summary["jobs_limit"] == 3
    assert set(summary["workloads"]) == {"a", "b"}
    a = summary["workloads"]["a"]["metrics"]
    assert a["jobs"] == a["completed"] == 3
    assert set(a["jct_h"]) == {"cifar10-0", "deepspeech2-1", "cifar10-2"}
    pooled = summary["pooled"]
    assert pooled["jobs"] == 6 and pooled["workloads"] == 2
    assert pooled["avg_jct_h"] == pytest.approx(a["avg_jct_h"])  # same jobs twice
    lines = (out / "rounds-a.jsonl").read_text().splitlines()
    first = json.loads(lines[0])
    assert {"round", "time", "actions", "decisions", "gpus", "contention", "timings_ms"} <= set(
        first
    )
    assert (out / "jct_cdf.png").stat().st_size > 0
    assert (out / "gpus-a.png").stat().st_size > 0


def test_same_named_workloads_get_distinct_labels(tmp_path: Path) -> None:
    for folder in ("x", "y"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "w.csv").write_text(HEADER + "j,0,cifar10,1,128\n")
    out = tmp_path / "out"
    code, output = invoke(
        tmp_path / "x" / "w.csv",
        tmp_path / "y" / "w.csv",
        "--policy",
        "fifo",
        "-j",
        "1",
        "--out",
        out,
    )
    assert code == 0, output
    assert (out / "rounds-x_w.jsonl").exists() and (out / "rounds-y_w.jsonl").exists()
    summary = json.loads((out / "summary.json").read_text())
    for metrics in (summary["workloads"]["x_w"]["metrics"], summary["pooled"]):
        assert metrics["job_rounds_waiting_beside_free_gpus"] == 0  # one job, 64 GPUs
        assert metrics["rounds_with_jobs_waiting_beside_free_gpus"] == 0
        assert metrics["unplaced_allocations"] == 0
        assert metrics["active_job_rounds"] > 0
    first = json.loads((out / "rounds-x_w.jsonl").read_text().splitlines()[0])
    assert (first["waits_beside_free_gpus"], first["unplaced"]) == ({}, [])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (HEADER + "a,0,gpt_pmp,4,64\n", "application: expected one of bert, cifar10"),
        ("name,time,application,num_replicas\na,0,bert,4\n", "missing batch_size"),
        (HEADER + "a,10,bert,4,64\nb,5,bert,4,64\n", "expected jobs in order of submission"),
        (HEADER, "expected at least one job"),
    ],
)
def test_bad_workloads_exit_2_with_the_loaders_message(
    tmp_path: Path, text: str, expected: str
) -> None:
    workload = tmp_path / "w.csv"
    workload.write_text(text)
    code, output = invoke(workload, "--out", tmp_path / "out")
    assert code == 2
    assert output.startswith(f"error: {workload}")
    assert expected in output
    assert "Traceback" not in output
    assert not (tmp_path / "out").exists()


def test_missing_workload_and_cluster_files(tmp_path: Path) -> None:
    code, output = invoke(tmp_path / "none.csv", "--out", tmp_path / "out")
    assert code == 2 and f"{tmp_path / 'none.csv'}: file not found" in output
    code, output = invoke(PHILLY_1, "--cluster", tmp_path / "c.yaml", "--out", tmp_path / "out")
    assert code == 2 and f"{tmp_path / 'c.yaml'}: file not found" in output


def test_gpu_type_without_ground_truth_exits_2(tmp_path: Path) -> None:
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "gpu_types:\n  v: {profile: v100, trace_key: nosuch, gpus_per_node: 8, nodes: 1}\n"
    )
    code, output = invoke(PHILLY_1, "--cluster", cluster, "--out", tmp_path / "out")
    assert code == 2
    assert "GPU types without ground truth" in output and "placements-nosuch.csv" in output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--policy", "tetris"], "'tetris' is not one of"),
        (["--round", "0"], "--round"),
        (["--jobs", "0"], "--jobs"),
    ],
)
def test_bad_options_are_usage_errors(tmp_path: Path, args: list[str], expected: str) -> None:
    code, output = invoke(PHILLY_1, "--out", tmp_path / "out", *args)
    assert code == 2 and expected in output


def test_help_lists_outputs_and_exit_status() -> None:
    code, output = invoke("--help")
    assert code == 0
    assert "summary.json" in output and "rounds-NAME.jsonl" in output and "exit 2" in output
