"""A job's own profile as one bounded JSON document: how it crosses the user-file door.

A profile directory (``app.yaml``, ``seed.csv``, ``max_local_bsz.csv``) given with
``sia-sbatch --profile DIR`` lies wherever its user put it, under their control. The controller
never reads it there: ``sia-sbatch``, running as the user, reads the directory and writes it
into the job's directory as ``profile.json`` (:data:`PROFILE_FILE`), and the controller reads
that file through :class:`~sia_slurm.userfiles.JobDirectory` like any other user file
(regular, the job user's own, at most 64 KiB, within the JSON bounds of
:mod:`sia_slurm.safefiles`), then checks every value here (:func:`profile_from_json`) as
strictly as the CSV reader does. A profile measured by the job itself (Sia's profiling) takes
the same road, as ``profiled.json`` (:data:`~sia_slurm.protocol.PROFILED_FILE`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from sia_slurm.protocol import MAX_BATCH, MAX_STEP_SECONDS, PROFILE_FILE, ProtocolError
from sia_slurm.protocol.observation import Observation
from sia_slurm.protocol.profile import AppProfile, parse_placement

PROFILE_FORMAT = 1
__all__ = ["PROFILE_FILE", "PROFILE_FORMAT", "profile_from_json", "profile_to_json"]
_KEYS = {
    "format", "app", "init_batch_size", "max_batch_size", "min_local_bsz", "max_local_bsz",
    "seed", "description",
}  # fmt: skip
_SEED_KEYS = ("gpu_type", "local_bsz", "placement", "step_time", "sync_time")
_Fail = Callable[[str, str], ProtocolError]  # (field, message) -> the error naming the file


def profile_to_json(profile: AppProfile) -> dict[str, Any]:
    """``profile`` as the document :func:`profile_from_json` reads."""
    seed = [
        {
            "gpu_type": gpu_type,
            "local_bsz": obs.local_bsz,
            "placement": _placement(obs),
            "step_time": obs.step_time,
            "sync_time": obs.sync_time,
        }
        for gpu_type, observations in profile.seed.items()
        for obs in observations
    ]
    return {
        "format": PROFILE_FORMAT,
        "app": profile.name,
        "init_batch_size": profile.init_batch_size,
        "max_batch_size": profile.max_batch_size,
        "min_local_bsz": profile.min_local_bsz,
        "max_local_bsz": dict(profile.max_local_bsz),
        "seed": seed,
        "description": profile.description,
    }


MeasuredPoints = Mapping[str, tuple[int, Sequence[tuple[int, float, float]]]]
"""A profiling run's measurements: profile GPU type -> (largest per-GPU batch that fits, its
1-GPU points as (per-GPU batch, step time, sync time))."""


def measured_seed(measured: MeasuredPoints) -> list[dict[str, Any]]:
    """The ``seed`` entries of a profile document for ``measured`` (types in order): what the
    controller's profiling and the simulator's both keep of a profiling run."""
    return [
        {
            "gpu_type": gpu_type,
            "local_bsz": local_bsz,
            "placement": "1",
            "step_time": step_time,
            "sync_time": sync_time,
        }
        for gpu_type, (_, points) in sorted(measured.items())
        for local_bsz, step_time, sync_time in points
    ]


def profile_from_json(
    payload: Mapping[str, Any], where: str, gpu_types: Collection[str]
) -> AppProfile:
    """The profile in ``payload`` (read from ``where``), every value checked: known keys, GPU
    types among ``gpu_types``, batches within bounds and ``min_local_bsz <= M0 <= max``,
    every seed point on a type with a memory limit and within it, positive finite times with
    ``sync_time < step_time``. :class:`ProtocolError` naming ``where`` and the field."""

    def fail(field: str, message: str) -> ProtocolError:
        return ProtocolError(f"{where}: {field}: {message}")

    unknown = sorted(set(payload) - _KEYS)
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(unknown)}")
    if payload.get("format") != PROFILE_FORMAT:
        raise fail(
            "format", f"this sia-slurm reads format {PROFILE_FORMAT}, got {payload.get('format')!r}"
        )
    app = payload.get("app")
    if not isinstance(app, str) or not app:
        raise fail("app", f"expected a name, got {app!r}")
    batch = {
        key: _integer(payload.get(key), 1, MAX_BATCH, fail, key)
        for key in ("init_batch_size", "max_batch_size", "min_local_bsz")
    }
    if not batch["min_local_bsz"] <= batch["init_batch_size"] <= batch["max_batch_size"]:
        raise fail(
            "init_batch_size",
            f"expected min_local_bsz ({batch['min_local_bsz']}) <= init_batch_size <= "
            f"max_batch_size ({batch['max_batch_size']}), got {batch['init_batch_size']}",
        )
    limits_in = payload.get("max_local_bsz")
    if not isinstance(limits_in, dict) or not limits_in:
        raise fail("max_local_bsz", "expected an object of GPU type -> largest per-GPU batch")
    limits = {
        _gpu_type(name, gpu_types, fail, f"max_local_bsz.{name}"): _integer(
            value, 1, MAX_BATCH, fail, f"max_local_bsz.{name}"
        )
        for name, value in limits_in.items()
    }
    rows = payload.get("seed")
    if not isinstance(rows, list) or not rows:
        raise fail("seed", "expected a list of measured steps")
    seed: dict[str, list[Observation]] = {}
    for index, row in enumerate(rows):
        field = f"seed[{index}]"
        name, observation = _seed_point(row, field, gpu_types, limits, fail)
        seed.setdefault(name, []).append(observation)
    description = payload.get("description", "")
    if not isinstance(description, str):
        raise fail("description", f"expected text, got {description!r:.40}")
    return AppProfile(
        name=app,
        init_batch_size=batch["init_batch_size"],
        max_batch_size=batch["max_batch_size"],
        min_local_bsz=batch["min_local_bsz"],
        max_local_bsz=MappingProxyType(dict(sorted(limits.items()))),
        seed=MappingProxyType({name: tuple(seed[name]) for name in sorted(seed)}),
        description=description,
    )


def _seed_point(
    row: Any,
    field: str,
    gpu_types: Collection[str],
    limits: Mapping[str, int],
    fail: _Fail,
) -> tuple[str, Observation]:
    if not isinstance(row, dict) or set(row) != set(_SEED_KEYS):
        raise fail(field, f"expected an object of {', '.join(_SEED_KEYS)}, got {row!r:.80}")
    name = _gpu_type(row["gpu_type"], gpu_types, fail, f"{field}.gpu_type")
    if name not in limits:
        raise fail(f"{field}.gpu_type", f"{name!r} has no max_local_bsz")
    local_bsz = _integer(row["local_bsz"], 1, limits[name], fail, f"{field}.local_bsz")
    placement = row["placement"]
    try:
        nodes, gpus = parse_placement(placement if isinstance(placement, str) else "")
    except ValueError as exc:
        raise fail(f"{field}.placement", str(exc)) from None
    step = _seconds(row["step_time"], fail, f"{field}.step_time")
    sync = _seconds(row["sync_time"], fail, f"{field}.sync_time", zero=True)
    if not sync < step:
        raise fail(f"{field}.sync_time", f"expected less than step_time ({step}), got {sync}")
    return name, Observation(nodes, gpus, local_bsz, step, sync)


def _gpu_type(name: Any, gpu_types: Collection[str], fail: _Fail, field: str) -> str:
    if not isinstance(name, str) or name not in gpu_types:
        known = ", ".join(sorted(gpu_types))
        raise fail(field, f"expected a GPU type of the profiles ({known}), got {name!r:.40}")
    return name


def _integer(value: Any, low: int, high: int, fail: _Fail, field: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise fail(field, f"expected an integer {low}..{high}, got {value!r:.40}")
    return value


def _seconds(value: Any, fail: _Fail, field: str, *, zero: bool = False) -> float:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or not (value >= 0 if zero else value > 0) or value > MAX_STEP_SECONDS:
        low = ">= 0" if zero else "> 0"
        raise fail(field, f"expected seconds {low} and <= {MAX_STEP_SECONDS:g}, got {value!r:.40}")
    return float(value)


def _placement(observation: Observation) -> str:
    """The CSV's placement string: GPUs per node, one digit per node (``"44"``)."""
    per_node = observation.gpus // observation.nodes
    return str(per_node) * observation.nodes


