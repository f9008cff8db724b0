"""How a training process learns that the controller wants something: files first, signals
as hints.

The controller asks for a stop by writing ``control/<sia_id>/stop.json`` and then sending
SIGUSR1 to the batch step, and for a new batch by rewriting ``control/<sia_id>/assignment.json``
with a higher round. Both files are in the controller's own tree (``control/<sia_id>/``, its
service account's; the job only reads it), not in the job's ``jobs/<sia_id>/`` (its user's,
where rank 0 writes the ack): :class:`sia_slurm.protocol.StatePaths`. Signals do not reliably
reach the workers (torchrun's agent does not forward SIGUSR1), so rank 0 polls the two files
(a ``stat`` each, at most every ``poll_interval_s``, or at once after a SIGUSR1) and the ranks
agree on the outcome in the step's control all-reduce. SIGTERM/SIGINT (requeue, preemption,
time limit) are caught in every process and turned into a flag, so the step in flight
completes and rank 0 can checkpoint.

A stop request applies to this run when its round is later than the round of the assignment
the run started with, and this run has not acknowledged it yet
(``jobs/<sia_id>/ack-<round>.<job id>.<restart count>`` absent, for this run's Slurm job id
and restart count): the request that preceded this very start is therefore never mistaken for
a new one.
"""

from __future__ import annotations

import logging
import os
import signal
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.protocol import Assignment, ProtocolError, StatePaths, StopRequest, read_document

logger = logging.getLogger(__name__)


@dataclass
class SignalFlags:
    """Signals received by this process, recorded by handlers that only set flags."""

    terminate: int = 0  # the signal number of a SIGTERM/SIGINT, 0 if none
    wake: bool = False  # a SIGUSR1 arrived: poll the controller's files now
    _previous: dict[int, object] = field(default_factory=dict)

    def install(self) -> None:
        """Catch SIGTERM, SIGINT and SIGUSR1 (main thread only; elsewhere a no-op)."""
        handlers: dict[int, Callable[[int, FrameType | None], None]] = {
            signal.SIGTERM: self._on_terminate,
            signal.SIGINT: self._on_terminate,
            signal.SIGUSR1: self._on_wake,
        }
        try:
            for number, handler in handlers.items():
                self._previous[number] = signal.signal(number, handler)
        except ValueError:  # not the main thread (e.g. an embedding test harness)
            logger.warning("signal handlers not installed: not in the main thread")

    @property
    def installed(self) -> bool:
        return bool(self._previous)

    def uninstall(self) -> None:
        for number, previous in self._previous.items():
            signal.signal(number, previous)  # type: ignore[arg-type]
        self._previous.clear()

    def _on_terminate(self, signum: int, _frame: FrameType | None) -> None:
        self.terminate = signum

    def _on_wake(self, _signum: int, _frame: FrameType | None) -> None:
        self.wake = True


@dataclass(frozen=True)
class _FileSignature:
    """Enough of a ``stat`` to notice that a file was replaced or rewritten."""

    inode: int
    size: int
    mtime_ns: int


def _signature(path: Path) -> _FileSignature | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return _FileSignature(st.st_ino, st.st_size, st.st_mtime_ns)


class ControlFiles:
    """Rank 0's reader of the controller's files for one job, and writer of the ack."""

    @classmethod
    def for_job(cls, env: JobEnvironment) -> ControlFiles:
        """The control files of ``env``'s job and run, as a trainer of it reads them."""
        return cls(
            StatePaths(env.state_dir),
            env.sia_id,
            env.launch_round,
            env.poll_interval_s,
            slurm_job_id=env.slurm_job_id,
            restart_count=env.restarts,
            hostnames=env.hostnames,
        )

    def __init__(
        self,
        paths: StatePaths,
        sia_id: str,
        launch_round: int,
        poll_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
        *,
        slurm_job_id: str,
        restart_count: int,
        hostnames: Sequence[str] = (),
    ):
        self.paths = paths
        self.sia_id = sia_id
        self.launch_round = launch_round
        self.run = (slurm_job_id, restart_count)  # the Slurm run this process trains in
        self.hostnames = tuple(hostnames)  # ... and its nodes (Assignment.hands_over)
        self.poll_interval_s = poll_interval_s
        self._clock = clock
        self._last_poll = -float("inf")
        self._seen: dict[Path, _FileSignature | None] = {}
        self._stop: StopRequest | None = None
        self._warned: set[str] = set()

    def due(self, wake: bool = False) -> bool:
        """Whether to look at the files now (rate limit; a SIGUSR1 skips it)."""
        now = self._clock()
        if wake or now - self._last_poll >= self.poll_interval_s:
            self._last_poll = now
            return True
        return False

    def pending_stop(self) -> StopRequest | None:
        """The stop request this run must obey, if any."""
        path = self.paths.stop_request(self.sia_id)
        if self._changed(path):
            self._stop = self._read(StopRequest, path)
        stop = self._stop
        if stop is None or stop.round_index <= self.launch_round or not self.run[0]:
            return None  # (no Slurm run: a standalone process that no controller stops)
        if self.paths.ack(self.sia_id, stop.round_index, *self.run).exists():
            return None
        return stop

    def new_assignment(self, current_round: int) -> Assignment | None:
        """A rewritten assignment with a round later than ``current_round``, if there is one."""
        path = self.paths.assignment(self.sia_id)
        if not self._changed(path):
            return None
        assignment = self._read(Assignment, path)
        if assignment is None or assignment.round_index <= current_round:
            return None
        return assignment

    def supersedes(self, assignment: Assignment) -> bool:
        """Whether ``assignment`` hands the job to another Slurm run than this one: the
        controller runs the job elsewhere now (this run was left behind, e.g. by a slurmd that
        died while Slurm requeued the job), so this run must stop without a checkpoint."""
        if not self.run[0]:
            return False  # a standalone process
        return assignment.hands_over(*self.run, self.hostnames)

    def write_ack(self, round_index: int) -> Path:
        """Create this run's empty ``jobs/<sia_id>/ack-<round>.<job id>.<restart count>``
        atomically (after the checkpoint is durable)."""
        path = self.paths.ack(self.sia_id, round_index, *self.run)
        write_empty_atomic(path)
        return path

    def _changed(self, path: Path) -> bool:
        signature = _signature(path)
        if path in self._seen and self._seen[path] == signature:
            return False
        self._seen[path] = signature
        return True

    def _read(self, cls: type, path: Path) -> StopRequest | Assignment | None:
        if not path.exists():
            return None
        try:
            document = read_document(cls, path)
        except ProtocolError as exc:
            self._warn_once(str(exc))
            return None
        if document.sia_id != self.sia_id:
            self._warn_once(f"{path}: sia_id {document.sia_id!r} is not this job's {self.sia_id!r}")
            return None
        return document

    def _warn_once(self, message: str) -> None:
        if message not in self._warned:
            self._warned.add(message)
            logger.warning("%s (ignored)", message)


def write_empty_atomic(path: Path) -> None:
    """An empty file at ``path`` that appears at once (temporary name, fsync, rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            os.fchmod(fd, 0o644)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
