"""A PyTorch Lightning ``Trainer`` made elastic (the optional extra ``sia-slurm[lightning]``).

A Lightning script changes two lines (``docs/protocol.md``, "Lightning")::

    trainer = L.Trainer(strategy=ElasticStrategy(), max_epochs=20, enable_checkpointing=False)

    def train_dataloader(self):                        # in the LightningModule
        return ElasticDataLoader(self.dataset, num_workers=2)

:class:`ElasticStrategy` is a ``DDPStrategy`` whose model wrapper is an
:class:`~sia_slurm.job.elastic.ElasticDataParallel` over the job's process group (made by
:func:`sia_slurm.job.elastic.init`, before Lightning would make its own): DDP reduces the
gradients, the wrapper's hooks take the gradient-noise statistics, the learning rate is
scaled by optimizer, and the module, optimizer, LR scheduler and the precision plugin's
GradScaler are restored from and saved to the job's checkpoints (format 2, the same as a DDP
script's: Lightning's own ``.ckpt`` files are not used). It adds an :class:`ElasticCallback`
to the trainer, which connects Lightning's loop to the :class:`~sia_slurm.job.elastic.ElasticJob`:

- **batch size**: the loader yields ``local_bsz`` micro-batches, ``accum_steps + 1`` per
  optimizer step. Lightning's ``accumulate_grad_batches`` stays 1: on a micro-batch that is
  not the last of its step the wrapper runs Lightning's closure (forward and backward, no
  sync) and skips the optimizer step, scaler update, gradient clipping and step-interval LR
  scheduler step. A rebatch mid-epoch corrects Lightning's count of the epoch's batches;
- **epochs**: a restored job resumes Lightning's epoch counter at the checkpoint's epoch, so
  ``max_epochs`` counts the job's epochs across restarts, and mid-epoch at the next sample;
- **stop, SIGTERM, a run left behind**: the job's handlers replace Lightning's SIGTERM
  handler (which would raise at an arbitrary batch on each rank); the ranks agree after a
  step, checkpoint, and exit with status 0 as a DDP script does;
- **metrics**: the job reports step times and noise statistics to the controller; the
  callback also logs ``sia/batch_size`` and ``sia/grad_sqr``/``sia/grad_var`` to
  Lightning's loggers once per optimizer step;
- **profiling** (sia_slurm/job/elastic/job_profiling.py): a CUDA out-of-memory error in the training
  step (the forward pass) or the backward pass of a profiling step is caught here; the
  training step then gives ``None`` (Lightning skips the batch) and the job drops the step.

The strategy uses the process's job (:func:`sia_slurm.job.elastic.init` with its defaults, unless
the script called it first with its own options, e.g. ``checkpoint_interval_s``).

Limits: one optimizer and at most one LR scheduler; ``Trainer.fit`` only (the process group
is left at the end of training), without ``ckpt_path`` (it would overwrite the job's restored
state); ``trainer.global_step`` counts micro-batches (the job's
``current_job().step`` counts optimizer steps); Lightning's own per-batch SIGTERM broadcast
remains (a one-element collective of its own).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments.cluster_environment import ClusterEnvironment
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import TrainerFn

from sia_slurm.job.elastic.dataloader import ElasticDataLoader
from sia_slurm.job.elastic.ddp import ElasticDataParallel
from sia_slurm.job.elastic.job import ElasticJob, ElasticJobError, current_job

logger = logging.getLogger(__name__)


class JobCluster(ClusterEnvironment):
    """Lightning's view of the job's process group, as :func:`sia_slurm.job.elastic.init` made it
    (torchrun started the processes; Lightning's settings of world size and rank are
    ignored, and SLURM's variables, which describe the batch step's nodes, are not read)."""

    def __init__(self, job: ElasticJob):
        self.job = job

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return int(os.environ.get("MASTER_PORT", "0"))

    @staticmethod
    def detect() -> bool:
        return True

    def world_size(self) -> int:
        return self.job.replicas

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return self.job.rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return int(os.environ.get("LOCAL_RANK", "0"))

    def node_rank(self) -> int:
        return int(os.environ.get("GROUP_RANK", "0"))


class ElasticStrategy(DDPStrategy):
    """``DDPStrategy`` over the job's :class:`ElasticDataParallel` (see the module docstring).

    ``lr_scaling`` is a rule of :mod:`sia_slurm.job.elastic.lr` (default: by optimizer);
    ``ddp_options`` pass to ``DistributedDataParallel``.
    """

    strategy_name = "sia_elastic"

    def __init__(
        self,
        *,
        lr_scaling: str | None = None,
        job: ElasticJob | None = None,
        **ddp_options: Any,
    ):
        self.job = job if job is not None else current_job()
        super().__init__(cluster_environment=JobCluster(self.job), **ddp_options)
        self._lr_scaling = lr_scaling

    @property
    def root_device(self) -> torch.device:
        return self.job.device

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        """For the DistributedSampler Lightning gives the validation data: the job's ranks
        (Lightning's count, devices x nodes of the Trainer, is not the job's)."""
        return {"num_replicas": self.job.replicas, "rank": self.job.rank}

    def setup(self, trainer: pl.Trainer) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            super().setup(trainer)
            return
        if trainer.accumulate_grad_batches != 1:
            raise ElasticJobError(
                "ElasticStrategy: remove accumulate_grad_batches; the scheduler's assignment "
                "decides the accumulation"
            )
        assert self.accelerator is not None and self.model is not None
        # Lightning counts an epoch's batches when it loads the training data (once, by
        # default): reloaded every epoch, the count is the job's at each epoch's start (a
        # later loader continues at the current sample, ElasticJob.attach_sampler)
        trainer.reload_dataloaders_every_n_epochs = 1
        self.accelerator.setup(trainer)
        self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.setup_optimizers(trainer)
        self.model = self._elastic_model()
        self.setup_precision_plugin()
        _optimizers_to_device(self.optimizers, self.root_device)
        if not any(isinstance(c, ElasticCallback) for c in trainer.callbacks):
            trainer.callbacks.append(ElasticCallback())

    def _elastic_model(self) -> ElasticDataParallel:
        """The LightningModule in the job's DDP wrapper, with the optimizer, the scheduler and
        the precision plugin's clipping made accumulation-aware."""
        if len(self.optimizers) != 1 or len(self.lr_scheduler_configs) > 1:
            raise ElasticJobError(
                f"ElasticStrategy: configure_optimizers gave {len(self.optimizers)} optimizers "
                f"and {len(self.lr_scheduler_configs)} schedulers; one optimizer and at most "
                "one scheduler are supported"
            )
        scheduler = self.lr_scheduler_configs[0].scheduler if self.lr_scheduler_configs else None
        model = ElasticDataParallel(
            self.model,  # type: ignore[arg-type]
            self.optimizers[0],
            scheduler=scheduler,
            scaler=getattr(self.precision_plugin, "scaler", None),
            lr_scaling=self._lr_scaling,
            job=self.job,
            **self._ddp_kwargs,
        )
        # (the module's hook, not scheduler.step: a scheduler saves its __dict__)
        _skip_while_accumulating(self.lightning_module, "lr_scheduler_step", self.job)
        _skip_while_accumulating(self.precision_plugin, "clip_gradients", self.job, model.reduced)
        return model

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().training_step(*args, **kwargs)
        except torch.cuda.OutOfMemoryError as exc:
            if not self.job.absorb_out_of_memory(exc):
                raise
            return None  # Lightning skips the backward; the job drops the step

    def backward(
        self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any
    ) -> torch.Tensor:
        if self.job.dropping:
            return closure_loss
        try:
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        except torch.cuda.OutOfMemoryError as exc:
            if not self.job.absorb_out_of_memory(exc):
                raise
            return closure_loss.detach()

    def teardown(self) -> None:
        if isinstance(self.model, ElasticDataParallel):
            self.model = self.lightning_module
        super().teardown()
        if self.job.completed:
            self.job.leave_process_group()