# How step times must grow with the per-GPU batch on one type. Small batches are dominated by
# overheads and noisy: the artifact's 1-GPU traces shipped in profiles/ have yolov3 on v100 41%
# faster at batch 24 than at a smaller one, and ncf on dgx only 16% slower at batch 32768 than at
# 32; a small model measured by its own sweep on the dev cluster was 12% faster at batch 64 than
# at 1 (steps of 5-25 ms, all overhead). So a point may be up to POINT_SLACK faster than a
# smaller batch's slowest, and no more: a broken timer, or a job trying to look cheap at large
# batches, fails that. Steps of a few milliseconds are below the timing noise of a busy machine
# whatever the slack (a process waiting for its turn loses whole scheduler ticks): a transformer
# measured at load 20 gave 5.0 ms at batch 1 and 2.4 ms at batch 4 on a100, refused twice and
# held, an honest job. So a point is refused only when it is also more than POINT_NOISE_S
# faster: a job could look at most that much cheaper, where its steps are that short anyway.
POINT_SLACK = 0.5
POINT_NOISE_S = 0.010


def measured_problems(profile: AppProfile, required_types: Collection[str]) -> list[str]:
    """Why a profile a job measured itself (Sia's profiling run, reported through the door)
    is not to be trusted, beyond the value checks of :func:`profile_from_json`: a GPU type it
    should have been measured on is missing, or its 1-GPU step times do not grow with the
    per-GPU batch (see :data:`POINT_SLACK` and :data:`POINT_NOISE_S`). Empty if none."""
    problems = []
    for gpu_type in sorted(required_types):
        if gpu_type not in profile.seed or gpu_type not in profile.max_local_bsz:
            problems.append(f"{gpu_type}: not measured")
            continue
        single = sorted(
            (obs.local_bsz, obs.step_time) for obs in profile.seed[gpu_type] if obs.gpus == 1
        )
        if not single:
            problems.append(f"{gpu_type}: no step measured on 1 GPU")
            continue
        problem = _shrinking(single)
        if problem:
            problems.append(f"{gpu_type}: {problem}: step times must grow with the batch")
    return problems


