"""The one place that runs Slurm's commands.

Callers build argv lists (never shell strings) and hand them to a :class:`CommandRunner`; tests
inject a fake runner instead of patching :mod:`subprocess`. A failure raises
:class:`CommandError` carrying the argv, the exit status and the tail of stderr.
"""

from __future__ import annotations

import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol


class CommandError(RuntimeError):
    """A command failed to start, failed, or ran past its timeout."""

    def __init__(self, argv: Sequence[str], returncode: int | None, stderr: str, reason: str = ""):
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr
        tail = "\n".join(stderr.strip().splitlines()[-5:])
        status = reason or f"exit status {returncode}"
        message = f"{shlex.join(self.argv)}: {status}"
        if tail:
            message += f"\n{tail}"
        super().__init__(message)


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs one command to completion and returns its output, or raises CommandError."""

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult: ...


@dataclass
class SubprocessRunner:
    """Runs commands with :mod:`subprocess`, with extra environment and an optional bin dir."""

    env: Mapping[str, str] = field(default_factory=dict)
    bin_dir: Path | None = None
    timeout_s: float = 60.0

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        argv = list(argv)
        if self.bin_dir is not None and "/" not in argv[0]:
            argv[0] = str(self.bin_dir / argv[0])
        try:
            proc = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                env={**os.environ, **self.env},
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise CommandError(argv, None, "", "command not found") from None
        except subprocess.TimeoutExpired as exc:
            stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else (exc.stderr or "")
            raise CommandError(
                argv, None, stderr, f"timed out after {self.timeout_s:g} s"
            ) from None
        if check and proc.returncode != 0:
            raise CommandError(argv, proc.returncode, proc.stderr)
        return CommandResult(tuple(argv), proc.returncode, proc.stdout, proc.stderr)
