"""Sia's profiling run, simulated: the sweep a profiling job measures and the document it writes.

A job the controller has no profile for is *profiling* (docs/profiling.md): a ``Start`` or
``Move`` with a ``profile_sweep`` gives it one GPU of a type it has not measured yet, and the
run, after its restart, trains a few steps at each per-GPU batch of the sweep, stops at the
first batch that does not fit the GPU's memory, and writes what it measured (every type so far)
as a profile document. The simulated cluster replays that here from the ground truth:

* **What fits.** The largest per-GPU batch of the type is the largest one the ground truth
  measured on one GPU (:meth:`~sia_slurm.sim.groundtruth.GroundTruth.local_bsz_range`; for the
  artifact's apps it equals ``max_local_bsz.csv`` of the shipped profiles). The sweep's batches
  up to it fit; the first one above it is a failed try (out of memory) and ends the sweep.
* **How long.** Each batch that fits costs ``1 + steps`` steps (one warm-up, ``steps``
  measured; the job side's default is 3) of the truth's 1-GPU step time at that batch; a failed
  try costs one step at the largest batch that fit (the job allocates, runs out of memory,
  frees it). A step takes the truth's (uncalibrated) step time, as every simulated step does
  (:mod:`sia_slurm.sim.progress`: the calibration slows progress, not the step timer).
* **What it is worth.** The steps are real training: each segment progresses at its batch's
  throughput and true statistical efficiency, like any run at that batch on one GPU (the
  failed try makes no progress).
* **What it reports.** The step and sync times of every batch that fit, each multiplied by
  lognormal noise (``sigma``, seeded by the simulation's seed, the job and the type, so a run
  is reproducible), and as the type's ``max_local_bsz`` the largest batch of the sweep that fit
  (the job knows no more: it only tried the sweep's batches). A draw the controller's checks
  would refuse (:func:`~sia_slurm.protocol.profile_json.measured_problems`: step times that do not
  grow with the batch, which 5% noise can fake where the truth grows by little, e.g. ncf on
  A100, 16% from batch 16 to 32768) is drawn again; :attr:`SweepPlan.redraws` counts them.
"""

from __future__ import annotations

import zlib
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sia_slurm.protocol import ProtocolError
from sia_slurm.protocol.profile_json import (
    PROFILE_FORMAT,
    measured_problems,
    measured_seed,
    profile_from_json,
)
from sia_slurm.sim.groundtruth import GroundTruth

PROFILE_STEPS = 3  # measured steps per batch (the job side's SIA_PROFILE_STEPS default)
WARMUP_STEPS = 1
DEFAULT_NOISE = 0.05  # sigma of the lognormal noise on reported step times
MAX_REDRAWS = 20  # noise draws tried before reporting the truth itself

Point = tuple[int, float, float]  # (per-GPU batch, step time, sync time) on one GPU


@dataclass
class Segment:
    """One stretch of a sweep: ``seconds`` left at per-GPU batch ``local_bsz`` (0: the failed
    try, which trains nothing)."""

    seconds: float
    local_bsz: int


@dataclass
class SweepPlan:
    """A profiling run's sweep on one GPU of ``profile_type``: what is left to do of it, what the
    truth says it measures, and the largest batch that fit."""

    profile_type: str
    segments: list[Segment]
    points: tuple[Point, ...]  # noise-free truth at each batch that fit
    limit: int  # largest batch of the sweep that fit (0: none did)
    seconds: float = field(init=False)  # the whole sweep's duration

    def __post_init__(self) -> None:
        self.seconds = sum(s.seconds for s in self.segments)


