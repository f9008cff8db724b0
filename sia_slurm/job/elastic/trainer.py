"""The elastic step loop: for a script written around steps instead of a DataLoader.

A script keeps its model, optimizer, loss and data, and drives them through an
:class:`ElasticTrainer` (``sia_slurm/job/examples/cnn.py`` shows the whole change)::

    trainer = ElasticTrainer(model, optimizer, dataset, scheduler=scheduler)
    for epoch in trainer.epochs(max_epochs):       # restores the newest checkpoint first
        for step in trainer.steps():               # this replica's share of one global batch
            for x, y in step.micro_batches():      # accumulation when the batch needs it
                step.backward(loss_fn(trainer.model(x), y))   # the mean over the micro-batch
            step.finish()                          # optimizer step, then the step's agreement

It is a thin layer over the parts a DDP script uses directly (``docs/protocol.md``, "Making a
DDP script elastic"): an :class:`~sia_slurm.job.elastic.ElasticJob` of its own (the process group,
restore, checkpoints, metrics, and the one implementation of the controller's requests:
stop and ack, SIGTERM checkpoint, rebatch, a run left behind), an
:class:`~sia_slurm.job.elastic.ElasticDataParallel` around the model (DDP does the all-reduce;
the wrapper's hooks take the gradient-noise statistics) and an
:class:`~sia_slurm.job.elastic.ElasticSampler` whose steps it hands out one at a time, each
micro-batch fetched with ``fetch(indices)``. ``trainer.model`` is that wrapper: the forward
pass must go through it (not through the module passed in), or DDP does not synchronise the
gradients; :meth:`Step.finish` says so if it did not.

With several replicas the control vector is all-reduced every ``control_interval`` steps
(default 1: every step) behind the next step's work, so the ranks act on a stop, a SIGTERM or
a new batch one agreement later, all after the same step; alone, at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sized
from typing import Any, Protocol

import torch
from torch.utils.data import default_collate

from sia_slurm.job.elastic.checkpoint import CheckpointManager
from sia_slurm.job.elastic.control import SignalFlags
from sia_slurm.job.elastic.ddp import ElasticDataParallel
from sia_slurm.job.elastic.job import ElasticJob
from sia_slurm.job.elastic.metrics_reporter import MetricsReporter
from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.elastic.sampler import ElasticSampler, StepPlan
from sia_slurm.job.elastic.steps import Batch, plan_micro_batches
from sia_slurm.job.jobenv import JobEnvironment

logger = logging.getLogger(__name__)
__all__ = ["Batch", "ElasticTrainer", "Step", "TrainerError"]


class TrainerError(RuntimeError):
    """The training script used the trainer in a way it cannot support."""


class IndexedDataset(Sized, Protocol):
    def __getitem__(self, index: int) -> Any: ...


class ElasticTrainer:
    """Runs one replica of an elastic data-parallel training job (see the module docstring).

    ``fetch`` turns a list of dataset indices into a micro-batch (default: the dataset's items
    collated with :func:`torch.utils.data.default_collate`). ``lr_scaling`` is a rule of
    :mod:`sia_slurm.job.elastic.lr`. ``checkpoint_interval_s`` adds periodic checkpoints (default:
    only on stop, termination and completion). ``user_state`` is saved and restored with the
    checkpoint (tensors, numbers, strings, lists and dicts only). ``reporter`` replaces the
    job's :class:`MetricsReporter` (the emulated trainer reports its app's statistics).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: IndexedDataset,
        *,
        scheduler: Any = None,
        fetch: Callable[[list[int]], Any] | None = None,
        env: JobEnvironment | None = None,
        seed: int = 0,
        shuffle: bool = True,
        lr_scaling: str = "adascale",
        checkpoint_interval_s: float | None = None,
        noise_decay: float = 0.95,
        install_signal_handlers: bool = True,
        control_interval: int = 1,
        reporter: MetricsReporter | None = None,
    ):
        self.job = ElasticJob(
            env,
            seed=seed,
            checkpoint_interval_s=checkpoint_interval_s,
            noise_decay=noise_decay,
            control_interval=control_interval,
            install_signal_handlers=install_signal_handlers,
            reporter=reporter,
        )
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.dataset = dataset
        self.fetch = fetch or (lambda indices: default_collate([dataset[i] for i in indices]))
        self.sampler = ElasticSampler(len(dataset), seed=seed, shuffle=shuffle)
        self.job.attach_sampler(self.sampler)  # restores the newest checkpoint, if any
        self.model = ElasticDataParallel(
            model, optimizer, scheduler=scheduler, lr_scaling=lr_scaling, job=self.job
        )

    # ---- the job's state, as the loop and its logs read it -----------------------------------

    @property
    def env(self) -> JobEnvironment:
        return self.job.env

    @property
    def rank(self) -> int:
        return self.job.rank

    @property
    def replicas(self) -> int:
        return self.job.replicas

    @property
    def step(self) -> int:
        """Optimizer steps since the job first started."""
        return self.job.step

    @property
    def progress(self) -> float:
        """Steps weighted by the AdaScale gain (M0-equivalent steps)."""
        return self.job.progress

    @property
    def round(self) -> int:
        """The round of the assignment the replicas train with now."""
        return self.job.round

    @property
    def restored_step(self) -> int | None:
        return self.job.restored_step

    @property
    def batch(self) -> Batch:
        return self.job.batch

    @property
    def noise(self) -> GradientNoise:
        return self.job.noise

    @property
    def checkpoints(self) -> CheckpointManager:
        return self.job.checkpoints

    @property
    def signals(self) -> SignalFlags:
        return self.job.signals

    @property
    def reporter(self) -> MetricsReporter:
        return self.job.reporter

    @property
    def user_state(self) -> dict[str, Any]:
        """The script's own checkpointed values (replaced by the restored ones at start)."""
        return self.job.user_state

    @property
    def max_steps(self) -> int | None:
        return self.job.max_steps

    @max_steps.setter
    def max_steps(self, value: int | None) -> None:
        """Ends training after step ``value`` (the loop completes the job there)."""
        self.job.max_steps = value

    # ---- the loop ----------------------------------------------------------------------------

    def epochs(self, max_epochs: int, *, max_steps: int | None = None) -> Iterator[int]:
        """The epochs still to train (the checkpoint was restored when the trainer was made)."""
        return self.job.remaining_epochs(max_epochs, max_steps=max_steps)

    def steps(self) -> Iterator[Step]:
        """This epoch's remaining steps; a stop agreed at an earlier step ends the process."""
        job = self.job
        while True:
            job.obey_control()
            if job.steps_exhausted():
                return
            plan = job.plan(self.sampler, job.batch)
            if plan is None:
                return
            step = Step(self, plan)
            yield step
            if not step.finished:
                raise TrainerError("every step must end with step.finish() before the next one")

    def save_checkpoint(self) -> str:
        """A checkpoint of the current step (every rank calls it; rank 0 writes it)."""
        return self.job.save_checkpoint()


