"""Ground truth of a training job's speed: the measured step times the simulator replays.

The policies only ever see *fitted* throughput models; the simulator charges jobs the *measured*
times of the Sia artifact (``data/traces/<app>/``, reference section 6), so a policy is judged by
how well its model predicts reality, as in the paper's simulations. Two files per (app, GPU type):

* ``placements-<key>.csv`` (``placement,local_bsz,step_time,sync_time``): shapes of up to a few
  nodes, the placement written as GPUs per node (``"44"`` = 2 nodes x 4 GPUs);
* ``scalability-<key>.csv`` (``num_nodes,num_replicas,local_bsz,step_time,sync_time``): larger
  shapes, measured without the per-node split.

``step_time`` is the time of one synchronising micro-batch (forward, backward, all-reduce) and
``sync_time`` the part of it spent waiting on the all-reduce, so the compute of a micro-batch is
``step_time - sync_time`` (the meaning of :class:`sia_slurm.model.fit.Observation`). An optimizer
step with ``accum_steps`` extra micro-batches (Pollux's convention) takes

    T_iter = accum_steps * (step_time - sync_time) + step_time

Rules, in the order they are tried for a shape ``(nodes, gpus)``:

1. **Placements.** Rows of every placement with that many nodes and GPUs. The simulated cluster
   knows nodes and GPUs, not the per-node split, so rows of different splits (``"17"``, ``"44"``)
   at the same ``local_bsz`` are averaged.
2. **Scalability.** Rows with ``num_nodes == nodes`` and ``num_replicas == gpus``. Where both
   files measured a shape, placements win, as in the artifact, which consults them first (the two
   files differ by up to 40% on a few two-node shapes, e.g. ncf on ``dgx-ext`` at (2, 3)).
3. **Derived** (neither file has the shape). Bilinear interpolation between measured shapes: take
   the measured node counts just below and above ``nodes``; at each of them, the measured GPU
   counts just below and above ``gpus``; interpolate linearly in the GPU count, then in the node
   count. A count outside the measured range is clamped to the nearest measured one (so a shape
   beyond all measurements takes the time of the largest measured neighbour: ring all-reduce
   time is nearly independent of the ring size at fixed bandwidth). The result is a convex
   combination of measured times, so it never leaves their range and is monotone wherever the
   measurements are; :meth:`GroundTruth.derivation` says which shapes and weights were used.

Within a shape, times are linear in ``local_bsz`` between measured batches. Below the smallest
measured batch both times are held at that batch's values (the fixed per-step overhead dominates
there, and a GPU is not assumed faster than measured). Above the largest, the compute time
continues along the slope of the last two points (never decreasing; compute is linear in the batch
by the model of reference section 2) and the sync time is held (the all-reduce moves gradients,
whose size does not depend on the batch). Batches beyond a GPU's memory limit are the caller's to
exclude; extrapolation only keeps the simulator defined near the edge.

Calibration: the artifact slows each app's measured times by a factor (cifar10 1.8, ncf 1.5,
others 1.2) to match its physical runs. It is a parameter of :meth:`GroundTruth.load` with
:func:`default_calibration` as default, applied to step and sync time alike.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from sia_slurm.model.throughput import global_batch_size
from sia_slurm.protocol.observation import Observation
from sia_slurm.protocol.profile import ProfileError, read_trace_points

FloatArray = npt.NDArray[np.float64]
Shape = tuple[int, int]  # (nodes, gpus)

CALIBRATION_FACTORS = MappingProxyType({"cifar10": 1.8, "ncf": 1.5})
DEFAULT_CALIBRATION_FACTOR = 1.2  # every app not in CALIBRATION_FACTORS


class GroundTruthError(ValueError):
    """A ground-truth file is missing or malformed; the message names the file."""


def default_calibration(app: str) -> float:
    """The artifact's slow-down factor of ``app``'s measured times (reference section 6)."""
    return CALIBRATION_FACTORS.get(app, DEFAULT_CALIBRATION_FACTOR)


def placements_file(traces_dir: Path, app: str, trace_key: str) -> Path:
    return Path(traces_dir) / app / f"placements-{trace_key}.csv"


def scalability_file(traces_dir: Path, app: str, trace_key: str) -> Path:
    return Path(traces_dir) / app / f"scalability-{trace_key}.csv"


def available_trace_keys(traces_dir: Path, app: str) -> tuple[str, ...]:
    """Trace keys with a placements file for ``app``, sorted (a missing app has none)."""
    folder = Path(traces_dir) / app
    prefix = "placements-"
    return tuple(
        sorted(p.stem[len(prefix) :] for p in folder.glob(f"{prefix}*.csv") if p.is_file())
    )


def has_ground_truth(traces_dir: Path, app: str, trace_key: str) -> bool:
    """Whether :meth:`GroundTruth.load` can find data for ``app`` on ``trace_key``."""
    return placements_file(traces_dir, app, trace_key).is_file()


@dataclass(frozen=True, eq=False)
class ShapeCurve:
    """Measured step and sync time of one shape, as functions of the per-GPU batch."""

    local_bsz: FloatArray  # strictly increasing
    step_time: FloatArray
    sync_time: FloatArray

    @classmethod
    def from_points(cls, points: Iterable[Observation]) -> ShapeCurve:
        """Build from observations of one shape; repeated batches are averaged."""
        by_bsz: dict[int, list[tuple[float, float]]] = defaultdict(list)
        for point in points:
            by_bsz[point.local_bsz].append((point.step_time, point.sync_time))
        if not by_bsz:
            raise ValueError("a shape curve needs at least one observation")
        batches = sorted(by_bsz)
        means = np.array([np.mean(by_bsz[b], axis=0) for b in batches], dtype=np.float64)
        return cls(np.array(batches, dtype=np.float64), means[:, 0], means[:, 1])

    def evaluate(self, local_bsz: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """(step_time, sync_time) at ``local_bsz``, with the edge rules of the module doc."""
        m = np.asarray(local_bsz, dtype=np.float64)
        compute = self.step_time - self.sync_time
        compute_at = np.interp(m, self.local_bsz, compute)  # np.interp holds the end values
        sync_at = np.interp(m, self.local_bsz, self.sync_time)
        if self.local_bsz.size > 1:
            last, before = self.local_bsz[-1], self.local_bsz[-2]
            slope = max((compute[-1] - compute[-2]) / (last - before), 0.0)
            compute_at = np.where(m > last, compute[-1] + slope * (m - last), compute_at)
        return compute_at + sync_at, sync_at


@dataclass(frozen=True)
class GroundTruth:
    """Measured speed of one app on one GPU type (trace key), calibrated.

    ``curves`` holds one :class:`ShapeCurve` per measured ``(nodes, gpus)`` and ``sources`` says
    which file each came from (``"placements"`` or ``"scalability"``). Query with
    :meth:`step_time`, :meth:`iteration_time` or :meth:`throughput`; all broadcast over arrays of
    nodes, GPUs and batches, so one call serves every running job of a GPU type.
    """

    app: str
    trace_key: str
    calibration: float
    curves: Mapping[Shape, ShapeCurve]
    sources: Mapping[Shape, str]
    _gpu_counts: Mapping[int, tuple[int, ...]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.calibration > 0:
            raise ValueError(f"calibration: expected a positive factor, got {self.calibration!r}")
        if not self.curves:
            raise ValueError(f"{self.app}/{self.trace_key}: expected measured shapes, got none")
        counts: dict[int, list[int]] = defaultdict(list)
        for nodes, gpus in self.curves:
            counts[nodes].append(gpus)
        frozen = {n: tuple(sorted(ks)) for n, ks in sorted(counts.items())}
        object.__setattr__(self, "_gpu_counts", MappingProxyType(frozen))

    @classmethod
    def load(
        cls,
        traces_dir: Path | str,
        app: str,
        trace_key: str,
        *,
        calibration: float | None = None,
    ) -> GroundTruth:
        """Read ``<traces_dir>/<app>/{placements,scalability}-<trace_key>.csv``.

        The placements file is required, the scalability file optional. ``calibration`` defaults
        to :func:`default_calibration` of ``app``; pass 1.0 for the raw measurements.
        """
        traces_dir = Path(traces_dir)
        placements = placements_file(traces_dir, app, trace_key)
        if not placements.is_file():
            known = ", ".join(available_trace_keys(traces_dir, app)) or "none"
            raise GroundTruthError(
                f"{placements}: file not found: no ground truth for app {app!r} on trace key "
                f"{trace_key!r} (trace keys with data for {app}: {known})"
            )
        points = {"placements": _read(placements)}
        scalability = scalability_file(traces_dir, app, trace_key)
        points["scalability"] = _read(scalability) if scalability.is_file() else []
        curves: dict[Shape, ShapeCurve] = {}
        sources: dict[Shape, str] = {}
        for source in ("placements", "scalability"):  # placements first: they win
            for shape, group in _group_by_shape(points[source]).items():
                if shape not in curves:
                    curves[shape] = ShapeCurve.from_points(group)
                    sources[shape] = source
        factor = default_calibration(app) if calibration is None else float(calibration)
        return cls(
            app=app,
            trace_key=trace_key,
            calibration=factor,
            curves=MappingProxyType(dict(sorted(curves.items()))),
            sources=MappingProxyType(dict(sorted(sources.items()))),
        )

    def local_bsz_range(self, nodes: int, gpus: int) -> tuple[float, float]:
        """Smallest and largest measured per-GPU batch over the shapes ``(nodes, gpus)`` uses."""
        used = [self.curves[s].local_bsz for s, _ in self.derivation(nodes, gpus)]
        return float(min(c[0] for c in used)), float(max(c[-1] for c in used))

    def derivation(self, nodes: int, gpus: int) -> tuple[tuple[Shape, float], ...]:
        """The measured shapes and weights (summing to 1) whose times give ``(nodes, gpus)``.

        One shape with weight 1 when measured; otherwise up to four, by rule 3 of the module doc.
        """
        if nodes < 1 or gpus < nodes:
            raise ValueError(f"expected 1 <= nodes <= gpus, got nodes={nodes} gpus={gpus}")
        if (nodes, gpus) in self.curves:
            return (((nodes, gpus), 1.0),)
        weights: dict[Shape, float] = defaultdict(float)
        for n, w_n in _bracket(tuple(self._gpu_counts), nodes):
            for k, w_k in _bracket(self._gpu_counts[n], gpus):
                weights[(n, k)] += w_n * w_k
        return tuple((shape, w) for shape, w in sorted(weights.items()) if w > 0)

    def step_time(
        self, nodes: npt.ArrayLike, gpus: npt.ArrayLike, local_bsz: npt.ArrayLike
    ) -> tuple[FloatArray, FloatArray]:
        """Calibrated (step_time, sync_time) in seconds of one synchronising micro-batch.

        Arguments broadcast together; the results have the broadcast shape (0-d for scalars).
        """
        n, k, m = np.broadcast_arrays(
            np.asarray(nodes, dtype=np.int64),
            np.asarray(gpus, dtype=np.int64),
            np.asarray(local_bsz, dtype=np.float64),
        )
        step = np.zeros(m.shape, dtype=np.float64)
        sync = np.zeros(m.shape, dtype=np.float64)
        shapes = np.stack([n.reshape(-1), k.reshape(-1)], axis=1)
        flat_step, flat_sync, flat_m = step.reshape(-1), sync.reshape(-1), m.reshape(-1)
        for shape in np.unique(shapes, axis=0):
            rows = np.all(shapes == shape, axis=1)
            for measured, weight in self.derivation(int(shape[0]), int(shape[1])):
                s, y = self.curves[measured].evaluate(flat_m[rows])
                flat_step[rows] += weight * s
                flat_sync[rows] += weight * y
        return step * self.calibration, sync * self.calibration

    def iteration_time(
        self,
        nodes: npt.ArrayLike,
        gpus: npt.ArrayLike,
        local_bsz: npt.ArrayLike,
        accum_steps: npt.ArrayLike = 0,
    ) -> FloatArray:
        """Seconds per optimizer step: ``accum_steps * (step - sync) + step``."""
        step, sync = self.step_time(nodes, gpus, local_bsz)
        return np.asarray(accum_steps, dtype=np.float64) * (step - sync) + step

    def throughput(
        self,
        nodes: npt.ArrayLike,
        gpus: npt.ArrayLike,
        local_bsz: npt.ArrayLike,
        accum_steps: npt.ArrayLike = 0,
    ) -> FloatArray:
        """Samples per second: global batch ``gpus * local_bsz * (accum_steps + 1)`` / T_iter."""
        batch = global_batch_size(gpus, local_bsz, accum_steps)
        return batch / self.iteration_time(nodes, gpus, local_bsz, accum_steps)


def _read(path: Path) -> list[Observation]:
    try:
        return read_trace_points(path)
    except ProfileError as exc:
        raise GroundTruthError(str(exc)) from None


def _group_by_shape(points: Iterable[Observation]) -> dict[Shape, list[Observation]]:
    groups: dict[Shape, list[Observation]] = defaultdict(list)
    for point in points:
        groups[(point.nodes, point.gpus)].append(point)
    return groups


def _bracket(values: Sequence[int], x: int) -> tuple[tuple[int, float], ...]:
    """Neighbours of ``x`` in sorted ``values`` with linear-interpolation weights.

    ``x`` itself if present; the nearest end if ``x`` is outside the range (clamping).
    """
    i = bisect.bisect_left(values, x)
    if i < len(values) and values[i] == x:
        return ((x, 1.0),)
    if i == 0:
        return ((values[0], 1.0),)
    if i == len(values):
        return ((values[-1], 1.0),)
    lo, hi = values[i - 1], values[i]
    return ((lo, (hi - x) / (hi - lo)), (hi, (x - lo) / (hi - lo)))
