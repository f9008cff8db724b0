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

The factor is applied around ``optimizer.step()`` only and taken off again afterwards, so the
LR scheduler keeps stepping on the unscaled values and its state stays M0-based.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from launcher.elastic.noise import GradientNoise

RULES = ("adascale", "sqrt", "linear", "none")


class LRScaling:
    """A batch-size scaling rule for the learning rate of one optimizer."""

    def __init__(self, rule: str, init_batch_size: int):
        if rule not in RULES:
            raise ValueError(f"lr scaling rule: expected one of {', '.join(RULES)}, got {rule!r}")
        if init_batch_size < 1:
            raise ValueError(f"init_batch_size: expected >= 1, got {init_batch_size}")
        self.rule = rule
        self.init_batch_size = init_batch_size

    def factor(self, batch_size: int, noise: GradientNoise) -> float:
        """The multiplier of the M0 learning rate at global batch ``batch_size``."""
        scale = batch_size / self.init_batch_size
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
