"""One controller at a time (the lock), the aligned loop, and SIGTERM finishing a round."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from sia_slurm.service import (
    EXIT_LOCKED,
    ControllerLock,
    LockHeldError,
    next_round_time,
    run_loop,
)
from sia_slurm.service.journaled_round import ReconcileReport, RoundReport
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


# How long a test waits for a condition before it fails: far more than any step takes on a
# loaded 2-core machine; a passing test never waits it out.
PATIENCE_S = 120.0


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"still waiting after {PATIENCE_S:g} s for {what}")
        time.sleep(0.02)


@contextmanager
def reaped(*procs: subprocess.Popen[str]) -> Iterator[None]:
    """Kill what is still running when the test ends, failed or not (a held snapshot waits)."""
    try:
        yield
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()


@pytest.mark.heavy
def test_once_exits_at_once_while_another_controller_holds_the_lock(tmp_path: Path) -> None:
    """It returns while the lock is still held: a run that waited for the lock would never
    return here (the driver's own timeout would fail the test)."""
    config = write_config(tmp_path)
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster)
    with ControllerLock(tmp_path / "state"):
        result = driver(cluster.path, config)  # type: ignore[arg-type]
    assert result.returncode == EXIT_LOCKED
    assert "another sia-slurm controller" in result.stderr and "controller.lock" in result.stderr
    assert not (tmp_path / "state" / "sia.db").exists(), "a locked-out run must touch nothing"


@pytest.mark.heavy
def test_two_parallel_once_runs_one_round(tmp_path: Path) -> None:
    """Whichever takes the lock holds it, inside its snapshot, until the other has exited."""
    config = write_config(tmp_path)
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster)
    argv = [sys.executable, str(DRIVER), str(cluster.path), "--slow-snapshot", str(PATIENCE_S),
            "--", "controller", "run", "--once", "--config", str(config)]  # fmt: skip
    procs = [subprocess.Popen(argv, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    with reaped(*procs):
        wait_for(
            lambda: any(p.poll() is not None for p in procs) or cluster.snapshots_begun() > 1,
            "one run to exit, or both to take a snapshot",
        )
        assert cluster.snapshots_begun() <= 1, "two controllers in a round at once"
        (loser,) = [p for p in procs if p.poll() is not None]
        (winner,) = [p for p in procs if p is not loser]
        _, stderr = loser.communicate()
        assert loser.returncode == EXIT_LOCKED, stderr
        assert cluster.snapshots_begun() == 1  # the winner, still in its round
        cluster.let_snapshots_end(1)
        _, stderr = winner.communicate(timeout=PATIENCE_S)
        assert winner.returncode == 0, stderr
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


@pytest.mark.heavy
def test_sigterm_finishes_the_round_then_exits_zero(tmp_path: Path) -> None:
    """SIGTERM sent while the second round is inside its snapshot (held there until the
    signal has been received): that round finishes, and no further one starts."""
    config = write_config(tmp_path, round_seconds=0.2)
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster)
    log = tmp_path / "controller.log"

    def logged(text: str) -> bool:
        return log.exists() and text in log.read_text()

    argv = [sys.executable, str(DRIVER), str(cluster.path), "--slow-snapshot", str(PATIENCE_S),
            "--", "controller", "run", "--config", str(config), "--log-file", str(log)]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    with reaped(proc):
        # Round 0 on a fresh state takes one snapshot (nothing pending to reconcile).
        wait_for(lambda: cluster.snapshots_begun() >= 1, "round 0's snapshot")
        cluster.let_snapshots_end(1)
        wait_for(lambda: logged('"event": "round"'), "round 0 to end")
        wait_for(lambda: cluster.snapshots_begun() >= 2, "round 1's snapshot")
        proc.send_signal(signal.SIGTERM)
        wait_for(lambda: logged("received SIGTERM"), "the signal to be received")
        cluster.let_snapshots_end(1_000)
        _, stderr = proc.communicate(timeout=PATIENCE_S)
    assert proc.returncode == 0, stderr
    events = [json.loads(line) for line in log.read_text().splitlines()]
    messages = [e["message"] for e in events]
    assert any("received SIGTERM" in m for m in messages)
    assert "controller loop stopped" in messages[-1]
    rounds = [e["round"] for e in events if e.get("event") == "round"]
    assert rounds == [0, 1], "the round in progress finishes, and no further one starts"
    with Store.open(tmp_path / "state" / "sia.db") as store:
        assert store.last_round().round_index == rounds[-1]  # type: ignore[union-attr]
