"""The cluster interface: what the controller reads from a cluster and what it asks it to do.

Two implementations share it, so the simulator and production run the same controller round:

* :class:`sia_slurm.slurm.backend.SlurmBackend` — a real Slurm (``scontrol``, ``squeue --json``);
* :class:`sia_slurm.sim.simulated_cluster.SimulatedCluster` — trace-driven ground truth on a
  simulated clock.

A round is ``backend.snapshot()`` -> :class:`sia_slurm.controller.Controller.round` ->
``backend.apply(actions)``. Snapshots and actions are frozen values, so a round can be logged,
replayed and compared between the two worlds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

from sia_slurm.core import Configuration, NodeShare, NodeView
from sia_slurm.policy.site_accounting import SiteAccounting
from sia_slurm.protocol import JobSpec, MetricsReport


class JobPhase(StrEnum):
    """Where a managed job stands, as the cluster reports it.

    ``PENDING``: no GPUs (new, or preempted). ``STARTING``: GPUs granted, restoring from its
    checkpoint (the policy keeps its configuration; reference section 4, "in the middle of a
    checkpoint-restore"). ``RUNNING``: training on its GPUs. ``DONE``/``FAILED``: finished; the
    controller forgets it after recording the outcome.
    """

    PENDING = "pending"
    STARTING = "starting"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"

    @property
    def holds_gpus(self) -> bool:
        return self in (JobPhase.STARTING, JobPhase.RUNNING)

    @property
    def finished(self) -> bool:
        return self in (JobPhase.DONE, JobPhase.FAILED)


@dataclass(frozen=True)
class BatchChoice:
    """The batch a job runs with: ``batch_size == gpus * local_bsz * (accum_steps + 1)``."""

    batch_size: int
    local_bsz: int
    accum_steps: int


@dataclass(frozen=True)
class JobSnapshot:
    """One managed job as the cluster sees it this round.

    ``config``/``placement``/``batch`` describe its current GPUs when ``phase.holds_gpus``.
    ``restarts`` counts the (re)starts after its first start. ``finish_time`` is set for
    finished jobs. ``slurm_job_id`` is empty in the simulator.
    """

    spec: JobSpec
    phase: JobPhase
    config: Configuration | None = None
    placement: tuple[NodeShare, ...] = ()
    batch: BatchChoice | None = None
    restarts: int = 0
    finish_time: float | None = None
    slurm_job_id: str = ""
    message: str = ""
    # Who the job belongs to, as the cluster says (Slurm's user and account; the workload's in
    # the simulator): what its fair share is counted against (:mod:`sia_slurm.policy.shares`).
    user: str = ""
    account: str = ""
    qos: str = ""
    # The job's own profile (``jobs/<id>/profile.json``, read through the user-file door and
    # within the JSON bounds; checked by the estimator factory): None for a shipped app's.
    profile_document: Mapping[str, Any] | None = None
    # What the job measured while profiling (``jobs/<id>/profiled.json``, read through the
    # door; checked by the controller before it is trusted): docs/profiling.md.
    profiled_document: Mapping[str, Any] | None = None
    profiled_problem: str = ""  # why ``profiled.json`` could not be read (the door's refusal)
    # Which write of ``profiled.json`` was read ("" : tell writes apart by their content): a
    # rewrite with the same content is a new measurement
    profiled_version: str = ""

    @property
    def sia_id(self) -> str:
        return self.spec.sia_id

    def __post_init__(self) -> None:
        if self.phase.holds_gpus and (self.config is None or not self.placement):
            raise ValueError(f"job {self.sia_id}: phase {self.phase} needs a config and placement")


@dataclass(frozen=True)
class ClusterSnapshot:
    """Everything observed in one round: the nodes (GPUs usable by managed jobs already net of
    down, drained, reserved nodes and unmanaged jobs), the managed jobs, and the metrics reports
    that arrived since the previous snapshot (validated; rejected ones are in ``rejected``)."""

    time: float
    nodes: tuple[NodeView, ...]
    jobs: tuple[JobSnapshot, ...]
    reports: tuple[MetricsReport, ...] = ()
    rejected: tuple[str, ...] = ()  # one message per bad metrics file
    # Slurm accounting's associations and QOS (shares, GPU limits); None: no accounting.
    site: SiteAccounting | None = None
    # Jobs the backend could not read this round (sia id -> why): they sit the round out
    # (sia_slurm/controller/quarantine.py); their GPUs already count as taken in ``nodes``.
    quarantined: Mapping[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------
# Actions: what the controller asks the cluster to do. One type per kind of change.


@dataclass(frozen=True)
class Start:
    """Give a job without GPUs this configuration on these nodes."""

    sia_id: str
    round_index: int
    config: Configuration
    placement: tuple[NodeShare, ...]
    batch: BatchChoice
    # per-GPU batches a profiling run measures (docs/profiling.md); empty for any other run
    profile_sweep: tuple[int, ...] = ()


@dataclass(frozen=True)
class Move:
    """Checkpoint a running job and restart it in another configuration or on other nodes."""

    sia_id: str
    round_index: int
    config: Configuration
    placement: tuple[NodeShare, ...]
    batch: BatchChoice
    # per-GPU batches a profiling run measures (docs/profiling.md); empty for any other run
    profile_sweep: tuple[int, ...] = ()


@dataclass(frozen=True)
class Stop:
    """Checkpoint a running job and take its GPUs away (it waits, pending, for a later round)."""

    sia_id: str
    round_index: int


@dataclass(frozen=True)
class Rebatch:
    """Change only the batch of a running job; it adopts it without a restart (as in Pollux)."""

    sia_id: str
    round_index: int
    batch: BatchChoice


Action = Start | Move | Stop | Rebatch


@dataclass(frozen=True)
class ActionResult:
    """What became of one action; ``ok`` False leaves the job as the next snapshot shows it."""

    action: Action
    ok: bool
    message: str = ""
    details: dict[str, str] = field(default_factory=dict)


class ClusterBackend(Protocol):
    """A cluster the controller can observe and change (Slurm or simulated)."""

    def snapshot(self) -> ClusterSnapshot: ...

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]: ...
