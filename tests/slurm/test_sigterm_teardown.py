"""A test session stopped by SIGTERM (what a CI timeout sends) takes its daemons down: the dev
cluster's munged, slurmctld and slurmd, and the accounting cluster's slurmdbd and MariaDB too.
Before tests/conftest.py turned SIGTERM into a teardown they stayed up, and the next session
failed on their ports.

A pytest session on tests/slurm/sigterm_session.py brings both clusters up on ports of its own
(``SIGTERM_PORT_OFFSET`` above this session's), reports their daemons, and is sent SIGTERM.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sia_slurm_dev import DevCluster
from sia_slurm_dev.process import DaemonRecord, is_alive
from tests.release import SIGTERM_PORT_OFFSET, TEST_PORT_BASE
from tests.slurm.sigterm_session import REPORT_VARIABLE

# What it checks is this suite's conftest, the same on every release.
pytestmark = [pytest.mark.slurm, pytest.mark.one_release]

REPO = Path(__file__).resolve().parents[2]
SESSION = Path(__file__).with_name("sigterm_session.py")
UP_TIMEOUT_S = 240.0  # both clusters up: ~20 s alone on 2 cores, longer beside other sessions
DOWN_TIMEOUT_S = 120.0  # each cluster's down: 30 s to cancel jobs, 15 s to stop its daemons


def _records(report: dict[str, dict[str, object]]) -> list[DaemonRecord]:
    return [
        DaemonRecord(**daemon)  # type: ignore[arg-type]
        for cluster in report.values()
        for daemon in cluster["daemons"]  # type: ignore[attr-defined]
    ]


def _wait_for_report(path: Path, session: subprocess.Popen[bytes], log: Path) -> dict:  # type: ignore[type-arg]
    deadline = time.monotonic() + UP_TIMEOUT_S
    while not path.exists():
        if session.poll() is not None:
            output = log.read_text(errors="replace")
            pytest.fail(
                f"the session ended ({session.returncode}) before its clusters were up:\n{output}"
            )
        if time.monotonic() > deadline:
            output = log.read_text(errors="replace")
            pytest.fail(f"the clusters were not up after {UP_TIMEOUT_S} s:\n{output}")
        time.sleep(0.2)
    return json.loads(path.read_text())


def test_a_session_stopped_by_sigterm_takes_its_clusters_down(tmp_path: Path) -> None:
    report_path = tmp_path / "daemons.json"
    log = tmp_path / "session.log"
    env = {
        **os.environ,
        REPORT_VARIABLE: str(report_path),
        "SIA_TEST_PORT_BASE": str(TEST_PORT_BASE + SIGTERM_PORT_OFFSET),
    }
    # Its own basetemp: the session's temporary directories stay out of /tmp/pytest-of-<user>.
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(SESSION)]
    argv += ["--basetemp", str(tmp_path / "basetemp")]
    with log.open("wb") as out:
        session = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    report: dict = {}  # type: ignore[type-arg]
    try:
        report = _wait_for_report(report_path, session, log)
        records = _records(report)
        roles = {record.role.split(":")[0] for record in records}
        assert roles == {"munged", "slurmctld", "slurmd", "mariadbd", "slurmdbd"}, records
        assert all(is_alive(record) for record in records), records
        session.send_signal(signal.SIGTERM)
        code = session.wait(timeout=DOWN_TIMEOUT_S)
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        # What the session left running, taken down here so that a failure of this test
        # leaves no daemon holding its ports.
        running = [record.role for record in _records(report) if is_alive(record)]
        for cluster in report.values():
            if any(is_alive(record) for record in _records({"": cluster})):
                DevCluster(Path(cluster["root"])).down()
    output = log.read_text(errors="replace")
    assert running == [], output
    assert code == pytest.ExitCode.INTERRUPTED, output
    assert "SIGTERM: the session stops, its fixtures tear down" in output, output
