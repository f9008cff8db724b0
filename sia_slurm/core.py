"""Core vocabulary shared by the model, the policies, the simulator and the controller.

These types are the seam between the goodput model (``sia_slurm.model``) and the allocation
policies (``sia_slurm.policy``): a policy asks a job's :class:`GoodputEstimator` for its whole row
of configurations in one call and gets a :class:`GoodputRow` back. Nothing here does I/O.

Names follow the Sia paper: a *configuration* is (GPU type, nodes, GPUs); *goodput* is
throughput x statistical efficiency. The cluster's own words live here too (:class:`NodeView`,
:class:`NodeShare`), so the cluster interface, the Slurm backend and the state store name a node
without importing the policies; so does the controller's :class:`Decision` about a job (re-exported
by :mod:`sia_slurm.controller`), so the state store records and reads decisions without importing
the controller. :class:`JobKind` is a field of a job's ``spec.json``: the protocol defines it
(:mod:`sia_slurm.protocol.documents`, which imports nothing of this module), and it is
re-exported here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from sia_slurm.protocol.documents import JobKind

__all__ = [
    "Configuration",
    "Decision",
    "GoodputEstimator",
    "GoodputRow",
    "JobKind",
    "NodeShare",
    "NodeView",
]


@dataclass(frozen=True, order=True)
class Configuration:
    """``gpus`` GPUs of type ``gpu_type`` spread evenly over ``nodes`` nodes."""

    gpu_type: str
    nodes: int
    gpus: int

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus < self.nodes:
            raise ValueError(
                f"configuration needs 1 <= nodes <= gpus, got nodes={self.nodes} gpus={self.gpus}"
            )

    def __str__(self) -> str:
        return f"{self.gpu_type}:{self.nodes}x{self.gpus}"


@dataclass(frozen=True)
class GoodputRow:
    """A job's predicted performance on each of a list of configurations, plus the batch choice.

    Every array has one entry per configuration, in the order the configurations were given.
    Infeasible configurations (the batch cannot fit, or the job may not take them) have goodput 0.

    ``accum_steps`` follows Pollux's convention: the number of *extra* micro-batches per optimizer
    step, so a step processes ``local_bsz * (accum_steps + 1)`` samples per GPU and the global batch
    is ``gpus * local_bsz * (accum_steps + 1)``.
    """

    goodput: np.ndarray  # float64, efficiency-adjusted samples per second
    throughput: np.ndarray  # float64, raw samples per second
    efficiency: np.ndarray  # float64 in (0, 1]
    batch_size: np.ndarray  # int64, global batch size M
    local_bsz: np.ndarray  # int64, per-GPU micro-batch m
    accum_steps: np.ndarray  # int64, extra micro-batches s (0 = no accumulation)


class GoodputEstimator(Protocol):
    """One job's goodput model: what a policy needs to score configurations.

    Implementations hold the job's fitted per-GPU-type throughput models, its gradient statistics,
    initial batch size M0 and batch-size limits. ``fixed_batch`` evaluates only the job's current
    batch size (strong-scaling and rigid jobs); otherwise the batch size is optimised per
    configuration.
    """

    def evaluate(
        self, configs: Sequence[Configuration], *, fixed_batch: bool = False
    ) -> GoodputRow: ...


@dataclass(frozen=True)
class NodeView:
    """One node as the scheduler sees it this round.

    ``usable_gpus`` is what managed jobs may hold: 0 for a node that is down or drained,
    ``total_gpus`` minus GPUs held by unmanaged jobs otherwise (GPUs held by managed jobs count
    as usable, since the policy may move those jobs).
    """

    name: str
    gpu_type: str
    total_gpus: int
    usable_gpus: int

    def __post_init__(self) -> None:
        if self.total_gpus < 1 or not 0 <= self.usable_gpus <= self.total_gpus:
            raise ValueError(
                f"node {self.name}: need total_gpus >= 1 and 0 <= usable_gpus <= total_gpus, "
                f"got total_gpus={self.total_gpus} usable_gpus={self.usable_gpus}"
            )


@dataclass(frozen=True)
class NodeShare:
    """``gpus`` GPUs of node ``node`` held by one job."""

    node: str
    gpus: int


@dataclass(frozen=True)
class Decision:
    """One job's outcome of a round, for logs, ``sia-slurm explain`` and the dashboard (made by
    :class:`sia_slurm.controller.Controller`, kept in the state database's ``decisions``)."""

    sia_id: str
    phase: str
    action: str  # "start", "move", "stop", "rebatch", "keep", "wait"
    before: str  # configuration before the round ("-" when none)
    after: str  # configuration after the round ("-" when none)
    batch_size: int = 0
    local_bsz: int = 0
    accum_steps: int = 0
    goodput: float = 0.0  # predicted samples/s at M0-equivalent efficiency
    note: str = ""
    # Predicted raw samples/s of ``after`` at this batch, before statistical efficiency (0:
    # none, or a database written before the field): see JobAllocation.throughput.
    throughput: float = 0.0
