"""A DistributedDataParallel that follows the batch the scheduler assigns.

``ElasticDataParallel(model, optimizer, scheduler=..., scaler=...)`` replaces
``DistributedDataParallel(model)``. PyTorch's DDP does the communication (bucketed, overlapped
with the backward pass, gradients as views of its buckets); this wrapper adds, without a copy
of the gradients:

- **gradient accumulation**: on a micro-batch that is not the last of its step (the loader
  knows) the forward runs without DDP's sync, and the user's ``optimizer.step()``,
  ``optimizer.zero_grad()``, ``scaler.unscale_/step/update`` and :meth:`clip_grad_norm_` are
  no-ops, so the script's loop stays the same;
- **weighting**: DDP's own C++ reduction (no Python communication hook: one costs about as
  much as all of this wrapper's other work, ``benchmarks/bench_trainer.py``) averages over
  the replicas; the wrapper divides the reduced gradient by the number of micro-batches once
  per step, before anything reads it (``scaler.unscale_``, :meth:`clip_grad_norm_` or the
  optimizer step, whichever comes first; until then a gradient accumulated over ``k``
  micro-batches is their sum). On an epoch's uneven last step a per-parameter hook weighs
  each micro-batch by its size (padding micro-batches weigh 0);
- **gradient-noise statistics** (sia_slurm/job/elastic/noise.py), on the steps the job measures
  only: each micro-batch's local gradient norm, taken by per-parameter hooks before it is
  accumulated or reduced, and the reduced mean gradient's norm, taken at the same point as
  the division above, a dot product per parameter over DDP's own buffers: no copy. Values
  are those of the unscaled gradient (divided by the squared loss scale where the gradient
  was still scaled). Only a job on one replica without accumulation keeps a copy of the
  previous step's gradient (Pollux's estimate from two consecutive steps needs it);
- **timing**: a hook on the parameter whose gradient comes last in the backward pass marks
  when the last bucket is ready, and a callback at the end of the backward pass (after DDP
  has waited for its all-reduces) when the gradient is synchronised;
- **learning-rate scaling** around the real ``optimizer.step()`` (sia_slurm/job/elastic/lr.py):
  the rule given, or AdaScale for the SGD family and the square-root rule for Adam-like
  optimizers;
- **checkpointed state**: the module, optimizer, scheduler and GradScaler state are restored
  from the job's newest checkpoint when the wrapper is made (before DDP broadcasts rank 0's
  parameters) and saved with it;
- **a profiling step that ran out of memory** (sia_slurm/job/elastic/job_profiling.py) is dropped:
  :meth:`recover_from_out_of_memory` frees its gradients and resets DDP's reducer, and the
  optimizer step and the scaler skip it.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from sia_slurm.job.elastic.job import ElasticJob, current_job
from sia_slurm.job.elastic.lr import LRScaling, default_rule
from sia_slurm.job.elastic.steps import StepStats

logger = logging.getLogger(__name__)


class ElasticDataParallel(torch.nn.Module):
    """``DistributedDataParallel`` made elastic (see the module docstring)."""

    def __init__(
        self,
        module: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        *,
        scheduler: Any = None,
        scaler: torch.amp.GradScaler | None = None,
        lr_scaling: str | Callable[[float], float] | None = None,
        job: ElasticJob | None = None,
        **ddp_options: Any,
    ):
        super().__init__()
        self.job = job if job is not None else current_job()
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.scaler = scaler
        rule = lr_scaling if lr_scaling is not None else default_rule(optimizer)
        self.scaling = LRScaling(rule, self.job.env.init_batch_size)
        state = self.job.attach_model(self)
        if state is not None:
            self._load_training_state(module, state)
        device_ids = [self.job.device.index] if self.job.device.type == "cuda" else None
        ddp_options.setdefault("gradient_as_bucket_view", True)
        self.ddp = DistributedDataParallel(module, device_ids=device_ids, **ddp_options)
        self._params = [p for p in module.parameters() if p.requires_grad]
        self._hooks: list[Any] = []  # armed only for steps that need them (arm_hooks)
        if self._params:  # backward computes the first parameter's gradient last (DDP's order)
            self._params[0].register_hook(self._on_last_gradient)
        self._module_started: float | None = None
        module.register_forward_pre_hook(self._on_module_forward)
        # one replica without accumulation: the previous step's gradient, copied over in place
        self.previous_gradient: dict[int, torch.Tensor] = {}
        self._patch_optimizer()
        if scaler is not None:
            self._patch_scaler(scaler)

    @property
    def module(self) -> torch.nn.Module:
        """The wrapped model (as ``DistributedDataParallel.module``)."""
        return self.ddp.module

    @property
    def syncing(self) -> bool:
        """Whether the current micro-batch ends its optimizer step."""
        return not self.job.accumulating

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        stats = self.job.stats
        stats.forwarded = True
        self.ddp.require_backward_grad_sync = not self.job.accumulating
        self._module_started = None
        called = time.perf_counter()
        output = self.ddp(*args, **kwargs)
        if self._module_started is not None:  # DDP's own work before the model's forward
            stats.ddp_forward_s += max(self._module_started - called, 0.0)
        return output

    def _on_module_forward(self, _module: torch.nn.Module, _inputs: Any) -> None:
        self._module_started = time.perf_counter()

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> torch.Tensor | None:
        """``torch.nn.utils.clip_grad_norm_`` of the averaged gradient, on the step's last
        micro-batch only (call it after ``scaler.unscale_(optimizer)`` with AMP)."""
        if self.job.accumulating:
            return None
        self.reduced()
        return torch.nn.utils.clip_grad_norm_(self.module.parameters(), max_norm, norm_type)

    # ---- hooks -------------------------------------------------------------------------------

    def arm_hooks(self, needed: bool) -> None:
        """Register the per-parameter hooks for a step that needs them (noise norms, or an
        uneven step's weights), and remove them otherwise: a Python call per parameter and
        micro-batch would be the wrappers' largest cost on a plain step."""
        if needed and not self._hooks:
            self._hooks = [p.register_hook(self._on_parameter_gradient) for p in self._params]
        elif not needed and self._hooks:
            for handle in self._hooks:
                handle.remove()
            self._hooks = []

    def _on_parameter_gradient(self, grad: torch.Tensor) -> torch.Tensor | None:
        """One micro-batch's local gradient of one parameter, before accumulation."""
        micro = self.job.current
        if micro is None:
            return None
        if micro.plan.uniform and self.job.measuring:
            self.job.stats.micro_sqr.append(_sqr(grad))
        return None if micro.weight == 1.0 else grad * micro.weight

    def _on_last_gradient(self, _grad: torch.Tensor) -> None:
        """The backward pass of the step's last micro-batch computed its last gradient: the
        last bucket is ready; the gradient is synchronised when the backward pass ends."""
        micro, stats = self.job.current, self.job.stats
        if micro is None or not micro.last:
            return
        stats.sync_ready = time.perf_counter()

        def synchronised() -> None:
            stats.sync_done = time.perf_counter()

        torch.autograd.Variable._execution_engine.queue_callback(synchronised)  # type: ignore[attr-defined]

    def reduced(self) -> None:
        """The step's reduced gradient, once, before it is first read: divided by the number
        of micro-batches, and its noise norms taken (see the module docstring)."""
        job = self.job
        micro, stats = job.current, job.stats
        if micro is None or not micro.last or stats.reduced:
            return
        stats.reduced = True
        grads = [p.grad for p in self._params if p.grad is not None]
        if micro.count > 1 and grads:
            torch._foreach_div_(grads, float(micro.count))
        if not (micro.plan.uniform and job.measuring and grads):
            return
        inverse = job.loss_scale_inverse_sq() if stats.scaled else 1.0
        if job.replicas > 1 or micro.count > 1:
            stats.global_sqr.append(torch.stack([_sqr(g) for g in grads]).sum() * inverse)
            return
        for param in self._params:  # one replica, one micro-batch: two consecutive steps
            if param.grad is not None:
                self._keep_single(param, param.grad, stats, inverse)

    def _keep_single(
        self, param: torch.Tensor, grad: torch.Tensor, stats: StepStats, inverse: float
    ) -> None:
        """One replica, one micro-batch: ``|g|^2`` and ``g . g_previous`` of one parameter,
        then ``g`` over the previous step's copy (in place: one copy of the gradient in all),
        all of the unscaled gradient."""
        flat = grad.detach().reshape(-1)
        stats.single_sqr.append(_sqr(flat) * inverse)
        previous = self.previous_gradient.get(id(param))
        if previous is not None and previous.shape == flat.shape:
            stats.single_cross.append(_dot(previous, flat) * math.sqrt(inverse))
            previous.copy_(flat)
        else:
            previous = self.previous_gradient[id(param)] = flat.clone()
        if inverse != 1.0:
            previous.mul_(math.sqrt(inverse))

    def recover_from_out_of_memory(self) -> bool:
        """After an out-of-memory error in a step that is dropped: its gradients freed and
        DDP's reducer ready for a new iteration (a backward that failed midway leaves it
        waiting for the rest of its buckets, and the next forward would fail). False when this
        torch's DDP has no reset (the error must then end the process)."""
        reset = getattr(self.ddp.reducer, "_reset_state", None)  # what DDP itself uses
        if reset is None:
            return False
        self.module.zero_grad(set_to_none=True)
        self.previous_gradient.clear()  # may hold the dropped step's gradient
        reset()
        return True

    # ---- the user's optimizer and scaler, made accumulation-aware ----------------------------

    def _patch_optimizer(self) -> None:
        optimizer, job, scaling = self.optimizer, self.job, self.scaling
        real_step, real_zero_grad = optimizer.step, optimizer.zero_grad

        def step(*args: Any, **kwargs: Any) -> Any:
            if job.accumulating:  # a closure (Lightning passes one) still runs forward/backward
                closure = kwargs.get("closure", args[0] if args else None)
                return None if closure is None else closure()
            if job.dropping:  # a profiling step that ran out of memory: nothing to apply
                return None
            self.reduced()
            factor = scaling.factor(job.batch.batch_size, job.noise)
            with scaling.applied(optimizer, factor):
                return real_step(*args, **kwargs)

        def zero_grad(set_to_none: bool = True) -> None:
            if not job.accumulating:
                real_zero_grad(set_to_none)

        if getattr(real_step, "_wrapped_by_lr_sched", False):
            step._wrapped_by_lr_sched = True  # type: ignore[attr-defined]  # the scheduler's check
        optimizer.step = step  # type: ignore[method-assign]
        optimizer.zero_grad = zero_grad  # type: ignore[method-assign]

    def _patch_scaler(self, scaler: torch.amp.GradScaler) -> None:
        job = self.job
        real_unscale, real_step, real_update = scaler.unscale_, scaler.step, scaler.update

        def unscale_(optimizer: torch.optim.Optimizer) -> None:
            if not job.accumulating and not job.dropping:
                real_unscale(optimizer)
                job.stats.scaled = False
                self.reduced()

        def step(optimizer: torch.optim.Optimizer, *args: Any, **kwargs: Any) -> Any:
            if job.accumulating or job.dropping:
                return None
            return real_step(optimizer, *args, **kwargs)

        def update(new_scale: float | torch.Tensor | None = None) -> None:
            if not job.accumulating and not job.dropping:
                real_update(new_scale)

        scaler.unscale_ = unscale_  # type: ignore[method-assign]
        scaler.step = step  # type: ignore[method-assign]
        scaler.update = update  # type: ignore[method-assign]

    # ---- checkpointed state ------------------------------------------------------------------

    def training_state(self) -> dict[str, Any]:
        """The user's training state for the job's checkpoint."""
        return {
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "scaler": None if self.scaler is None else self.scaler.state_dict(),
        }

    def _load_training_state(self, module: torch.nn.Module, state: dict[str, Any]) -> None:
        module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state.get("scheduler") is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        if self.scaler is not None and state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def _sqr(tensor: torch.Tensor) -> torch.Tensor:
    """``|tensor|^2`` as a float32 device scalar, without a copy for float32/64 tensors."""
    flat = tensor.reshape(-1)
    if flat.dtype in (torch.float32, torch.float64):
        return torch.dot(flat, flat)
    return torch.linalg.vector_norm(flat, dtype=torch.float32).square()


def _dot(left: torch.Tensor, right: torch.Tensor) -> torch.Tensor:
    if left.dtype in (torch.float32, torch.float64):
        return torch.dot(left, right)
    return torch.dot(left.float(), right.float())
