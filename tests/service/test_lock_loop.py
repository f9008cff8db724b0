"""One controller at a time (the lock), the aligned loop, and SIGTERM finishing a round."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from sia_slurm.service import (
    EXIT_LOCKED,
    ControllerLock,
    LockHeldError,
    next_round_time,
    run_loop,
)
from sia_slurm.service.round import ReconcileReport, RoundReport
from sia_slurm.state import Store
from tests.service.fakes import FakeCluster, write_config
from tests.service.test_crash import DRIVER, driver, populate


def test_lock_is_exclusive_and_released(tmp_path: Path) -> None:
    with (
        ControllerLock(tmp_path),
        pytest.raises(LockHeldError, match=r"pid \d+.*controller.lock"),
    ):
        ControllerLock(tmp_path).acquire()
    with ControllerLock(tmp_path):  # released on exit
        pass


def test_once_exits_quickly_while_another_controller_holds_the_lock(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster)
    with ControllerLock(tmp_path / "state"):
        started = time.monotonic()
        result = driver(cluster.path, config)  # type: ignore[arg-type]
        elapsed = time.monotonic() - started
    assert result.returncode == EXIT_LOCKED
    assert "another sia-slurm controller" in result.stderr and "controller.lock" in result.stderr
    assert elapsed < 15
    assert not (tmp_path / "state" / "sia.db").exists(), "a locked-out run must touch nothing"


def test_two_parallel_once_runs_one_round(tmp_path: Path) -> None:
    config = write_config(tmp_path)
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster)
    argv = [sys.executable, str(DRIVER), str(cluster.path), "--slow-snapshot", "3", "--",
            "controller", "run", "--once", "--config", str(config)]  # fmt: skip
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    codes = sorted(p.wait(timeout=120) for p in procs)
    for p in procs:
        assert p.stderr is not None
        p.stderr.close()
    assert codes == [0, EXIT_LOCKED]
    with Store.open(tmp_path / "state" / "sia.db") as store:
        assert store.last_round().round_index == 0  # type: ignore[union-attr]
    cluster._load()
    assert cluster.apply_calls == 1
    assert all(job.launches <= 1 for job in cluster.jobs.values())


def test_next_round_time_is_aligned() -> None:
    assert next_round_time(0.0, 60.0) == 60.0
    assert next_round_time(59.9, 60.0) == 60.0
    assert next_round_time(60.0, 60.0) == 120.0
    assert next_round_time(1000.5, 0.25) == 1000.75


def _report(index: int) -> RoundReport:
    return RoundReport(index, False, (), (), ReconcileReport())


def test_loop_survives_a_failed_round_and_stops_on_request() -> None:
    stop = threading.Event()
    calls: list[float] = []

    def one_round() -> RoundReport:
        calls.append(time.monotonic())
        if len(calls) == 2:
            raise RuntimeError("squeue timed out")
        if len(calls) == 4:
            stop.set()  # as SIGTERM would: this round finishes, no further one starts
        return _report(len(calls))

    reports = run_loop(one_round, 0.05, stop)
    assert len(calls) == 4 and [r.round_index for r in reports] == [1, 3, 4]


def test_sigterm_finishes_the_round_then_exits_zero(tmp_path: Path) -> None:
    """Rounds take longer than round_seconds (a 1 s snapshot), so they run back to back and a
    signal sent just after the first round ends lands inside the second one's snapshot."""
    config = write_config(tmp_path, round_seconds=0.2)
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster)
    log = tmp_path / "controller.log"
    argv = [sys.executable, str(DRIVER), str(cluster.path), "--slow-snapshot", "1", "--",
            "controller", "run", "--config", str(config), "--log-file", str(log)]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # wait for the first round to end
        if log.exists() and log.read_text().count('"event": "round"') >= 1:
            break
        time.sleep(0.02)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    messages = [e["message"] for e in events]
    assert any("received SIGTERM" in m for m in messages)
    assert "controller loop stopped" in messages[-1]
    rounds = [e["round"] for e in events if e.get("event") == "round"]
    assert rounds == [0, 1], "the round in progress finishes, and no further one starts"
    with Store.open(tmp_path / "state" / "sia.db") as store:
        assert store.last_round().round_index == rounds[-1]  # type: ignore[union-attr]
