"""The protocol's documents: what the controller and a managed job tell each other.

One frozen dataclass per file (``docs/protocol.md``): the job's spec, the controller's
assignment and stop request, the job's metrics, and how a run ended or why it refused to train;
and the spec's :class:`JobKind` (which :mod:`sia_slurm.core` re-exports for the model, the
policies and the simulator).
Each checks, on construction, the rules that tie its fields together (a batch that is
``gpus * local_bsz * (accum_steps + 1)``, a sync time below the step time); the bounds of each
field alone are :mod:`sia_slurm.protocol.bounds`, enforced by the reader.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

from sia_slurm.protocol.paths import check_sia_id, exit_name, refusal_name
from sia_slurm.safefiles import ProtocolError

# The protocol this release speaks, and the oldest it still reads and writes for: the previous
# release's (docs/protocol.md, "Between releases"). A document says its version; a field that a
# version added carries ``metadata={"since": N}`` (none yet: every field is version 1's).
PROTOCOL_VERSION = 1
OLDEST_PROTOCOL = max(1, PROTOCOL_VERSION - 1)
MAX_FAILURES = 100  # the largest retry budget a job may ask for (``--max-failures``)
MAX_MESSAGE_CHARS = 2000  # of a run's exit or refusal message


class JobKind(StrEnum):
    """What the scheduler may change about a job (reference section 4, "Job kinds")."""

    ADAPTIVE = "adaptive"  # GPU type, GPU count and batch size
    STRONG_SCALING = "strong-scaling"  # GPU type and count; batch size fixed
    RIGID = "rigid"  # GPU type only; count and batch size fixed
    PINNED = "pinned"  # nothing: fixed type and count, non-preemptible


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
    meaning :class:`~sia_slurm.protocol.observation.Observation` takes. ``grad_sqr`` /
    ``grad_var`` are the gradient noise statistics normalised to M0. ``steps`` counts optimizer
    steps since the job first started; ``time`` is when the report was written (seconds since
    the epoch, or the simulated clock). ``slurm_job_id`` and ``slurm_restart_count`` name the
    Slurm run that wrote it: the controller takes a report only from the job's current run, so
    a report left by the run before a restart never makes a restarted job look RUNNING.
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


Document = JobSpec | Assignment | MetricsReport | StopRequest | RunExit | RunRefusal
