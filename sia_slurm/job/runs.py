"""One Slurm run of a job, as ``sia-launch`` sees it: its rendezvous port, the evidence of how
far it got, and how it ended.

A run's launcher must tell the controller whether the job's own code failed (that spends the
job's ``--max-failures``) or whether Slurm ended the run under it (a launch Slurm refused, a
node that failed, a rendezvous that never formed: the run is brought back from its
checkpoint). ``srun``'s exit status alone cannot: it is 1 when Slurm could not even start the
tasks ("Unable to confirm allocation for job J: Job is pending execution", seen after a
slurmctld restart), and 0 after "Node failure on N" for a run whose trainer was killed after
33 s of a long training (both seen in the chaos soak, docs/reliability.md). So the job side
leaves *evidence* in ``jobs/<id>/``, one file per fact, named by the Slurm run (job id and
restart count) that wrote it, read by this run's launcher only (the controller reads the
launcher's verdict, ``exit-<run>.json``):

``task-<job>.<restart>.<node>``
    :mod:`sia_slurm.job.agent` started on that node (``srun`` launched the task), before torch is
    imported.
``rdzv-<job>.<restart>.<node>``
    that node's agent failed to form the c10d rendezvous (the port taken by another program,
    peers that never came): the text of the error.
``training-<job>.<restart>.json``
    :class:`sia_slurm.job.elastic.ElasticTrainer` (rank 0) began training in this run, and how its
    process ended: ``completed`` (all steps done), ``exited`` (the script returned without an
    exception before that), ``stopped`` (for the controller), ``terminated`` (a signal), or
    nothing when the process was killed before it could say.

:func:`run_end` turns the status and the evidence into the run's
:class:`~sia_slurm.protocol.ExitCause`. The user owns these files: forging them can only
misclassify the user's own job, which the exit record already lets them do.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import json
import logging
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.protocol import (
    Assignment,
    ExitCause,
    MetricsReport,
    ProtocolError,
    StatePaths,
    StopRequest,
    read_document,
)
from sia_slurm.safefiles import read_json, write_json_atomic
from sia_slurm.slurm.records import parse_records
from sia_slurm.slurm.runner import CommandError, CommandRunner

logger = logging.getLogger("sia-launch")

EXIT_OK = 0
EXIT_STOPPED = 75  # stopped on request, checkpointed and acknowledged (EX_TEMPFAIL)
EXIT_SUPERSEDED = 76  # the job runs in another Slurm run now; this one was left behind
EXIT_ABORTED = 77  # srun exited 0 but the trainer was killed before it ended by itself

# How the trainer's process ended (``training-<run>.json``'s ``end``).
TRAINING_ENDS = ("completed", "exited", "stopped", "terminated")
# The ends that are not the trainer's own doing, as the verdict says them.
_UNENDED = {
    None: "was killed",
    "terminated": "was terminated by a signal",
    "stopped": "stopped for a stop request this run did not acknowledge",
}


class RunError(RuntimeError):
    """The run cannot go on (no rendezvous port); ``sia-launch`` exits non-zero with it."""


# ------------------------------------------------------------------------------------------------
# The evidence files


def _run(slurm_job_id: str, restart_count: int) -> str:
    if not slurm_job_id.isdigit() or restart_count < 0:
        raise ProtocolError(f"Slurm run {slurm_job_id!r}.{restart_count}: not a job id and count")
    return f"{slurm_job_id}.{restart_count}"


def task_name(slurm_job_id: str, restart_count: int, node_id: int) -> str:
    return f"task-{_run(slurm_job_id, restart_count)}.{int(node_id)}"


def rendezvous_name(slurm_job_id: str, restart_count: int, node_id: int) -> str:
    return f"rdzv-{_run(slurm_job_id, restart_count)}.{int(node_id)}"


def training_name(slurm_job_id: str, restart_count: int) -> str:
    return f"training-{_run(slurm_job_id, restart_count)}.json"


@dataclass(frozen=True)
class TrainingRecord:
    """What rank 0's trainer said of this run: its step when it last wrote, and how its
    process ended (``None``: it began and never said, so it was killed)."""

    steps: int
    end: str | None = None


@dataclass(frozen=True)
class RunEvidence:
    """What the job side recorded about one run (module docstring)."""

    tasks_started: int = 0
    rendezvous_failures: tuple[str, ...] = ()
    training: TrainingRecord | None = None
    slurm_ended: str = ""  # what Slurm says ended the run under srun (a node failed), if it did


def write_training(
    job_dir: Path, slurm_job_id: str, restart_count: int, record: TrainingRecord
) -> None:
    """Rank 0's trainer states how far this run got (atomic; a failure is logged, not raised:
    without the file the launcher judges the run as it did before it existed)."""
    try:
        payload = {"steps": record.steps, "end": record.end, "time": time.time()}
        write_json_atomic(job_dir / training_name(slurm_job_id, restart_count), payload)
    except (OSError, ProtocolError) as exc:
        logger.warning(
            "cannot record the training of run %s.%d: %s", slurm_job_id, restart_count, exc
        )


class TrainingRecorder:
    """Rank 0's trainer's side of ``training-<run>.json``: it began (at construction), then
    how its process ended, the first end said winning. A process that returns or calls
    ``sys.exit`` without an unhandled exception and without saying otherwise ``exited``; one
    killed says nothing. Inactive (writes nothing) off rank 0 or outside ``sia-launch``."""

    def __init__(
        self, job_dir: Path, slurm_job_id: str, restart_count: int, steps: Callable[[], int]
    ):
        self._where = (job_dir, slurm_job_id, restart_count)
        self._steps = steps
        self._end: str | None = None
        write_training(*self._where, TrainingRecord(steps()))
        atexit.register(self._at_exit)

    @classmethod
    def for_rank(
        cls, env: JobEnvironment, rank: int, steps: Callable[[], int]
    ) -> TrainingRecorder | None:
        """The recorder of a trainer of ``env``'s run: rank 0 under ``sia-launch`` only (no
        Slurm run: a standalone process, which no launcher judges)."""
        if rank != 0 or not env.slurm_job_id:
            return None
        job_dir = StatePaths(env.state_dir).job_dir(env.sia_id)
        return cls(job_dir, env.slurm_job_id, env.restarts, steps)

    def ended(self, end: str) -> None:
        if self._end is None:
            self._end = end
            write_training(*self._where, TrainingRecord(self._steps(), end))

    def _at_exit(self) -> None:
        if getattr(sys, "last_value", None) is None:  # set by an unhandled exception
            self.ended("exited")


def mark_task(
    job_dir: Path, slurm_job_id: str, restart_count: int, node_id: int, text: str = ""
) -> None:
    """The agent's mark that ``srun`` started its task on node ``node_id``."""
    _touch(job_dir / task_name(slurm_job_id, restart_count, node_id), text)


