"""Which samples each replica trains on, so a job can resume on any number of GPUs.

The data order of an epoch is a permutation fixed by ``(seed, epoch)`` and independent of the
world size; the sampler's whole state is ``(epoch, position)``, where ``position`` counts the
samples of the epoch already trained on by all replicas together. A step takes the next
``batch_size`` samples of the permutation and splits them over ``replicas x micro-batches``
slots. Because only ``position`` survives a restart, a job stopped after a step and restarted
with a different number of GPUs (or batch size) continues with exactly the next sample: none is
skipped or repeated within the epoch. AdaptDL's elastic sampler works the same way.

The last step of an epoch may have fewer samples than the batch; they are spread as evenly as
possible over the fewest micro-batches that keep every micro-batch within ``local_bsz`` (so the
GPU memory limit still holds). Pure index arithmetic: no torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np


class SamplerError(ValueError):
    """A sampler was asked for something impossible or restored from a foreign state."""


@dataclass(frozen=True)
class StepPlan:
    """The samples of one optimizer step, and this replica's share of them.

    ``micro_batches[j]`` holds the dataset indices this replica trains on in micro-batch ``j``
    (it may be empty in the very last step of an epoch when fewer samples than replicas are
    left). ``size`` counts the samples of the step over all replicas. ``uniform`` is True when
    every micro-batch of every replica has the same size, the case the gradient-noise estimate
    needs.
    """

    epoch: int
    position: int
    size: int
    micro_batches: tuple[tuple[int, ...], ...]
    uniform: bool

    @property
    def local_size(self) -> int:
        return sum(len(micro) for micro in self.micro_batches)


class ElasticSampler:
    """Deterministic, resumable partition of a dataset's epochs into elastic steps."""

    def __init__(self, dataset_size: int, *, seed: int = 0, shuffle: bool = True):
        if dataset_size < 1:
            raise SamplerError(f"dataset_size: expected >= 1, got {dataset_size}")
        self.dataset_size = dataset_size
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.position = 0
        self._order_epoch = -1
        self._order: np.ndarray = np.arange(0)

    # ---- the data order ----------------------------------------------------------------------

    def order(self, epoch: int) -> np.ndarray:
        """The sample order of ``epoch`` (the same for every world size and every restart)."""
        if epoch != self._order_epoch:
            if self.shuffle:
                rng = np.random.default_rng(np.random.SeedSequence([self.seed, epoch]))
                self._order = rng.permutation(self.dataset_size)
            else:
                self._order = np.arange(self.dataset_size)
            self._order_epoch = epoch
        return self._order

    # ---- steps ---------------------------------------------------------------------------------

    @property
    def epoch_done(self) -> bool:
        return self.position >= self.dataset_size

    def plan(
        self, *, batch_size: int, local_bsz: int, accum_steps: int, rank: int, replicas: int
    ) -> StepPlan | None:
        """The next step for ``rank`` of ``replicas``; ``None`` when the epoch is finished.

        Does not move the sampler: call :meth:`advance` once the step has been applied.
        """
        if not 0 <= rank < replicas:
            raise SamplerError(f"rank: expected 0 <= rank < {replicas}, got {rank}")
        if local_bsz < 1 or accum_steps < 0:
            raise SamplerError(
                f"local_bsz >= 1 and accum_steps >= 0 expected, got {local_bsz}, {accum_steps}"
            )
        if batch_size != replicas * local_bsz * (accum_steps + 1):
            raise SamplerError(
                f"batch_size: {batch_size} != replicas*local_bsz*(accum_steps+1) = "
                f"{replicas * local_bsz * (accum_steps + 1)}"
            )
        if self.epoch_done:
            return None
        size = min(batch_size, self.dataset_size - self.position)
        micro_count = accum_steps + 1
        if size < batch_size:  # the epoch's tail: fewest micro-batches within local_bsz
            micro_count = -(-size // (replicas * local_bsz))
        bounds = _slot_bounds(size, replicas * micro_count)
        order = self.order(self.epoch)
        start = self.position
        micro_batches = []
        for micro in range(micro_count):
            slot = micro * replicas + rank
            lo, hi = bounds[slot], bounds[slot + 1]
            micro_batches.append(tuple(order[start + lo : start + hi].tolist()))
        uniform = size == batch_size
        return StepPlan(self.epoch, self.position, size, tuple(micro_batches), uniform)

    def advance(self, plan: StepPlan) -> None:
        """Record that ``plan`` was trained on (all replicas call this with their own plan)."""
        if (plan.epoch, plan.position) != (self.epoch, self.position):
            raise SamplerError(
                f"plan for epoch {plan.epoch} position {plan.position} does not continue the "
                f"sampler at epoch {self.epoch} position {self.position}"
            )
        self.position += plan.size

    def next_epoch(self) -> None:
        """Move to the start of the next epoch (only once this one is finished)."""
        if not self.epoch_done:
            raise SamplerError(
                f"epoch {self.epoch} is not finished ({self.position} of {self.dataset_size} "
                "samples trained)"
            )
        self.epoch += 1
        self.position = 0

    # ---- checkpointing -----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "dataset_size": self.dataset_size,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "epoch": self.epoch,
            "position": self.position,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key in ("dataset_size", "seed", "shuffle"):
            if state.get(key) != getattr(self, key):
                raise SamplerError(
                    f"checkpoint's sampler has {key}={state.get(key)!r}, this job has "
                    f"{getattr(self, key)!r}: the data changed, so the position cannot be resumed"
                )
        epoch, position = int(state["epoch"]), int(state["position"])
        if epoch < 0 or not 0 <= position <= self.dataset_size:
            raise SamplerError(f"checkpoint's sampler position {epoch}/{position} is out of range")
        self.epoch, self.position = epoch, position


def _slot_bounds(size: int, slots: int) -> list[int]:
    """Cumulative bounds of ``size`` samples split into ``slots`` near-equal contiguous parts."""
    base, extra = divmod(size, slots)
    bounds = [0]
    for slot in range(slots):
        bounds.append(bounds[-1] + base + (1 if slot < extra else 0))
    return bounds