def plan_sweep(
    speed: GroundTruth,
    profile_type: str,
    sweep: Collection[int],
    *,
    steps: int = PROFILE_STEPS,
) -> SweepPlan:
    """The sweep ``sweep`` (increasing per-GPU batches) on one GPU whose truth is ``speed``."""
    largest = int(speed.local_bsz_range(1, 1)[1])
    batches = sorted(sweep)
    fitting = [b for b in batches if b <= largest]
    points: list[Point] = []
    segments: list[Segment] = []
    for local_bsz in fitting:
        step, sync = (float(x) for x in speed.step_time(1, 1, local_bsz))
        points.append((local_bsz, step, sync))
        segments.append(Segment((WARMUP_STEPS + steps) * step, local_bsz))
    if len(fitting) < len(batches):
        # The failed try: one step's allocation at the largest batch that fit (or at the
        # memory limit if none did), then the out-of-memory error.
        at = fitting[-1] if fitting else largest
        segments.append(Segment(float(speed.step_time(1, 1, at)[0]), 0))
    return SweepPlan(profile_type, segments, tuple(points), fitting[-1] if fitting else 0)


@dataclass
class ProfiledTypes:
    """What one job measured so far, type by type (kept across its restarts, as the job side
    keeps it in its checkpoint), and the document it writes."""

    measured: dict[str, tuple[int, tuple[Point, ...]]] = field(default_factory=dict)
    redraws: int = 0  # noise draws the checks would have refused (module doc)

    def add(
        self,
        plan: SweepPlan,
        *,
        header: Mapping[str, Any],
        gpu_types: Collection[str],
        rng_key: tuple[int, ...],
        sigma: float,
    ) -> dict[str, Any] | None:
        """Record ``plan``'s measurements (noisy) and return the document of every type so far
        (``None`` if nothing fit, so nothing was measured). ``header`` holds the document's
        app and batch fields; ``rng_key`` seeds the noise."""
        if not plan.points:
            return None
        for attempt in range(MAX_REDRAWS + 1):
            noise = sigma if attempt < MAX_REDRAWS else 0.0  # the truth, at last
            noisy = _noisy(plan.points, (*rng_key, attempt), noise)
            self.measured[plan.profile_type] = (plan.limit, noisy)
            document = self.document(header)
            if not _refused(document, plan.profile_type, gpu_types):
                return document
            self.redraws += 1
        return document

    def document(self, header: Mapping[str, Any]) -> dict[str, Any]:
        """The profile document of every type measured (``profile.json``'s format)."""
        smallest = min(b for _, points in self.measured.values() for b, _, _ in points)
        m0 = int(header["init_batch_size"])
        return {
            "format": PROFILE_FORMAT,
            "app": header["app"],
            "init_batch_size": m0,
            "max_batch_size": max(int(header["max_batch_size"]), m0),
            "min_local_bsz": min(smallest, m0),
            "max_local_bsz": {t: limit for t, (limit, _) in sorted(self.measured.items())},
            "seed": measured_seed(self.measured),
            "description": "measured by the simulator's profiling run",
        }


def noise_key(seed: int, sia_id: str, profile_type: str, sweeps: int) -> tuple[int, ...]:
    """A stable seed for the noise of one sweep (Python's ``hash`` of a string is salted)."""
    return (seed, zlib.crc32(sia_id.encode()), zlib.crc32(profile_type.encode()), sweeps)


def _noisy(points: tuple[Point, ...], key: tuple[int, ...], sigma: float) -> tuple[Point, ...]:
    """``points`` with step and sync times scaled by one lognormal factor per point (sync
    stays below step); unchanged with ``sigma`` 0."""
    if not sigma:
        return points
    factors = np.random.default_rng(key).lognormal(0.0, sigma, len(points)).tolist()
    return tuple(
        (b, step * f, sync * f) for (b, step, sync), f in zip(points, factors, strict=True)
    )


def _refused(document: Mapping[str, Any], profile_type: str, gpu_types: Collection[str]) -> bool:
    """Whether the controller would refuse ``document``'s ``profile_type``."""
    try:
        profile = profile_from_json(document, "simulated profiled.json", gpu_types)
    except (ProtocolError, ValueError):
        return True
    return bool(measured_problems(profile, [profile_type]))
