"""One measured step of a job: what profiles, traces and running jobs report.

A plain data type that both sides use: the points of a profile's seed (:mod:`.profile`, and
``profile.json`` and ``profiled.json``: :mod:`.profile_json`), which a job measures and the
controller's goodput model (:mod:`sia_slurm.model`) fits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Observation:
    """One measured step of a job on ``gpus`` GPUs of one type over ``nodes`` nodes.

    ``step_time`` is the time of the synchronising micro-batch (forward, backward and the
    gradient all-reduce, i.e. T_sync of the model) and ``sync_time`` the part of it spent waiting
    for the all-reduce after compute finished, so the compute time of a micro-batch is
    ``step_time - sync_time``. This is what the Sia/Pollux traces (``placements-*.csv``) and
    AdaptDL's reports measure. ``accum_steps`` (extra micro-batches per optimizer step) is
    recorded for completeness; it does not change what the two times mean.
    """

    nodes: int
    gpus: int
    local_bsz: int
    step_time: float
    sync_time: float
    accum_steps: int = 0

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus < self.nodes:
            raise ValueError(
                f"observation needs 1 <= nodes <= gpus, got nodes={self.nodes} gpus={self.gpus}"
            )
        if self.local_bsz < 1:
            raise ValueError(f"local_bsz: expected a positive integer, got {self.local_bsz}")
        if self.accum_steps < 0:
            raise ValueError(f"accum_steps: expected an integer >= 0, got {self.accum_steps}")
        if not (math.isfinite(self.step_time) and self.step_time > 0):
            raise ValueError(f"step_time: expected a positive number, got {self.step_time}")
        if not (math.isfinite(self.sync_time) and 0 <= self.sync_time < self.step_time):
            raise ValueError(
                f"sync_time: expected a number in [0, step_time={self.step_time}), "
                f"got {self.sync_time}"
            )

    @property
    def shape(self) -> tuple[int, int, int]:
        """(nodes, gpus, local_bsz): the key under which repeated measurements are merged."""
        return (self.nodes, self.gpus, self.local_bsz)