def _undercuts(step_time: float, smaller: float) -> bool:
    """Whether a step of ``step_time`` is too fast for a larger batch than one of ``smaller``."""
    return step_time < smaller * (1 - POINT_SLACK) and smaller - step_time > POINT_NOISE_S


def _shrinking(points: list[tuple[int, float]]) -> str:
    """How ``(local batch, step time)`` points, sorted by batch, shrink where they must grow."""
    slowest = 0.0
    for local_bsz, step_time in points:
        if _undercuts(step_time, slowest):
            return (
                f"{step_time:.4g} s at a per-GPU batch of {local_bsz}, under half the "
                f"{slowest:.4g} s of a smaller batch"
            )
        slowest = max(slowest, step_time)
    return ""


def undercut_batches(points: Sequence[tuple[int, float]]) -> set[int]:
    """The batches of ``(local batch, step time)`` points, sorted by batch, that a larger
    batch's point undercuts under the growth rule of :func:`measured_problems`: without them
    the rest passes it. For the job side, before it reports its sweep: a smaller batch that a
    larger one undercuts by that much was slowed by a busy moment (a larger batch cannot be
    that much faster, and a step is never faster than the machine), so its point is left out
    rather than the whole type refused and measured again in another run."""
    kept: list[tuple[int, float]] = []
    dropped: set[int] = set()
    for local_bsz, step_time in points:
        for smaller, smaller_time in list(kept):
            if _undercuts(step_time, smaller_time):
                kept.remove((smaller, smaller_time))
                dropped.add(smaller)
        kept.append((local_bsz, step_time))
    return dropped
