"""Keep the controller loop alive as systemd's ``Restart=always`` would, while something kills it.

The kill tests (``tests/e2e/test_controller_kill_live.py``) and the chaos soak
(``benchmarks/chaos.py``) SIGKILL ``sia-slurm controller run`` at chosen or random moments; the
journal must make the next process finish what the killed one left. :class:`Supervisor` starts
the loop, starts it again at once whenever it died of SIGKILL (any other exit is recorded in
``failure`` and ends the supervision, so a crash is never hidden by a restart), and stops it with
SIGTERM, which lets the controller finish its round.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Exit:
    """How one controller process ended."""

    pid: int
    returncode: int
    started: float
    ended: float
    output: str


class Supervisor:
    """Runs ``argv`` (the controller loop) and starts it again whenever it dies of SIGKILL."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path) -> None:
        self.argv, self.env, self.cwd = argv, env, cwd
        self.exits: list[Exit] = []
        self.failure = ""  # set when a controller ended other than by SIGKILL or our SIGTERM
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self.started = 0.0  # when the running controller was started
        self._thread = threading.Thread(target=self._supervise, name="controller", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def kill_now(self) -> int | None:
        """SIGKILL the running controller (the test's own random point); its pid, or None if
        none was running. The supervisor thread reaps and sets ``returncode``, so a process
        whose returncode is still None has not been reaped and its pid is its own."""
        with self._lock:
            process = self._process
            if process is None or process.returncode is not None:
                return None
            os.kill(process.pid, signal.SIGKILL)
            return process.pid

    def current(self) -> tuple[int, float] | None:
        """The pid and start time of the controller started last, unless it has been reaped
        (a killed one may not be reaped yet: callers also check their own kills)."""
        with self._lock:
            process = self._process
            if process is None or process.returncode is not None:
                return None
            return process.pid, self.started

    def _supervise(self) -> None:
        while not self._stopping.is_set():
            with self._lock:
                if self._stopping.is_set():
                    return
                process = subprocess.Popen(
                    self.argv,
                    env=self.env,
                    cwd=self.cwd,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
                self._process = process
                self.started = started = time.time()
            output, _ = process.communicate()
            ended = Exit(process.pid, process.returncode, started, time.time(), output[-4000:])
            self.exits.append(ended)
            if process.returncode == -signal.SIGKILL:
                continue
            if not self._stopping.is_set():
                self.failure = f"controller pid {process.pid} exited {process.returncode}"
            return

    def stop(self, timeout_s: float = 60.0, signum: int = signal.SIGTERM) -> Exit | None:
        """SIGTERM the running controller (it finishes its round and exits 0), or send it
        ``signum`` (SIGKILL: systemd's stop timed out), and start no other; its exit."""
        with self._lock:
            self._stopping.set()
            process = self._process
            if process is not None and process.poll() is None:
                process.send_signal(signum)
        if self._thread.ident is None:  # never started
            return None
        self._thread.join(timeout_s)
        if self._thread.is_alive() and process is not None:
            process.kill()
            self._thread.join(10.0)
        return self.exits[-1] if self.exits else None