def mark_rendezvous_failure(
    job_dir: Path, slurm_job_id: str, restart_count: int, node_id: int, error: str
) -> None:
    """The agent's mark that its rendezvous failed (with the error's text)."""
    _touch(job_dir / rendezvous_name(slurm_job_id, restart_count, node_id), error[:2000])


def _touch(path: Path, text: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
    except OSError as exc:
        logger.warning("cannot write %s: %s", path, exc)


def read_evidence(job_dir: Path, slurm_job_id: str, restart_count: int) -> RunEvidence:
    """This run's evidence; files of other runs are ignored, a malformed one is read as
    absent (and said)."""
    run = _run(slurm_job_id, restart_count)
    tasks, failures = 0, []
    for path in _own_files(job_dir, (f"task-{run}.", f"rdzv-{run}.")):
        if path.name.startswith("task-"):
            tasks += 1
        else:
            failures.append(_read_text(path))
    return RunEvidence(
        tasks, tuple(failures), _read_training(job_dir / training_name(slurm_job_id, restart_count))
    )


def clear_evidence(job_dir: Path, slurm_job_id: str, restart_count: int) -> None:
    """Remove this run's evidence once its verdict is written (the verdict quotes it)."""
    run = _run(slurm_job_id, restart_count)
    for path in _own_files(job_dir, (f"task-{run}.", f"rdzv-{run}.", f"training-{run}.json")):
        with contextlib.suppress(OSError):
            path.unlink()


def _own_files(job_dir: Path, prefixes: tuple[str, ...]) -> Iterator[Path]:
    try:
        names = os.listdir(job_dir)
    except OSError:
        return
    for name in sorted(names):
        if name.startswith(prefixes):
            yield job_dir / name


def _read_text(path: Path) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(2000).decode("utf-8", "replace").strip()
    except OSError as exc:
        return f"({path.name}: {os.strerror(exc.errno or errno.EIO)})"


def _read_training(path: Path) -> TrainingRecord | None:
    if not path.exists():
        return None
    try:
        payload = read_json(path)
        steps, end = payload.get("steps"), payload.get("end")
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0:
            raise ProtocolError(f"{path}: steps: expected an integer >= 0, got {steps!r}")
        if end is not None and end not in TRAINING_ENDS:
            raise ProtocolError(
                f"{path}: end: expected one of {', '.join(TRAINING_ENDS)} or null, got {end!r}"
            )
        return TrainingRecord(steps, end)
    except ProtocolError as exc:
        logger.warning("%s; read as a run whose training never began", exc)
        return None


# Node states in which a node cannot be running the job's tasks any more. Not POWER_DOWN: a
# busy node an administrator asked to power down once idle reads MIXED+POWER_DOWN and runs its
# jobs on (seen on 22.05; POWER_DOWN_FORCE requeues them: the job is then no longer RUNNING).
_DEAD_NODE = frozenset({"DOWN", "NOT_RESPONDING", "FAIL", "FAILING", "POWERING_DOWN",
                        "POWERED_DOWN", "REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED"})  # fmt: skip


def slurm_ended(runner: CommandRunner, job_id: str, restart_count: int, node_list: str) -> str:
    """What Slurm says ended this run under ``srun`` ("" when nothing did, or when Slurm
    cannot be asked): the job no longer RUNNING in this run (requeued after a node failure,
    NODE_FAIL), or one of its nodes DOWN or not responding. Asked after ``srun`` exited,
    while this batch step still runs: for a run that ended by itself Slurm still says
    RUNNING, on healthy nodes."""
    try:
        jobs = parse_records(runner.run(["scontrol", "-o", "show", "job", job_id]).stdout)
        nodes = parse_records(runner.run(["scontrol", "-o", "show", "node", node_list]).stdout)
    except CommandError as exc:
        logger.warning("cannot ask Slurm how the run ended: %s", exc)
        return ""
    if len(jobs) != 1:
        return ""
    job = jobs[0]
    state, restarts = job.get("JobState", ""), job.get("Restarts", "")
    if state != "RUNNING" or restarts != str(restart_count):
        reason = job.get("Reason", "?")
        return f"job {job_id} is {state} (reason {reason}, restarts {restarts})"
    dead = [f"{n.get('NodeName')} {n.get('State')}" for n in nodes
            if _DEAD_NODE & _flags(n.get("State", ""))]  # fmt: skip
    return f"node {', '.join(dead)}" if dead else ""


def _flags(state: str) -> set[str]:
    """A node state's words (``DOWN*`` -> DOWN, NOT_RESPONDING; sinfo's other marks dropped),
    so that POWER_DOWN is no DOWN."""
    return set(re.split(r"[+~#!%$@^]", state.upper().replace("*", "+NOT_RESPONDING")))


# ------------------------------------------------------------------------------------------------
# The verdict


def run_end(status: int, evidence: RunEvidence) -> tuple[int, ExitCause, str]:
    """``(exit status, cause, message)`` of a run whose ``srun`` exited with ``status`` (the
    launcher's own cases, stopped on request, left behind, terminated, come first).

    A trainer that completed makes the run COMPLETED whatever ``srun`` says (a rank was seen
    to die with SIGABRT after the last step). Otherwise, a run Slurm itself ended (one of its
    nodes DOWN, the job requeued or no longer running: ``slurm_ended``) was aborted whatever
    ``srun``'s status: after "Node failure on N", srun exits 0 on Slurm 22.05, 1 on 24.11 and 26.05.
    With status 0, a trainer that began and never
    ended by itself was killed under ``srun`` (a node failure): not the job's doing, and the
    launcher exits :data:`EXIT_ABORTED` so Slurm does not record a completion. A trainer that
    began the controller's stop (SIGUSR1, the controller's, not Slurm's) and died before
    acknowledging it, with a non-zero status while Slurm says the run still runs on live
    nodes, died by its own code (the soak killed rank 0 writing its stop checkpoint): a
    controller that gives up on the acknowledgement requeues the job, which Slurm then says.
    With a non-zero status, a run whose tasks never started, or whose rendezvous failed, was
    not launched by Slurm and torchrun as asked; only a run that got that far and then failed
    is the job's own failure. A command that does not use the trainer leaves no training
    record: its status is all there is.
    """
    training = evidence.training
    completed = training is not None and training.end == "completed"
    if evidence.slurm_ended and not completed:
        return EXIT_ABORTED, ExitCause.ABORTED, (
            f"srun exited {status} and Slurm ended the run under it: {evidence.slurm_ended}"
        )  # fmt: skip
    if training is not None and training.end == "completed":
        after = "" if status == EXIT_OK else f" (srun exited {status} after it)"
        return (
            EXIT_OK,
            ExitCause.COMPLETED,
            f"training completed after {training.steps} steps{after}",
        )
    if training is not None and training.end in (None, "terminated", "stopped"):
        how = _UNENDED[training.end]
        if status == EXIT_OK or training.end == "terminated":
            return EXIT_ABORTED, ExitCause.ABORTED, (
                f"the trainer {how} at step {training.steps} without ending by itself and "
                f"srun exited {status}: Slurm ended the run under it (a node failure?)"
            )  # fmt: skip
        if training.end == "stopped":
            return status, ExitCause.FAILED, (
                f"the trainer died inside the stop it began at step {training.steps} (its "
                f"checkpoint never acknowledged) and srun exited {status}, Slurm ending nothing "
                "under it: the job's own code"
            )  # fmt: skip
    if status == EXIT_OK:
        return EXIT_OK, ExitCause.COMPLETED, "training completed"
    if evidence.rendezvous_failures:
        return status, ExitCause.LAUNCH_FAILED, (
            f"the rendezvous failed (srun exited {status}): {evidence.rendezvous_failures[0]}"
        )  # fmt: skip
    if evidence.tasks_started == 0:
        return status, ExitCause.LAUNCH_FAILED, (
            f"srun started no task of this run and exited {status}: Slurm did not launch it"
        )  # fmt: skip
    return status, ExitCause.FAILED, f"the training command exited with status {status}"


# ------------------------------------------------------------------------------------------------
# The controller's files, as this run reads them


def stopped_on_request(
    paths: StatePaths, sia_id: str, launch_round: int, job_id: str, restart_count: int
) -> bool:
    """Whether this run stopped for a stop request of a later round and acknowledged it."""
    path = paths.stop_request(sia_id)
    if not path.exists():
        return False
    try:
        stop = read_document(StopRequest, path)
    except ProtocolError:
        return False
    if stop.round_index <= launch_round:
        return False
    return paths.ack(sia_id, stop.round_index, job_id, restart_count).exists()


def superseded_by(
    paths: StatePaths,
    sia_id: str,
    job_id: str,
    restart_count: int,
    hostnames: Sequence[str] = (),
) -> Assignment | None:
    """The assignment that hands the job to another Slurm run than this one (on
    ``hostnames``), if the controller has written one: this run was left behind and its
    workers stopped for it (:meth:`Assignment.hands_over`)."""
    path = paths.assignment(sia_id)
    try:
        assignment = read_document(Assignment, path) if path.exists() else None
    except ProtocolError:
        return None
    if assignment is None or not assignment.hands_over(job_id, restart_count, hostnames):
        return None
    return assignment


def await_successor(
    paths: StatePaths,
    successor: Assignment,
    terminated: Callable[[], bool],
    wait_s: float,
    *,
    poll_s: float = 1.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Keep a run that was left behind from exiting until its successor trains (a metrics
    report from the Slurm run its assignment names), Slurm terminates it, or ``wait_s``
    passes; whether the successor was seen.

    The batch step's exit reaches slurmctld as the job's completion. Once the successor runs
    on another node, Slurm 22.05 refuses it ("Batch completion ... sent from wrong node"); while
    the requeued job is still pending, slurmctld applies it to the pending job (seen:
    "_job_complete: JobId=J WEXITSTATUS 76 ... cancelled by interactive user" between the
    controller's release and Slurm's allocation; the job did start afterwards, but nothing
    should depend on that). The workers have exited already: waiting holds no GPU."""
    deadline = clock() + wait_s
    run = (successor.slurm_job_id, successor.slurm_restart_count)
    while not terminated() and clock() < deadline:
        try:
            report = read_document(MetricsReport, paths.metrics(successor.sia_id))
        except ProtocolError:
            report = None
        if (
            report is not None
            and (report.slurm_job_id, report.slurm_restart_count) == run
            and report.round_index >= successor.round_index  # not this run's own (same id)
        ):
            return True
        sleep(poll_s)
    return False


# ------------------------------------------------------------------------------------------------
# The rendezvous port

# The rendezvous port is chosen below the kernel's ephemeral range: a port the kernel handed
# out (bind to port 0) and the probe closed again can be handed out once more before torchrun
# binds it. Seen in the chaos soak: srun took it for an I/O socket of its own, the rendezvous
# timed out after 60 s and the run exited 1, recorded as the job's own failure.
RDZV_PORTS = range(29500, 32768)
EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOCK_PREFIX = "sia-slurm-rdzv-"


class PortReservation:
    """A rendezvous port held for one run: an abstract Unix socket named after the port.

    The name is bound atomically host-wide (per network namespace) and released by the
    kernel when the holder exits however it exits, so two launchers on one node, of any
    users, never pick the same port between one's probe and torchrun's bind; no file is
    left behind and no directory has to be shared. A program outside sia-slurm can still
    bind the port in that gap: node 0's agent then fails to host the store (it is told it is
    the host, ``sia_slurm.job.agent``) instead of joining a stranger's, and the run ends as a
    failed launch, not as the job's failure."""

    def __init__(self, port: int, lock: socket.socket):
        self.port = port
        self._lock = lock

    def release(self) -> None:
        self._lock.close()


def reserve_port(seed: int = 0, ports: range = RDZV_PORTS) -> PortReservation:
    """A TCP port free on this host (the batch step runs on the job's first node), from
    ``ports`` minus the kernel's ephemeral range, tried from position ``seed`` on (random in
    ``sia-launch``, so that jobs sharing a node rarely contend), and reserved."""
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE.read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999  # Linux's default
    candidates = [p for p in ports if not low <= p <= high]
    if not candidates:
        raise RunError(f"no rendezvous port in {ports.start}-{ports.stop - 1} outside the "
                       f"ephemeral range {low}-{high} ({EPHEMERAL_RANGE})")  # fmt: skip
    start = seed % len(candidates)
    for port in candidates[start:] + candidates[:start]:
        lock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            lock.bind(f"\0{LOCK_PREFIX}{port}")
        except OSError:
            lock.close()
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind(("", port))
            except OSError:
                lock.close()
                continue
        return PortReservation(port, lock)
    raise RunError(f"no free rendezvous port in {ports.start}-{ports.stop - 1}")


def agent_options(environ: Mapping[str, str]) -> list[str]:
    """The torchrun options :mod:`sia_slurm.job.agent` adds on its node: node 0 (the batch host,
    whose address is the rendezvous endpoint) hosts the c10d store and every other node is a
    client. Told so, torchrun fails when the port is taken instead of joining whatever store
    listens there (its default guesses the host from the address and falls back to client)."""
    node_id = environ.get("SLURM_NODEID", "")
    if not node_id.isdigit():
        return []
    return [f"--rdzv-conf=is_host={'true' if int(node_id) == 0 else 'false'}"]


def dumps(evidence: RunEvidence) -> str:
    """The evidence, as the launcher's log line quotes it."""
    training = evidence.training
    return json.dumps({
        "tasks_started": evidence.tasks_started,
        "rendezvous_failures": len(evidence.rendezvous_failures),
        "training": None if training is None else {"steps": training.steps, "end": training.end},
        "slurm_ended": evidence.slurm_ended,
    })  # fmt: skip
