"""benchmarks/jct_breakdown.py splits each job's JCT as its module says, from hand-made files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.jct_breakdown import workload_split

REPO = Path(__file__).resolve().parents[1]


def write_run(out: Path) -> None:
    job = {"name": "cifar10-0", "app": "cifar10", "submit_time": 0.0, "finish_time": 290.0,
           "restarts": 1}  # fmt: skip
    (out / "done").mkdir(parents=True)
    done = {"workload": "workload-1", "jobs": [job]}
    (out / "done" / "sia-paper-helios-workload-1.json").write_text(json.dumps(done))
    held = {60.0: True, 120.0: True, 180.0: False, 240.0: True, 300.0: False}
    lines = [
        json.dumps({"time": t, "goodput": {"cifar10-0": 1.0} if h else {}}) for t, h in held.items()
    ]
    (out / "rounds-sia-paper-helios-workload-1.jsonl").write_text("\n".join(lines) + "\n")


def test_a_job_queued_a_round_stopped_a_round_and_restarted_once(tmp_path):
    write_run(tmp_path)
    done = json.loads((tmp_path / "done" / "sia-paper-helios-workload-1.json").read_text())
    split = workload_split(done, tmp_path / "rounds-sia-paper-helios-workload-1.jsonl")
    assert (split.jobs, split.jct) == (1, 290.0)
    assert split.queued == 60.0  # submitted at 0, first GPUs in the round at 60
    assert split.held_back == 60.0  # the round at 180 without GPUs (300 is after it finished)
    assert split.restarting == 100.0  # cifar10's 50 s, on its start and its one restart
    assert split.restarts == 1


def test_the_table_names_policy_and_trace(tmp_path):
    write_run(tmp_path)
    shown = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "jct_breakdown.py"), str(tmp_path)],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "| sia-paper | helios | 1 | 0.081 | 20.7% | 20.7% | 34.5% | 24.1% | 1.00 |" in shown