class ElasticCallback(pl.Callback):
    """Connects Lightning's loop to the job (added by :class:`ElasticStrategy`)."""

    def __init__(self) -> None:
        self._batch: Any = None  # the job's batch when Lightning last counted the epoch

    @staticmethod
    def _job(trainer: pl.Trainer) -> ElasticJob:
        strategy = trainer.strategy
        if not isinstance(strategy, ElasticStrategy):
            raise ElasticJobError("ElasticCallback needs Trainer(strategy=ElasticStrategy())")
        return strategy.job

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Take SIGTERM back from Lightning, and resume its epoch counter at the job's."""
        job = self._job(trainer)
        if not isinstance(trainer.train_dataloader, ElasticDataLoader):
            raise ElasticJobError(
                "ElasticStrategy: train_dataloader() must return an ElasticDataLoader, got "
                f"{type(trainer.train_dataloader).__name__}"
            )
        if job.signals.installed:  # Lightning's handler replaced the job's
            job.signals.install()
        sampler = trainer.train_dataloader.sampler
        if sampler.epoch_done:
            sampler.next_epoch()
        for tracker in (
            trainer.fit_loop.epoch_progress.current,
            trainer.fit_loop.epoch_progress.total,
        ):
            tracker.ready = tracker.started = tracker.processed = tracker.completed = sampler.epoch
        self._batch = job.batch

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        sampler = self._loader(trainer).sampler
        if sampler.epoch_done:
            sampler.next_epoch()

    def on_train_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        """End the optimizer step after its last micro-batch, then obey the agreement. After
        a rebatch, Lightning's count of the epoch's batches becomes the new batch's (before
        it fetches the next one: it decides there whether that one is the epoch's last)."""
        job = self._job(trainer)
        micro = job.current
        if micro is None or not micro.last:
            return
        job.finish_step()
        if job.batch != self._batch:
            self._batch = job.batch
            _recount_epoch(trainer, batch_idx + 1 + len(self._loader(trainer)))
        if job.noise.known:
            pl_module.log_dict(
                {
                    "sia/batch_size": float(job.batch.batch_size),
                    "sia/grad_sqr": job.noise.grad_sqr,
                    "sia/grad_var": job.noise.grad_var,
                },
                on_step=True,
                on_epoch=False,
            )
        job.obey_control()

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._job(trainer).complete()

    @staticmethod
    def _loader(trainer: pl.Trainer) -> ElasticDataLoader:
        loader = trainer.train_dataloader
        assert isinstance(loader, ElasticDataLoader)
        return loader


def _recount_epoch(trainer: pl.Trainer, total: int) -> None:
    """Lightning's count of the epoch's batches (micro-batches) becomes ``total``: the
    number it ends the epoch at, steps epoch-interval schedulers and validates at. This
    reaches into the fit loop's data fetcher (Lightning 2.5-2.6; tests/job/
    test_lightning.py fails if a later version moves it)."""
    loop = trainer.fit_loop
    if trainer.val_check_batch == loop.max_batches:
        trainer.val_check_batch = total
    loop.max_batches = total
    fetcher = loop._data_fetcher
    if fetcher is None or not hasattr(fetcher, "length"):
        raise ElasticJobError("this Lightning version's fit loop has no data fetcher length")
    fetcher.length = total


def _skip_while_accumulating(
    owner: Any, name: str, job: ElasticJob, before: Callable[[], None] | None = None
) -> None:
    """``owner.name(...)`` does nothing on a micro-batch that is not its step's last (nor on a
    dropped profiling step), and calls ``before()`` first on the last one."""
    real = getattr(owner, name)

    def call(*args: Any, **kwargs: Any) -> Any:
        if job.accumulating or job.dropping:
            return None
        if before is not None:
            before()
        return real(*args, **kwargs)

    setattr(owner, name, call)
