"""Learning-rate scaling when the scheduler changes the batch size.

The user's optimizer and LR scheduler are written for the job's initial batch size M0. When
the job runs at a global batch ``M != M0`` its learning rate is multiplied by a factor chosen
by a rule (reference section 7):

- ``adascale`` (default, Pollux's choice): the AdaScale gain ``(var + sqr) / (var/scale + sqr)``
  from the measured gradient noise (1 until it is measured), which is the progress one step
  at ``M`` makes relative to one step at M0;
- ``sqrt``: ``sqrt(M / M0)``;
- ``linear``: ``M / M0`` (Goyal et al.);
- ``none``: unchanged.

The elastic wrappers (:class:`~sia_slurm.job.elastic.ElasticDataParallel`) take the rule by name or
choose it from the optimizer (:func:`default_rule`): ``adascale`` for the SGD family, whose
update is linear in the gradient (AdaScale's derivation assumes it), ``sqrt`` for Adam-like
optimizers that normalise the update by the gradient's second moment (the update's size
does not grow with the batch, and the square-root rule is the usual choice for them, e.g.
Malladi et al. 2022). A user rule is any ``Callable[[float], float]`` of the scale ``M/M0``.

The factor is applied around ``optimizer.step()`` only and taken off again afterwards, so the
LR scheduler keeps stepping on the unscaled values and its state stays M0-based.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from sia_slurm.job.elastic.noise import GradientNoise

RULES = ("adascale", "sqrt", "linear", "none")
ADAPTIVE_OPTIMIZERS = (
    torch.optim.Adam,
    torch.optim.AdamW,
    torch.optim.Adamax,
    torch.optim.NAdam,
    torch.optim.RAdam,
    torch.optim.Adagrad,
    torch.optim.Adadelta,
    torch.optim.RMSprop,
)


def default_rule(optimizer: torch.optim.Optimizer) -> str:
    """``sqrt`` for an Adam-like (adaptive) optimizer, ``adascale`` otherwise (SGD family)."""
    return "sqrt" if isinstance(optimizer, ADAPTIVE_OPTIMIZERS) else "adascale"


class LRScaling:
    """A batch-size scaling rule for the learning rate of one optimizer."""

    def __init__(self, rule: str | Callable[[float], float], init_batch_size: int):
        if not callable(rule) and rule not in RULES:
            raise ValueError(f"lr scaling rule: expected one of {', '.join(RULES)}, got {rule!r}")
        if init_batch_size < 1:
            raise ValueError(f"init_batch_size: expected >= 1, got {init_batch_size}")
        self.rule = rule
        self.init_batch_size = init_batch_size

    def factor(self, batch_size: int, noise: GradientNoise) -> float:
        """The multiplier of the M0 learning rate at global batch ``batch_size``."""
        scale = batch_size / self.init_batch_size
        if callable(self.rule):
            return float(self.rule(scale))
        if self.rule == "adascale":
            return noise.gain(batch_size)
        if self.rule == "sqrt":
            return math.sqrt(scale)
        if self.rule == "linear":
            return scale
        return 1.0

    @contextmanager
    def applied(self, optimizer: torch.optim.Optimizer, factor: float) -> Iterator[None]:
        """Scale every parameter group's ``lr`` by ``factor`` inside the block."""
        saved = [group["lr"] for group in optimizer.param_groups]
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * factor
        try:
            yield
        finally:
            for group, lr in zip(optimizer.param_groups, saved, strict=True):
                group["lr"] = lr
