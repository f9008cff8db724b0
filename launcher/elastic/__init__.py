"""Training-side helpers that make a PyTorch script elastic under the Sia controller.

The public surface is small: :class:`ElasticTrainer` drives the loop (see its module for the
four-line change a script makes); the pieces it is built from are usable on their own and are
tested separately: :class:`ElasticSampler` (resumable data order), :class:`CheckpointManager`
(crash-safe checkpoints), :class:`GradientNoise` (``grad_sqr``/``grad_var``),
:class:`LRScaling` (AdaScale or square-root rule) and :class:`MetricsReporter`.
"""

from launcher.elastic.checkpoint import CheckpointError, CheckpointManager
from launcher.elastic.lr import RULES as LR_SCALING_RULES
from launcher.elastic.lr import LRScaling
from launcher.elastic.metrics import MetricsReporter
from launcher.elastic.noise import GradientNoise
from launcher.elastic.sampler import ElasticSampler, SamplerError, StepPlan
from launcher.elastic.trainer import Batch, ElasticTrainer, Step, TrainerError
from launcher.jobenv import JobEnvironment

__all__ = [
    "LR_SCALING_RULES",
    "Batch",
    "CheckpointError",
    "CheckpointManager",
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
]