class Step:
    """One optimizer step of one replica: its micro-batches, then :meth:`finish`."""

    def __init__(self, trainer: ElasticTrainer, plan: StepPlan):
        self.plan = plan
        self._trainer = trainer
        self._fetched = 0
        self.finished = False

    @property
    def index(self) -> int:
        """The number of this step (steps since the job first started, from 0)."""
        return self._trainer.step

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    def micro_batches(self) -> Iterator[Any]:
        """This replica's micro-batches of the step (fetched data). A replica whose share of
        an epoch's uneven last step is empty gets one padding sample, whose gradient weighs
        nothing (DDP needs every rank to run the same number of backward passes)."""
        job = self._trainer.job
        for micro in plan_micro_batches(self.plan, job.replicas):
            job.begin_micro(micro)
            self._fetched += 1
            yield self._trainer.fetch(micro.indices)

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (the mean over the current micro-batch); the model wrapper
        weighs it so that the reduced gradient is the mean over the whole global batch. A
        profiling step that runs out of memory here is dropped
        (sia_slurm/job/elastic/job_profiling.py)."""
        job = self._trainer.job
        if job.dropping:
            return
        try:
            loss.backward()
        except torch.cuda.OutOfMemoryError as exc:
            if not job.absorb_out_of_memory(exc):
                raise

    def finish(self) -> None:
        """The optimizer step (scaled learning rate) on the reduced gradient, then the step's
        accounting and agreement on the controller's requests (:meth:`ElasticJob.end_step`)."""
        if self.finished:
            raise TrainerError("step.finish() called twice")
        job = self._trainer.job
        if self._fetched != len(self.plan.micro_batches):
            raise TrainerError("step.finish() before all of step.micro_batches() were trained")
        if not job.stats.forwarded:
            raise TrainerError(
                "no gradient was synchronised this step: call trainer.model(...), not the "
                "module given to ElasticTrainer, so that DDP reduces the gradients"
            )
        try:
            self._trainer.optimizer.step()  # skipped by the wrapper for a dropped step
        except torch.cuda.OutOfMemoryError as exc:
            if not job.absorb_out_of_memory(exc):
                raise
        self._trainer.optimizer.zero_grad(set_to_none=True)
        job.end_step(self.plan)  # or drops it
        self.finished = True
