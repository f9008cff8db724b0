"""What one optimizer step is made of: the batch in force, this rank's micro-batches of a
planned step with their weights, and what the model wrapper's hooks measured during it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from sia_slurm.job.elastic.sampler import StepPlan

__all__ = ["Batch", "MicroBatch", "StepStats", "plan_micro_batches"]


@dataclass(frozen=True)
class Batch:
    """A global batch and how it is split (``batch_size == replicas*local_bsz*(accum_steps+1)``)."""

    batch_size: int
    local_bsz: int
    accum_steps: int


@dataclass(frozen=True)
class MicroBatch:
    """Where the loader is: micro-batch ``index`` of ``plan`` on this rank, and its weight
    ``n_rj * replicas * micro_count / step size`` (1 on a uniform step, 0 on padding)."""

    plan: StepPlan
    index: int
    weight: float

    @property
    def last(self) -> bool:
        return self.index == len(self.plan.micro_batches) - 1

    @property
    def count(self) -> int:
        return len(self.plan.micro_batches)

    @property
    def indices(self) -> list[int]:
        """The dataset indices to fetch: the micro-batch's, or one padding sample (weight 0)
        where this rank's share of an uneven step is empty (DDP needs the same number of
        forward/backward passes on every rank)."""
        own = self.plan.micro_batches[self.index]
        if own:
            return list(own)
        return [next((m[0] for m in self.plan.micro_batches if m), 0)]


def plan_micro_batches(plan: StepPlan, replicas: int) -> list[MicroBatch]:
    """The micro-batches of ``plan`` on this rank with their weights (module of MicroBatch)."""
    count = len(plan.micro_batches)
    return [
        MicroBatch(plan, index, 1.0 if plan.uniform else len(m) * replicas * count / plan.size)
        for index, m in enumerate(plan.micro_batches)
    ]


@dataclass
class StepStats:
    """What the hooks measured during one step (device tensors; read once, at its end)."""

    micro_sqr: list[torch.Tensor] = field(default_factory=list)  # local, as the loss scaled it
    global_sqr: list[torch.Tensor] = field(default_factory=list)  # the reduced mean, unscaled
    # one replica without accumulation: |g|^2 and g . g_previous per parameter, unscaled
    single_sqr: list[torch.Tensor] = field(default_factory=list)
    single_cross: list[torch.Tensor] = field(default_factory=list)
    step_index: int = -1
    # when the step's first micro-batch was handed out (perf_counter): the step's compute
    # starts here (sia_slurm/job/elastic/devspeed.py stretches it on a dev cluster)
    started: float = field(default_factory=time.perf_counter)
    started_cpu: float = field(default_factory=time.process_time)  # the process's CPU time
    sync_ready: float | None = None
    sync_done: float | None = None
    forwarded: bool = False  # a forward pass went through the model wrapper
    # seconds DDP's forward spent before the model's own (its buffer broadcast, a collective
    # that waits on the peers): not compute, so a dev cluster's slower type does not stretch it
    ddp_forward_s: float = 0.0
    reduced: bool = False  # the reduced gradient was averaged and measured
    scaled: bool = False  # the gradients still carry the GradScaler's scale
