"""The subprocess runner: exact argv, and failures that carry argv, status and stderr tail."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sia_slurm.slurm.runner import CommandError, SubprocessRunner


def test_runs_argv_without_a_shell() -> None:
    hostile = "job; rm -rf / $(reboot) 'quoted'"
    result = SubprocessRunner().run(
        [sys.executable, "-c", "import sys; print(sys.argv[1])", hostile]
    )
    assert result.stdout == hostile + "\n"
    assert result.returncode == 0


def test_failure_carries_argv_status_and_stderr_tail() -> None:
    script = "import sys; [print(f'line {i}', file=sys.stderr) for i in range(9)]; sys.exit(3)"
    with pytest.raises(CommandError) as caught:
        SubprocessRunner().run([sys.executable, "-c", script])
    error = caught.value
    assert error.returncode == 3
    assert "exit status 3" in str(error)
    assert "line 8" in str(error) and "line 3" not in str(error)  # only the tail
    assert error.argv[0] == sys.executable


def test_unchecked_failure_returns_result() -> None:
    result = SubprocessRunner().run([sys.executable, "-c", "raise SystemExit(2)"], check=False)
    assert result.returncode == 2


def test_missing_command() -> None:
    with pytest.raises(CommandError, match="no-such-slurm-command: command not found"):
        SubprocessRunner().run(["no-such-slurm-command"])


def test_bin_dir_and_env(tmp_path: Path) -> None:
    tool = tmp_path / "squeue"
    tool.write_text('#!/bin/sh\necho "conf=$SLURM_CONF args=$*"\n')
    tool.chmod(0o755)
    runner = SubprocessRunner(env={"SLURM_CONF": "/x/slurm.conf"}, bin_dir=tmp_path)
    assert runner.run(["squeue", "-h"]).stdout == "conf=/x/slurm.conf args=-h\n"


def test_timeout() -> None:
    runner = SubprocessRunner(timeout_s=0.2)
    with pytest.raises(CommandError, match=r"timed out after 0\.2 s"):
        runner.run([sys.executable, "-c", "import time; time.sleep(5)"])
