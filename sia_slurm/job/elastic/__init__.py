"""Training-side helpers that make a PyTorch script elastic under the Sia controller.

A script written for ``DistributedDataParallel`` keeps its loop and changes a few lines
(``docs/protocol.md``, "Making a DDP script elastic"): :func:`init` instead of
``init_process_group``, :class:`ElasticDataParallel` instead of DDP, :class:`ElasticDataLoader`
instead of a DataLoader with a DistributedSampler, :func:`remaining_epochs` instead of
``range(epochs)``, and ``model.clip_grad_norm_`` for clipping.

A script written around steps instead of a DataLoader can use :class:`ElasticTrainer`, a thin
loop over the same parts (see its module). The pieces are usable on their own and are tested
separately: :class:`ElasticSampler` (resumable data order), :class:`CheckpointManager`
(crash-safe checkpoints), :class:`GradientNoise` (``grad_sqr``/``grad_var``),
:class:`LRScaling` (AdaScale or square-root rule) and :class:`MetricsReporter`.
"""

from sia_slurm.job.elastic.checkpoint import CheckpointError, CheckpointManager
from sia_slurm.job.elastic.dataloader import ElasticDataLoader
from sia_slurm.job.elastic.ddp import ElasticDataParallel
from sia_slurm.job.elastic.job import ElasticJob, ElasticJobError, current_job, init
from sia_slurm.job.elastic.lr import RULES as LR_SCALING_RULES
from sia_slurm.job.elastic.lr import LRScaling
from sia_slurm.job.elastic.metrics_reporter import MetricsReporter
from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.elastic.sampler import ElasticSampler, SamplerError, StepPlan
from sia_slurm.job.elastic.steps import Batch
from sia_slurm.job.elastic.trainer import ElasticTrainer, Step, TrainerError
from sia_slurm.job.jobenv import JobEnvironment


def remaining_epochs(max_epochs: int, *, max_steps: int | None = None):  # type: ignore[no-untyped-def]
    """The epochs still to train by the process's job (``range(max_epochs)`` made resumable)."""
    return current_job().remaining_epochs(max_epochs, max_steps=max_steps)


__all__ = [
    "LR_SCALING_RULES",
    "Batch",
    "CheckpointError",
    "CheckpointManager",
    "ElasticDataLoader",
    "ElasticDataParallel",
    "ElasticJob",
    "ElasticJobError",
    "ElasticSampler",
    "ElasticTrainer",
    "GradientNoise",
    "JobEnvironment",
    "LRScaling",
    "MetricsReporter",
    "SamplerError",
    "Step",
    "StepPlan",
    "TrainerError",
    "current_job",
    "init",
    "remaining_epochs",
]
