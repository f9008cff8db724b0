"""sia_slurm.job.agent: torchrun's agent as sia-launch runs it, with a real worker (no Slurm)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.heavy

REPO = Path(__file__).resolve().parents[2]
WORKER = """\
import pathlib, sys, time
pathlib.Path(sys.argv[1]).write_text("up")
time.sleep(120)
"""


def test_a_death_signal_ends_the_agent_with_its_status_and_no_traceback(tmp_path: Path) -> None:
    """Slurm's SIGTERM at a requeue: the agent stops its workers, exits 128 + 15, logs one line;
    SIGUSR1 (the controller's stop hint) before it changes nothing."""
    worker, ready = tmp_path / "worker.py", tmp_path / "ready"
    worker.write_text(WORKER)
    agent = subprocess.Popen(
        [sys.executable, "-m", "sia_slurm.job.agent", "--standalone", "--nproc-per-node=1",
         "--max-restarts=0", str(worker), str(ready)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # torchrun and a worker importing torch: 60 s was not enough at the start of a loaded
        # run (nine sessions and two busy loops starting at once); a bound, not a timing
        deadline = time.monotonic() + 300
        while not ready.exists():
            assert agent.poll() is None, agent.communicate()[1]
            assert time.monotonic() < deadline, "the worker did not start"
            time.sleep(0.2)
        agent.send_signal(signal.SIGUSR1)
        time.sleep(0.5)
        assert agent.poll() is None  # ignored
        agent.send_signal(signal.SIGTERM)
        _out, err = agent.communicate(timeout=60)
    finally:
        if agent.poll() is None:
            agent.kill()
    assert agent.returncode == 128 + signal.SIGTERM
    assert "Traceback" not in err
    assert "torchrun stopped by signal SIGTERM" in err
