"""The job protocol: the files the controller and a managed job exchange under ``state_dir``.

Both sides import this module, so the formats are defined once (``docs/protocol.md`` describes
them for people). Two trees, by who may write them (``docs/security.md``)::

    control/<sia_id>/assignment.json  by the controller before release      (Assignment)
    control/<sia_id>/stop.json        by the controller to ask for a stop   (StopRequest)
    control/<sia_id>/slurm.json       the controller's record of the job    (backend's own)
    jobs/<sia_id>/spec.json           by sia-sbatch at submission           (JobSpec)
    jobs/<sia_id>/profile.json        by sia-sbatch, a --profile DIR copied (model.profile_json)
    jobs/<sia_id>/ack-<round>.<run>   by rank 0 after its checkpoint        (empty file)
    jobs/<sia_id>/metrics.json        by rank 0 every ~30 s                 (MetricsReport)
    jobs/<sia_id>/exit-<run>.json     by the launcher when a run ends       (RunExit)
    jobs/<sia_id>/refusal-<run>.json  by the launcher that will not train   (RunRefusal)

``control/`` belongs to the controller's account and users can only read it; ``jobs/`` is
sticky and world-writable (like /tmp), each ``jobs/<sia_id>/`` belongs to the job's user. The
controller never writes under ``jobs/`` and reads it only through :mod:`sia_slurm.userfiles`.

Every file is written atomically (temporary file in the same directory, fsync, rename:
:mod:`sia_slurm.safefiles`), so a reader sees either the old or the new content, never a torn
one. Every reader validates the whole file and raises :class:`ProtocolError` naming the file
and the field; nothing here guesses a default for a missing field except the ones documented
on each dataclass.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from enum import StrEnum
from pathlib import Path
from typing import Any, TypeVar

from sia_slurm.core import JobKind
from sia_slurm.safefiles import (
    MAX_FILE_BYTES,
    ProtocolError,
    read_json,
    write_json_atomic,
)

PROTOCOL_VERSION = 1
SIA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")

# Bounds of every field (docs/protocol.md, "Bounds of every field", is :func:`bounds_table`)
MAX_GPUS = 100_000  # GPUs (and nodes) of one job: past any cluster sia-slurm schedules
MAX_BATCH = 2**24  # samples in one global or per-GPU batch
MAX_ACCUM = 2**16  # extra micro-batches per step
MAX_SECONDS = 1e11  # a time on either clock (year 5138), or a duration
MAX_STEP_SECONDS = 86_400.0  # one micro-batch
MAX_GRAD_STAT = 1e30  # a gradient statistic (squared norm, variance)
MAX_COUNT = 2**62  # rounds, steps
MAX_RESTARTS = 10**9
MAX_UID = 2**32 - 1
MAX_MESSAGE_CHARS = 2000

# Names that reach Slurm's command lines, file names and terminals: one printable token
# (matched whole, with ``fullmatch``: ``$`` would let a trailing newline through).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-]{0,63}")
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}")
JOB_ID = re.compile(r"[0-9]{0,20}")  # a Slurm job id, or "" for none
_LINE = re.compile(r"[^\n\t]*")  # one line (the reader refuses the other control characters)


# ------------------------------------------------------------------------------------------------
# Paths


@dataclass(frozen=True)
class StatePaths:
    """Where each protocol file of ``state_dir`` lives (no I/O)."""

    state_dir: Path

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def control_dir(self) -> Path:
        return self.state_dir / "control"

    def job_dir(self, sia_id: str) -> Path:
        """The job's own directory (its user's): spec, acks, metrics, checkpoints."""
        return self.jobs_dir / check_sia_id(sia_id)

    def control(self, sia_id: str) -> Path:
        """The controller's directory for the job: what it decided and remembers."""
        return self.control_dir / check_sia_id(sia_id)

    def spec(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / SPEC_FILE

    def assignment(self, sia_id: str) -> Path:
        return self.control(sia_id) / "assignment.json"

    def stop_request(self, sia_id: str) -> Path:
        return self.control(sia_id) / "stop.json"

    def slurm_record(self, sia_id: str) -> Path:
        return self.control(sia_id) / "slurm.json"

    def batch_copy(self, sia_id: str) -> Path:
        """The controller's private copy of the job's batch script (for a resubmission)."""
        return self.control(sia_id) / "batch-script"

    def ack(self, sia_id: str, round_index: int, slurm_job_id: str, restart_count: int) -> Path:
        return self.job_dir(sia_id) / ack_name(round_index, slurm_job_id, restart_count)

    def metrics(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / METRICS_FILE

    def profile(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / PROFILE_FILE

    def profiled(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / PROFILED_FILE


SPEC_FILE = "spec.json"
METRICS_FILE = "metrics.json"
PROFILE_FILE = "profile.json"  # a job's own profile (sia_slurm/model/profile_json.py)
# What a profiling run measured (the same document format, one entry per GPU type measured so
# far), written by the job's rank 0: docs/profiling.md
PROFILED_FILE = "profiled.json"
MAX_SWEEP = 32  # per-GPU batches one profiling run measures
MAX_FAILURES = 100  # the largest retry budget a job may ask for (``--max-failures``)


def ack_name(round_index: int, slurm_job_id: str, restart_count: int) -> str:
    """The acknowledgement of the stop of ``round_index`` by one Slurm run (job id and
    restart count): ``ack-<round>.<job id>.<restart>``. An ack names the run that wrote it, so
    one left by another run (or from before a reset of the controller's round count) never
    answers a stop of this run."""
    if not slurm_job_id.isdigit() or restart_count < 0 or round_index < 0:
        raise ProtocolError(
            f"ack of round {round_index} by Slurm run {slurm_job_id!r}.{restart_count}: "
            "not a round, job id and count"
        )
    return f"ack-{round_index}.{slurm_job_id}.{restart_count}"


def exit_name(slurm_job_id: str, restart_count: int, kind: str = "exit") -> str:
    """One Slurm run's :class:`RunExit` file: ``exit-<job id>.<restart>.json`` (or ``kind``)."""
    if not slurm_job_id.isdigit() or restart_count < 0:
        raise ProtocolError(f"Slurm run {slurm_job_id!r}.{restart_count}: not a job id and count")
    return f"{kind}-{slurm_job_id}.{restart_count}.json"


def refusal_name(slurm_job_id: str, restart_count: int) -> str:
    """The file name of one Slurm run's :class:`RunRefusal`: ``refusal-<job>.<restart>.json``."""
    return exit_name(slurm_job_id, restart_count, "refusal")


def check_sia_id(sia_id: str) -> str:
    """``sia_id`` if it is a safe file name (letters, digits, ``_.-``; at most 64), else raise."""
    if not isinstance(sia_id, str) or not SIA_ID.fullmatch(sia_id):
        raise ProtocolError(
            f"sia job id: expected 1-64 letters, digits, '_', '.' or '-' (not starting with "
            f"a punctuation mark), got {sia_id!r}"
        )
    return sia_id


# ------------------------------------------------------------------------------------------------
# The three documents


@dataclass(frozen=True)
class JobSpec:
    """What the user asked for, recorded by ``sia-sbatch`` (and by the simulator per workload job).

    ``init_batch_size`` is M0. ``max_gpus`` ``None`` means "as many as the batch limits allow".
    ``requested_gpus`` / ``requested_gpu_type`` are the size rigid, pinned, FIFO and Gavel jobs
    run at, and ``requested_batch_size`` the global batch they run with (0: M0; an adaptive job
    starts from M0 whatever it requested, since M0 is what its gradient statistics refer to).
    ``restart_cost`` is the seconds a restart costs this job (``None``: the policy's default).
    ``profile`` names the app profile (``profiles/<app>/``) or a profile directory.
    """

    sia_id: str
    app: str
    kind: JobKind = JobKind.ADAPTIVE
    init_batch_size: int = 0  # 0: the profile's
    max_batch_size: int = 0  # 0: the profile's
    min_gpus: int = 1
    max_gpus: int | None = None
    requested_gpus: int = 1
    requested_gpu_type: str | None = None
    requested_batch_size: int = 0  # 0: M0
    restart_cost: float | None = None
    submit_time: float = 0.0
    checkpoint_dir: str = ""
    command: tuple[str, ...] = ()
    profile: str | None = None
    owner_uid: int | None = None
    max_failures: int = 0  # runs its own code may fail and still be brought back
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        check_sia_id(self.sia_id)
        object.__setattr__(self, "kind", JobKind(self.kind))
        if not 0 <= self.max_failures <= MAX_FAILURES:
            raise ProtocolError(
                f"max_failures: expected an integer 0..{MAX_FAILURES}, got {self.max_failures}"
            )
        object.__setattr__(self, "command", tuple(self.command))
        if self.min_gpus < 1 or self.requested_gpus < 1:
            raise ProtocolError("min_gpus, requested_gpus: expected integers >= 1")
        if self.max_gpus is not None and self.max_gpus < self.min_gpus:
            raise ProtocolError(f"max_gpus: {self.max_gpus} is below min_gpus {self.min_gpus}")
        if self.init_batch_size < 0 or self.max_batch_size < 0 or self.requested_batch_size < 0:
            raise ProtocolError(
                "init_batch_size, max_batch_size, requested_batch_size: expected integers >= 0"
            )
        if self.max_batch_size and self.init_batch_size > self.max_batch_size:
            raise ProtocolError(
                f"init_batch_size: {self.init_batch_size} exceeds max_batch_size "
                f"{self.max_batch_size}"
            )


@dataclass(frozen=True)
class Assignment:
    """The controller's decision for one job, read by the launcher before it starts training.

    ``round_index`` increases with every decision for the job; the launcher compares it with
    the round of its checkpoint. ``accum_steps`` counts *extra* micro-batches (Pollux's
    convention), so ``batch_size == gpus * local_bsz * (accum_steps + 1)``.
    ``slurm_job_id`` and ``slurm_restart_count`` name the one Slurm run the assignment is for
    (``SLURM_JOB_ID``, ``SLURM_RESTART_COUNT``): the launcher trains only in that run, and the
    controller stops any other run of the job that holds GPUs. ``restarts`` counts restarts
    over the job's whole life (across resubmissions). ``not_before`` is the controller's own
    book-keeping (the launcher ignores it): the earliest second, on slurmctld's clock, that a
    requeued run may be launched (``commands.relaunch_floor``; 0 when there is none), kept
    here so that a controller restarted mid-start brings the run forward to the same second.
    ``profile_sweep`` makes the run a profiling run (Sia's profiling of a new model,
    docs/profiling.md): before training at the assignment's batch, the job measures its steps
    on this GPU type at each of these per-GPU batches, in order, up to the largest that fits,
    and writes what it measured to :data:`PROFILED_FILE`. Empty for every other run.
    """

    sia_id: str
    round_index: int
    gpu_type: str
    partition: str
    nodes: int
    gpus: int
    node_list: tuple[str, ...]
    batch_size: int
    local_bsz: int
    accum_steps: int
    restarts: int = 0
    slurm_job_id: str = ""
    slurm_restart_count: int = 0
    not_before: float = 0.0
    profile_sweep: tuple[int, ...] = ()
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        check_sia_id(self.sia_id)
        object.__setattr__(self, "node_list", tuple(self.node_list))
        object.__setattr__(self, "profile_sweep", tuple(self.profile_sweep))
        if self.profile_sweep and (
            self.gpus != 1 or list(self.profile_sweep) != sorted(set(self.profile_sweep))
        ):
            raise ProtocolError(
                "profile_sweep: expected increasing per-GPU batches, on one GPU, got "
                f"{list(self.profile_sweep)} on {self.gpus} GPUs"
            )
        if self.restarts < 0 or self.slurm_restart_count < 0:
            raise ProtocolError("restarts, slurm_restart_count: expected integers >= 0")
        if not (math.isfinite(self.not_before) and self.not_before >= 0):
            raise ProtocolError(f"not_before: expected seconds >= 0, got {self.not_before}")
        if self.nodes < 1 or self.gpus < self.nodes or self.gpus % self.nodes:
            raise ProtocolError(
                f"nodes, gpus: expected gpus a multiple of nodes >= 1, got nodes={self.nodes} "
                f"gpus={self.gpus}"
            )
        if self.node_list and len(self.node_list) != self.nodes:
            raise ProtocolError(f"node_list: {len(self.node_list)} names for nodes={self.nodes}")
        if self.local_bsz < 1 or self.accum_steps < 0:
            raise ProtocolError("local_bsz >= 1 and accum_steps >= 0 expected")
        if self.batch_size != self.gpus * self.local_bsz * (self.accum_steps + 1):
            raise ProtocolError(
                f"batch_size: {self.batch_size} != gpus*local_bsz*(accum_steps+1) = "
                f"{self.gpus * self.local_bsz * (self.accum_steps + 1)}"
            )

    @property
    def gpus_per_node(self) -> int:
        return self.gpus // self.nodes

    def hands_over(self, job_id: str, restart_count: int, hostnames: Sequence[str] = ()) -> bool:
        """Whether this assignment gives the job to another Slurm run than the one on
        ``hostnames`` with this job id and restart count: that run was left behind.

        The run's identity alone is not enough: a slurmctld killed right after it launched a
        run comes back from the state it saved before, with the job pending at the same
        restart count, and launches that identity again elsewhere (seen on 24.11: job 57
        restart 3 started on rtx-[1-2], then on a100-[1-2]). A run keeps its nodes for its
        whole life (a rebatch keeps ``node_list``), so other nodes mean another run. An
        assignment that names no run, or no nodes, proves nothing."""
        if not self.slurm_job_id:
            return False
        if (self.slurm_job_id, self.slurm_restart_count) != (job_id, restart_count):
            return True
        listed = bool(self.node_list) and bool(hostnames)
        return listed and sorted(self.node_list) != sorted(hostnames)


@dataclass(frozen=True)
class MetricsReport:
    """What a running job measured, as rank 0 reports it (and as the simulator reports it).

    ``step_time`` is the mean time of a synchronising micro-batch and ``sync_time`` the part of
    it spent in the gradient all-reduce after compute (so ``0 <= sync_time < step_time``), the
    meaning :class:`sia_slurm.model.Observation` takes. ``grad_sqr`` / ``grad_var`` are the
    gradient noise statistics normalised to M0. ``steps`` counts optimizer steps since the job
    first started; ``time`` is when the report was written (seconds since the epoch, or the
    simulated clock). ``slurm_job_id`` and ``slurm_restart_count`` name the Slurm run that
    wrote it: the controller takes a report only from the job's current run, so a report left
    by the run before a restart never makes a restarted job look RUNNING.
    """

    sia_id: str
    time: float
    gpu_type: str
    nodes: int
    gpus: int
    local_bsz: int
    accum_steps: int
    step_time: float
    sync_time: float
    grad_sqr: float
    grad_var: float
    steps: int = 0
    round_index: int = 0
    slurm_job_id: str = ""
    slurm_restart_count: int = 0
    node_list: tuple[str, ...] = ()
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        check_sia_id(self.sia_id)
        object.__setattr__(self, "node_list", tuple(self.node_list))
        if self.slurm_restart_count < 0:
            raise ProtocolError("slurm_restart_count: expected an integer >= 0")
        if self.node_list and len(self.node_list) != self.nodes:
            raise ProtocolError(f"node_list: {len(self.node_list)} names for nodes={self.nodes}")
        if self.nodes < 1 or self.gpus < self.nodes:
            raise ProtocolError(
                f"nodes, gpus: expected 1 <= nodes <= gpus, got {self.nodes}, {self.gpus}"
            )
        if self.local_bsz < 1 or self.accum_steps < 0 or self.steps < 0:
            raise ProtocolError("local_bsz >= 1, accum_steps >= 0 and steps >= 0 expected")
        for name in ("time", "step_time", "grad_sqr", "grad_var"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ProtocolError(f"{name}: expected a finite number >= 0, got {value!r}")
        if not self.step_time > 0:
            raise ProtocolError(f"step_time: expected > 0, got {self.step_time!r}")
        if not (math.isfinite(self.sync_time) and 0 <= self.sync_time < self.step_time):
            raise ProtocolError(
                f"sync_time: expected 0 <= sync_time < step_time ({self.step_time}), "
                f"got {self.sync_time!r}"
            )


@dataclass(frozen=True)
class StopRequest:
    """The controller asks a running job to checkpoint and stop (written before it signals).

    The job polls this file (and reacts to SIGUSR1 as a wake-up); all ranks stop at the same
    step, rank 0 checkpoints, then writes ``ack-<round_index>.<its Slurm run>``
    (:func:`ack_name`). The controller then requeues
    the job, so the job must not treat the stop as the end of training.
    """

    sia_id: str
    round_index: int
    time: float = 0.0
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        check_sia_id(self.sia_id)
        if self.round_index < 0:
            raise ProtocolError(f"round_index: expected >= 0, got {self.round_index}")


class ExitCause(StrEnum):
    """Why a run's launcher exited, as the launcher saw it (:class:`RunExit`)."""

    COMPLETED = "completed"  # the training command exited 0: training is done
    STOPPED = "stopped"  # stopped on the controller's request, checkpointed and acknowledged
    FAILED = "failed"  # the training command exited non-zero by itself: the user's code
    INVALID = "invalid"  # the job cannot be launched as submitted (bad spec, command, profile)
    REFUSED = "refused"  # Slurm's allocation is not the controller's grant: the controller's
    TERMINATED = "terminated"  # Slurm (or the controller) signalled the launcher to end
    SUPERSEDED = "superseded"  # the controller runs the job in another Slurm run now: this
    # run was left behind (its slurmd died while Slurm requeued the job) and exited unasked
    LAUNCH_FAILED = "launch_failed"  # srun started no task, or the rendezvous never formed:
    # Slurm or the node did not launch what was asked (the job's code never ran)
    ABORTED = "aborted"  # the trainer was killed without ending by itself while srun exited 0
    # (a node failure): Slurm ended the run under the job (sia_slurm/job/runs.py)

    @property
    def users_fault(self) -> bool:
        """Whether a run that ended so failed through the job itself (counts against its
        ``max_failures``); any other failed run was ended by Slurm or the controller."""
        return self in (ExitCause.FAILED, ExitCause.INVALID)


@dataclass(frozen=True)
class RunExit:
    """How one Slurm run of a job ended, written by its launcher as it exits.

    The controller tells a job whose own code failed from one that Slurm ended (a node that
    failed, a launch Slurm refused, a run killed from outside) by this file: a run that Slurm
    reports FAILED and that left no ``exit-<run>.json`` (or one whose cause is not the job's)
    did not fail by itself and is brought back from its checkpoint (``docs/protocol.md``).
    The user owns the file: all it can do is spend its own job's retry budgets.
    """

    sia_id: str
    slurm_job_id: str
    slurm_restart_count: int
    cause: str
    status: int
    time: float = 0.0
    message: str = ""
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        check_sia_id(self.sia_id)
        exit_name(self.slurm_job_id, self.slurm_restart_count)  # validates both
        try:
            ExitCause(self.cause)
        except ValueError:
            known = ", ".join(c.value for c in ExitCause)
            raise ProtocolError(f"cause: expected one of {known}, got {self.cause!r}") from None
        if len(self.message) > MAX_MESSAGE_CHARS:
            object.__setattr__(self, "message", self.message[:MAX_MESSAGE_CHARS])

    @property
    def exit_cause(self) -> ExitCause:
        return ExitCause(self.cause)


@dataclass(frozen=True)
class RunRefusal:
    """A launcher's refusal to train in the very run its assignment names (job id, restart
    count, ``node_list``): Slurm's allocation as the batch step sees it is not the assignment,
    though ``scontrol`` may show the grant (seen after a slurmd restart). The controller
    requeues and holds that run at its next round; a user can only requeue their own job."""

    sia_id: str
    slurm_job_id: str
    slurm_restart_count: int
    node_list: tuple[str, ...]
    round_index: int  # of the assignment refused
    time: float = 0.0
    message: str = ""
    version: int = PROTOCOL_VERSION

    def __post_init__(self) -> None:
        check_sia_id(self.sia_id)
        refusal_name(self.slurm_job_id, self.slurm_restart_count)  # validates both
        object.__setattr__(self, "node_list", tuple(self.node_list))
        object.__setattr__(self, "message", self.message[:MAX_MESSAGE_CHARS])


# ------------------------------------------------------------------------------------------------
# Reading and writing

_D = TypeVar("_D", JobSpec, Assignment, MetricsReport, StopRequest, RunExit, RunRefusal)
Document = JobSpec | Assignment | MetricsReport | StopRequest | RunExit | RunRefusal


_ADDED_FIELDS: dict[type, tuple[str, ...]] = {Assignment: ("profile_sweep",)}


def to_json(document: Document) -> dict[str, Any]:
    """The JSON object of a protocol document (tuples become lists, enums their values).

    A field added after version 1 is left out while it holds its default (an assignment's
    empty ``profile_sweep``), so that a job side that predates it reads the document."""
    payload = asdict(document)
    for key in _ADDED_FIELDS.get(type(document), ()):
        if not payload[key]:
            del payload[key]
    for key, value in payload.items():
        if isinstance(value, tuple):
            payload[key] = list(value)
        elif isinstance(value, JobKind):
            payload[key] = value.value
    return payload


def write_document(path: Path, document: Document) -> None:
    write_json_atomic(path, to_json(document))


def _field_checkers() -> dict[str, Callable[[Any], bool]]:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_num(v: Any) -> bool:
        return (isinstance(v, int | float)) and not isinstance(v, bool)

    return {
        "int": is_int,
        "float": is_num,
        "str": lambda v: isinstance(v, str),
        "int | None": lambda v: v is None or is_int(v),
        "float | None": lambda v: v is None or is_num(v),
        "str | None": lambda v: v is None or isinstance(v, str),
        "JobKind": lambda v: isinstance(v, str) and v in {k.value for k in JobKind},
        "tuple[str, ...]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "tuple[int, ...]": lambda v: isinstance(v, list) and all(is_int(x) for x in v),
    }


_CHECKERS = _field_checkers()


# ------------------------------------------------------------------------------------------------
# Bounds of every field


@dataclass(frozen=True)
class Bound:
    """What one field may hold: a number in ``[low, high]``, or a string matching ``pattern``
    (each item of a list of strings), with ``items`` the most a list may hold."""

    low: float | None = None
    high: float | None = None
    pattern: re.Pattern[str] | None = None
    says: str = ""  # the pattern in words, for messages and the docs
    items: int | None = None

    def problem(self, value: Any) -> str:
        """Why ``value`` is out of bounds, ``""`` if it is within."""
        if value is None:
            return ""
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.low is not None and value < self.low:
                return f"expected >= {_number(self.low)}, got {value!r}"
            if self.high is not None and value > self.high:
                return f"expected <= {_number(self.high)}, got {value!r}"
            return ""
        items = value if isinstance(value, list | tuple) else [value]
        if self.items is not None and len(items) > self.items:
            return f"expected at most {self.items} items, got {len(items)}"
        for item in items:
            if isinstance(item, int) and not isinstance(item, bool) and item is not value:
                problem = replace(self, items=None).problem(item)
                if problem:
                    return problem
                continue
            if (
                self.pattern is not None
                and isinstance(item, str)
                and not self.pattern.fullmatch(item)
            ):
                return f"expected {self.says}, got {item[:80]!r}"
        return ""

    def describe(self) -> str:
        if self.pattern is not None:
            return self.says + (f", at most {self.items}" if self.items is not None else "")
        span = f"{_number(self.low)} .. {_number(self.high)}"
        if self.items is not None and self.low is not None:
            return f"at most {self.items} items, each {span}"
        if self.items is not None:
            return f"at most {self.items} items"
        return span


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if float(value).is_integer() and abs(value) < 1e12:
        return str(int(value))
    return f"{value:g}"


_NAME = Bound(pattern=NAME, says="a name: 1-64 letters, digits, '_', '.', '+', '-'")
_HOST = Bound(pattern=HOST, says="a host name: 1-255 letters, digits, '_', '.', '-'")
_JOB_ID = Bound(pattern=JOB_ID, says="a Slurm job id (digits) or ''")
_LINE_TEXT = Bound(pattern=_LINE, says="one line of text")
_TIME = Bound(0, MAX_SECONDS)
_ROUND = Bound(0, MAX_COUNT)
_RESTARTS = Bound(0, MAX_RESTARTS)
_GPUS = Bound(1, MAX_GPUS)
_BATCH0 = Bound(0, MAX_BATCH)
_LOCAL = Bound(1, MAX_BATCH)
_ACCUM = Bound(0, MAX_ACCUM)
_STATUS = Bound(-(2**31), 2**31 - 1)

FIELD_BOUNDS: dict[type, dict[str, Bound]] = {
    JobSpec: {
        "app": Bound(
            pattern=re.compile(f"(?:{NAME.pattern})?"),
            says=_NAME.says + ", or '' (a model profiled for this job alone)",
        ),
        "init_batch_size": _BATCH0,
        "max_batch_size": _BATCH0,
        "min_gpus": _GPUS,
        "max_gpus": _GPUS,
        "requested_gpus": _GPUS,
        "requested_gpu_type": _NAME,
        "requested_batch_size": _BATCH0,
        "restart_cost": Bound(0, MAX_STEP_SECONDS),
        "submit_time": _TIME,
        "checkpoint_dir": _LINE_TEXT,
        "command": Bound(items=1024),
        "profile": _LINE_TEXT,
        "owner_uid": Bound(0, MAX_UID),
        "max_failures": Bound(0, MAX_FAILURES),
    },
    Assignment: {
        "round_index": _ROUND,
        "gpu_type": _NAME,
        "partition": _NAME,
        "nodes": _GPUS,
        "gpus": _GPUS,
        "node_list": Bound(pattern=HOST, says=_HOST.says, items=MAX_GPUS),
        "batch_size": Bound(1, MAX_BATCH),
        "local_bsz": _LOCAL,
        "accum_steps": _ACCUM,
        "restarts": _RESTARTS,
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "not_before": _TIME,
        "profile_sweep": Bound(1, MAX_BATCH, items=MAX_SWEEP),
    },
    MetricsReport: {
        "time": _TIME,
        "gpu_type": _NAME,
        "nodes": _GPUS,
        "gpus": _GPUS,
        "local_bsz": _LOCAL,
        "accum_steps": _ACCUM,
        "step_time": Bound(0, MAX_STEP_SECONDS),
        "sync_time": Bound(0, MAX_STEP_SECONDS),
        "grad_sqr": Bound(0, MAX_GRAD_STAT),
        "grad_var": Bound(0, MAX_GRAD_STAT),
        "steps": _ROUND,
        "round_index": _ROUND,
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "node_list": Bound(pattern=HOST, says=_HOST.says, items=1024),
    },
    StopRequest: {"round_index": _ROUND, "time": _TIME},
    RunExit: {
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "cause": _NAME,
        "status": _STATUS,
        "time": _TIME,
    },
    RunRefusal: {
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "node_list": Bound(pattern=HOST, says=_HOST.says, items=1024),
        "round_index": _ROUND,
        "time": _TIME,
    },
}


def bounds_table() -> str:
    """The Markdown table of every document's fields and bounds (docs/protocol.md holds it;
    a test keeps the two the same). Every string is also bounded by the reader
    (:mod:`sia_slurm.safefiles`: printable, at most 4096 characters)."""
    lines = ["| document | field | type | bounds |", "|---|---|---|---|"]
    for cls, bounds in FIELD_BOUNDS.items():
        for spec in fields(cls):
            if spec.name == "version":
                continue
            bound = bounds.get(spec.name)
            if spec.name == "sia_id":
                said = "a job id: 1-64 letters, digits, '_', '.', '-'"
            elif spec.name == "kind":
                said = ", ".join(k.value for k in JobKind)
            elif spec.name == "cause":
                said = ", ".join(c.value for c in ExitCause)
            elif bound is None:
                said = "any printable text"
            else:
                said = bound.describe()
            if spec.name == "message":
                said = f"any printable text, cut to {MAX_MESSAGE_CHARS} characters"
            kind = str(spec.type).replace("|", "\\|")  # not a column of the table
            lines.append(f"| {cls.__name__} | `{spec.name}` | `{kind}` | {said} |")
    return "\n".join(lines) + "\n"


def from_json(cls: type[_D], payload: Mapping[str, Any], where: str) -> _D:
    """Build ``cls`` from a JSON object, naming ``where`` and the field on any problem.

    Unknown keys are refused (a typo would otherwise be silently ignored); a newer
    ``version`` than this code knows is refused with a message that says so; every value is
    checked against :data:`FIELD_BOUNDS`. Whatever else goes wrong while building the document
    is a :class:`ProtocolError` too: nothing but the door's rejection escapes a reader.
    """
    known = {f.name: f for f in fields(cls)}
    bounds = FIELD_BOUNDS[cls]
    unknown = sorted(set(payload) - set(known))
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(unknown)}")
    version = payload.get("version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{where}: version: this sia-slurm speaks protocol {PROTOCOL_VERSION}, got {version!r}"
        )
    values: dict[str, Any] = {}
    for name, spec in known.items():
        if name not in payload:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise ProtocolError(f"{where}: {name}: missing")
            continue
        value = payload[name]
        check = _CHECKERS[str(spec.type)]
        if not check(value):
            raise ProtocolError(f"{where}: {name}: expected {spec.type}, got {value!r:.80}")
        bound = bounds.get(name)
        problem = "" if bound is None else bound.problem(value)
        if problem:
            raise ProtocolError(f"{where}: {name}: {problem}")
        values[name] = tuple(value) if isinstance(value, list) else value
    try:
        return cls(**values)
    except ProtocolError as exc:
        raise ProtocolError(f"{where}: {exc}") from None
    except Exception as exc:  # the door's rejection, whatever the value broke
        raise ProtocolError(f"{where}: {type(exc).__name__}: {exc}") from None


def read_document(cls: type[_D], path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> _D:
    """Read and validate one protocol file (:class:`ProtocolError` names file and field)."""
    return from_json(cls, read_json(path, max_bytes=max_bytes), str(path))
