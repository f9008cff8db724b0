"""Goodput estimators for tests and benchmarks (``benchmarks/bench_policy.py``,
``benchmarks/bench_gavel_fill.py``); nothing in the package uses them.

They implement :class:`sia_slurm.core.GoodputEstimator` without the real model
(:mod:`sia_slurm.model`), so policies can be checked in isolation:

- :class:`TableEstimator`: goodput read from a table, for hand-built instances and brute force;
- :class:`SyntheticEstimator`: a throughput-like shape, concave in the GPU count, slower across
  nodes, with a per-type speed, for benchmarks at scale;
- :func:`gavel_instance`: a random throughput matrix for Gavel's programs
  (:mod:`sia_slurm.policy.gavel_lp`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sia_slurm.core import Configuration, GoodputRow
from sia_slurm.policy.base import ClusterView, NodeView


def make_row(goodput: np.ndarray, batch_size: np.ndarray, gpus: np.ndarray) -> GoodputRow:
    """A :class:`GoodputRow` with efficiency 1 and no gradient accumulation."""
    goodput = np.asarray(goodput, dtype=np.float64)
    batch = np.asarray(batch_size, dtype=np.int64)
    return GoodputRow(
        goodput=goodput,
        throughput=goodput.copy(),
        efficiency=np.ones_like(goodput),
        batch_size=batch,
        local_bsz=np.maximum(batch // np.maximum(np.asarray(gpus, dtype=np.int64), 1), 1),
        accum_steps=np.zeros_like(batch),
    )


@dataclass(frozen=True)
class TableEstimator:
    """Goodput per configuration from ``table`` (0 for configurations not listed).

    ``per_type`` gives goodput as a function of type and GPU count alone (the node count is
    ignored), a compact way to write small instances; ``table`` entries take precedence. The batch
    size is ``batch_per_gpu`` x GPUs.
    """

    table: Mapping[Configuration, float] = field(default_factory=dict)
    per_type: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    batch_per_gpu: int = 32

    def goodput_of(self, config: Configuration) -> float:
        if config in self.table:
            return float(self.table[config])
        return float(self.per_type.get(config.gpu_type, {}).get(config.gpus, 0.0))

    def evaluate(
        self, configs: Sequence[Configuration], *, fixed_batch: bool = False
    ) -> GoodputRow:
        gpus = np.array([c.gpus for c in configs], dtype=np.int64)
        goodput = np.array([self.goodput_of(c) for c in configs], dtype=np.float64)
        batch = (
            np.full(gpus.shape, self.batch_per_gpu) if fixed_batch else self.batch_per_gpu * gpus
        )
        return make_row(goodput, batch, gpus)


@dataclass(frozen=True)
class SyntheticEstimator:
    """Goodput ``speed[type] * K / (1 + serial * (K - 1)) / (1 + cross * [nodes > 1])``.

    ``serial`` (Amdahl-like) makes goodput concave in the GPU count; ``cross`` penalises crossing
    nodes; ``speed`` is the 1-GPU goodput per type (types absent from it cannot run the job).
    With ``fixed_batch`` the scaling is weaker (no batch growth), as for strong-scaling jobs.
    """

    speed: Mapping[str, float]
    serial: float = 0.05
    cross: float = 0.2
    batch_per_gpu: int = 64

    def evaluate(
        self, configs: Sequence[Configuration], *, fixed_batch: bool = False
    ) -> GoodputRow:
        return SyntheticEstimator.evaluate_many([self], configs, fixed_batch=fixed_batch)[0]

    @staticmethod
    def evaluate_many(
        estimators: Sequence[SyntheticEstimator],
        configs: Sequence[Configuration],
        *,
        fixed_batch: bool = False,
    ) -> list[GoodputRow]:
        """``[e.evaluate(configs, fixed_batch=...) for e in estimators]`` as one array pass
        (the policy's batched path, :func:`sia_slurm.policy.sia.evaluate_rows`)."""
        gpus = np.array([c.gpus for c in configs], dtype=np.float64)
        multi = np.array([c.nodes > 1 for c in configs], dtype=np.float64)
        types = list(dict.fromkeys(c.gpu_type for c in configs))
        column = np.array([types.index(c.gpu_type) for c in configs], dtype=np.intp)
        speed = np.array([[e.speed.get(t, 0.0) for t in types] for e in estimators])[:, column]
        serial = np.array([e.serial for e in estimators])[:, None] * (2.0 if fixed_batch else 1.0)
        cross = np.array([e.cross for e in estimators])[:, None]
        per_gpu = np.array([e.batch_per_gpu for e in estimators])[:, None]
        goodput = speed * gpus / (1.0 + serial * (gpus - 1.0)) / (1.0 + cross * multi)
        batch = (per_gpu * (np.ones_like(gpus) if fixed_batch else gpus)).astype(np.int64)
        batch = np.array(np.broadcast_to(batch, goodput.shape))
        # Every job's row as views of one array per field, as the real estimator builds them
        # (sia_slurm/model/estimator.py): rows of thousands of jobs cost one pass, not one each.
        local = np.maximum(batch // np.maximum(gpus.astype(np.int64), 1), 1)
        ones, zeros = np.ones_like(goodput), np.zeros_like(batch)
        fields = (goodput, goodput.copy(), ones, batch, local, zeros)
        return [GoodputRow(*values) for values in zip(*fields, strict=True)]


def random_synthetic_estimator(
    rng: np.random.Generator, gpu_types: Sequence[str], type_speed: Sequence[float]
) -> SyntheticEstimator:
    """A job with random scalability and a random per-type speed-up around ``type_speed``
    (the paper's jobs gain 3x to 10x from the slowest to the fastest type)."""
    scale = rng.uniform(50, 500)
    speed = {
        name: float(scale * base * rng.lognormal(0.0, 0.3))
        for name, base in zip(gpu_types, type_speed, strict=True)
    }
    return SyntheticEstimator(
        speed=speed, serial=float(rng.uniform(0.01, 0.3)), cross=float(rng.uniform(0.05, 0.5))
    )


def make_cluster(spec: Sequence[tuple[str, int, int]]) -> ClusterView:
    """A fully usable cluster from ``(gpu_type, nodes, gpus_per_node)`` triples; nodes are
    named ``<type>-<i>``."""
    return ClusterView(
        tuple(
            NodeView(f"{gpu_type}-{i}", gpu_type, gpus, gpus)
            for gpu_type, count, gpus in spec
            for i in range(count)
        )
    )


def gavel_instance(seed: int, n_jobs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(throughput, gpus, capacity, weights)`` for Gavel's programs: jobs of 1-8 GPUs on the
    paper's 64-GPU cluster's types (24, 24, 16 GPUs), throughputs spread over types and jobs
    (faster types 2x and 4x on average), a tenth of the (job, type) pairs impossible, weights
    0.5 to 4 (accounts and users of different shares)."""
    rng = np.random.default_rng(seed)
    capacity = np.array([24.0, 24.0, 16.0])
    gpus = rng.choice([1.0, 2.0, 4.0, 8.0], size=n_jobs, p=[0.4, 0.3, 0.2, 0.1])
    throughput = np.array([1.0, 2.0, 4.0]) * rng.lognormal(0.0, 0.5, size=(n_jobs, 3))
    throughput[rng.random((n_jobs, 3)) < 0.1] = 0.0
    weights = rng.choice([0.5, 1.0, 2.0, 4.0], size=n_jobs)
    return throughput, gpus, capacity, weights
