"""How fast, and how big, each fake GPU type of a dev cluster pretends to be.

Every fake GPU of the dev cluster is the same CPU, so a job that profiles itself there
(docs/profiling.md, "On the dev cluster") would measure every type alike and the scheduler
would learn nothing about heterogeneity. The dev cluster therefore tells its jobs two things
per type, through two variables a real cluster never sets:

* ``SIA_DEVCLUSTER_SPEED`` (``a100=1,rtx=0.35,...``): the type's speed factor ``f``; the job
  side (``sia_slurm/job/elastic/devspeed.py``) makes each step take ``1/f`` times as long. The
  factor is derived from the shipped profiles, so the dev cluster's types differ as the profiled
  GPUs do: for each app, a type's best 1-GPU throughput (``local_bsz / step_time`` over its 1-GPU
  seed points) divided by the fastest type's; the factor is the geometric mean over the apps (each
  app weighs the same, whatever its absolute speed), normalised so the fastest type is 1
  (:mod:`sia_slurm.model.type_speeds`, which the profiler uses too). Only the cluster's own
  types take part, so its fastest type never sleeps.
* ``SIA_DEVCLUSTER_MEMORY`` (``a100=320,...``): the largest per-GPU batch, in samples, that
  fits the type's emulated memory: :data:`SAMPLES_PER_GB` per GB of the profiled GPU (the
  ``NNGB`` of its description in ``profiles/gpu_types.csv``). One number per type, the same
  for every model: it only has to stop a profiling sweep earlier on a smaller GPU, as a real
  out-of-memory error would.

A dev cluster type maps to a profile type as in the controller's config
(:data:`~sia_slurm_dev.controller_config.DEFAULT_PROFILES`: ``a100`` -> ``dgx``); a type
without a profile, or whose profile gives no memory size, is left out of the variable
concerned (the job side then runs it at full speed, or with no memory limit).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sia_slurm.model.type_speeds import profile_speed_factors
from sia_slurm.protocol.profile import GpuType, ProfileSet, load_profiles
from sia_slurm_dev.controller_config import DEFAULT_PROFILES
from sia_slurm_dev.spec import DEFAULT_SPEC, DevClusterSpec

SPEED_VARIABLE = "SIA_DEVCLUSTER_SPEED"
MEMORY_VARIABLE = "SIA_DEVCLUSTER_MEMORY"
SAMPLES_PER_GB = 8
"""Emulated memory per GB of the profiled GPU, in samples of a per-GPU batch."""

_GIGABYTES = re.compile(r"(\d+)\s*GB\b")


@dataclass(frozen=True)
class TypeEmulation:
    """What one dev cluster GPU type emulates: its profile type, speed factor and memory.

    ``speed`` is None where the profiles cannot rank the type, ``memory`` None where the
    profile's description names no memory size.
    """

    gpu_type: str
    profile_type: str
    speed: float | None
    memory: int | None


def memory_gb(gpu_type: GpuType) -> int | None:
    """The memory size written in the type's description (``NVIDIA T4 16GB`` -> 16), or None."""
    match = _GIGABYTES.search(gpu_type.description)
    return int(match[1]) if match else None


def emulation(
    gpu_types: Iterable[str],
    *,
    profiles: Mapping[str, str] = DEFAULT_PROFILES,
    profile_set: ProfileSet | None = None,
) -> tuple[TypeEmulation, ...]:
    """What each dev cluster type in ``gpu_types`` emulates, in their order.

    ``profiles`` maps a dev cluster type to its profile type (a type not in it is its own);
    ``profile_set`` defaults to the shipped ``profiles/``.
    """
    names = list(dict.fromkeys(gpu_types))
    loaded = profile_set if profile_set is not None else load_profiles()
    profile_of = {name: profiles.get(name, name) for name in names}
    known = {p for p in profile_of.values() if p in loaded.gpu_types}
    factors = profile_speed_factors(loaded, known)
    rows = []
    for name in names:
        profile = profile_of[name]
        size = memory_gb(loaded.gpu_types[profile]) if profile in loaded.gpu_types else None
        rows.append(
            TypeEmulation(
                gpu_type=name,
                profile_type=profile,
                speed=factors.get(profile),
                memory=None if size is None else size * SAMPLES_PER_GB,
            )
        )
    return tuple(rows)


def format_factor(value: float) -> str:
    """A factor as the variable and the docs write it: three decimals, no trailing zeros."""
    return f"{round(value, 3):g}"


def job_variables(rows: Iterable[TypeEmulation]) -> dict[str, str]:
    """``{SIA_DEVCLUSTER_SPEED: "a100=1,...", SIA_DEVCLUSTER_MEMORY: "a100=320,..."}``; a
    variable with no type to name is left out."""
    rows = tuple(rows)
    speed = ",".join(f"{r.gpu_type}={format_factor(r.speed)}" for r in rows if r.speed is not None)
    memory = ",".join(f"{r.gpu_type}={r.memory}" for r in rows if r.memory is not None)
    variables = {SPEED_VARIABLE: speed, MEMORY_VARIABLE: memory}
    return {name: value for name, value in variables.items() if value}


def spec_variables(spec: DevClusterSpec, profile_set: ProfileSet | None = None) -> dict[str, str]:
    """The two variables for every job of a dev cluster of ``spec``."""
    return job_variables(emulation([g.gpu_type for g in spec.groups], profile_set=profile_set))


def markdown_table(rows: Iterable[TypeEmulation]) -> str:
    """The table docs/profiling.md shows (its test checks that the docs are the code's)."""
    lines = [
        "| dev cluster type | profile type | speed factor | emulated memory (samples) |",
        "|---|---|---|---|",
    ]
    for r in rows:
        speed = "-" if r.speed is None else format_factor(r.speed)
        memory = "-" if r.memory is None else str(r.memory)
        lines.append(f"| `{r.gpu_type}` | `{r.profile_type}` | {speed} | {memory} |")
    return "\n".join(lines) + "\n"


def default_table() -> str:
    """:func:`markdown_table` of the default dev cluster (``DEFAULT_SPEC``)."""
    spec = DevClusterSpec.parse(DEFAULT_SPEC)
    return markdown_table(emulation([g.gpu_type for g in spec.groups]))
