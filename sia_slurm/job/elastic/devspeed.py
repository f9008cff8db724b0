"""A dev cluster's fake GPU types made as fast (and as big) as the GPUs they stand for.

Every fake GPU of a dev cluster is the same CPU, so without help a job would train equally
fast on every type and a profiling run would measure no difference. The dev cluster gives its
jobs ``SIA_DEVCLUSTER_SPEED=a100=1,rtx=0.35,...`` (``dev/sia_slurm_dev/speed.py`` derives the
factors from the shipped profiles; docs/profiling.md, "On the dev cluster"); on a type of factor
``f`` :func:`pace_step` makes each optimizer step take ``1/f`` times its compute, by sleeping
``(1/f - 1)`` times it once per step. A real cluster never sets the variable, and then nothing
here does anything.

What is stretched, and how it is reported: the step's compute runs from its first micro-batch
(:attr:`StepStats.started`) to the moment its last gradient is ready, just before the last
all-reduce (:attr:`StepStats.sync_ready`), less the time DDP's forward spent before the model's
(:attr:`StepStats.ddp_forward_s`: its buffer broadcast, a collective, 1.8-2.0 ms a step of
2 replicas on rtx against a 1.5 ms forward); with peers it is at most the CPU time the process
spent in the step (never the time it waited on them), alone it is the whole wall time. The
sleep happens at the end of the step, before its time is recorded, and the recorded times are
moved as if the compute itself had been slower:
the synchronising micro-batch's step time grows by ``(1/f - 1)`` times its own compute, its
sync time (the all-reduce wait) stays what was measured. Over several accumulated
micro-batches the whole step sleeps, but only the last micro-batch's share shows in its
reported step time, as on a slower GPU.

``SIA_DEVCLUSTER_MEMORY=a100=320,...`` is the largest per-GPU batch each type's emulated memory
holds (:func:`emulated_memory`, for the profiling sweep). A malformed variable is logged once
and ignored: a dev cluster's emulation must never crash a job.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from sia_slurm.job.elastic.steps import StepStats

if TYPE_CHECKING:
    from sia_slurm.job.elastic.job import ElasticJob

logger = logging.getLogger(__name__)

# The same names as dev/sia_slurm_dev/speed.py's (a test checks): the job side does not
# import the dev cluster's package, which pulls in the Slurm stack.
SPEED_VARIABLE = "SIA_DEVCLUSTER_SPEED"
MEMORY_VARIABLE = "SIA_DEVCLUSTER_MEMORY"

_exempt: weakref.WeakSet[ElasticJob] = weakref.WeakSet()
_announced: weakref.WeakSet[ElasticJob] = weakref.WeakSet()  # jobs whose first stretch is logged


def parse_type_values(text: str) -> dict[str, float]:
    """``"a100=1,rtx=0.35"`` -> ``{"a100": 1.0, "rtx": 0.35}``; a ValueError says what is wrong.

    Every item must be ``TYPE=NUMBER`` with a non-empty type and a finite positive number,
    each type once; an empty text is no types at all.
    """
    values: dict[str, float] = {}
    if not text.strip():
        return values
    for item in (part.strip() for part in text.split(",")):
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"expected TYPE=NUMBER, got {item!r}")
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > 0):
            raise ValueError(f"{name}: expected a positive number, got {raw.strip()!r}")
        if name in values:
            raise ValueError(f"{name}: given twice")
        values[name] = value
    return values


@functools.lru_cache(maxsize=32)
def _speeds(text: str) -> Mapping[str, float]:
    """The factors of one value of the variable; malformed: none (warned once per value)."""
    try:
        values = parse_type_values(text)
        for name, value in values.items():
            if value > 1.0:
                raise ValueError(f"{name}: expected a factor in (0, 1], got {value:g}")
    except ValueError as exc:
        logger.warning("%s=%r ignored (no slowdown): %s", SPEED_VARIABLE, text, exc)
        return {}
    return values


@functools.lru_cache(maxsize=32)
def _memories(text: str) -> Mapping[str, int]:
    """The memory sizes of one value of the variable; malformed: none (warned once)."""
    try:
        values = parse_type_values(text)
        for name, value in values.items():
            if value != int(value):
                raise ValueError(f"{name}: expected a whole number of samples, got {value:g}")
    except ValueError as exc:
        logger.warning("%s=%r ignored (no memory limit): %s", MEMORY_VARIABLE, text, exc)
        return {}
    return {name: int(value) for name, value in values.items()}


def speed_factor(gpu_type: str, environ: Mapping[str, str] | None = None) -> float:
    """The speed factor of ``gpu_type`` in ``SIA_DEVCLUSTER_SPEED``; 1.0 (full speed) when the
    variable is not set (a real cluster), malformed, or does not name the type."""
    text = (os.environ if environ is None else environ).get(SPEED_VARIABLE)
    if text is None:
        return 1.0
    return _speeds(text).get(gpu_type, 1.0)


def emulated_memory(gpu_type: str, environ: Mapping[str, str] | None = None) -> int | None:
    """The largest per-GPU batch ``gpu_type``'s emulated memory holds (``SIA_DEVCLUSTER_MEMORY``),
    or None: no emulated limit (a real cluster, a malformed variable, a type it does not name)."""
    text = (os.environ if environ is None else environ).get(MEMORY_VARIABLE)
    if text is None:
        return None
    return _memories(text).get(gpu_type)


def exempt(job: ElasticJob) -> None:
    """Leave ``job``'s steps at full speed: for a trainer that already takes each GPU type's
    time itself (the emulated trainer sleeps its profile's time per type), where a slowdown on
    top would count the type's speed twice."""
    _exempt.add(job)


def pace_step(
    job: ElasticJob,
    stats: StepStats,
    last_start: float | None,
    *,
    clock: Callable[[], float] = time.perf_counter,
    sleep: Callable[[float], None] = time.sleep,
    cpu_clock: Callable[[], float] | None = time.process_time,
) -> float:
    """Stretch the step that just ended by the job's GPU type's factor (module docstring).

    Called by :meth:`ElasticJob.end_step` before the step's time is recorded; ``last_start``
    is when the step's last micro-batch began. Moves ``stats.sync_ready``/``sync_done`` by the
    last micro-batch's share and returns the seconds slept (0 at full speed).
    """
    factor = speed_factor(job.env.gpu_type)
    if factor >= 1.0 or job in _exempt:
        return 0.0
    now = clock()
    done = stats.sync_done if stats.sync_done is not None else now
    ready = stats.sync_ready if stats.sync_ready is not None else done
    stretch = 1.0 / factor - 1.0
    compute = max(ready - stats.started - stats.ddp_forward_s, 0.0)
    if cpu_clock is not None and job.replicas > 1:
        # The step's own work, not the time it waited on its peers: a rank that waited for a
        # sleeping peer (at the forward's buffer broadcast, the gradient all-reduce) would
        # otherwise sleep 1/f - 1 times that wait too, its peer then the same times its own
        # wait, and the sleeps grew by that factor every step (a 2-replica job on a type of
        # factor 0.35 stopped dead after ~17 steps, 1.86^17 times its compute).
        # A lone replica waits on no peer: its wall time beyond its CPU time is the shared CPU
        # busy elsewhere, which a slower GPU shared as much would stretch too. Capped at its
        # CPU time, a profiling run (one GPU of each type) measured t4 1.49x slower than a100
        # instead of 4x at load 8 (the sleep stayed fixed while the load stretched the rest).
        compute = min(compute, max(cpu_clock() - stats.started_cpu, 0.0))
    extra = stretch * compute
    last = extra if last_start is None else stretch * max(ready - last_start, 0.0)
    if extra > 0:
        sleep(extra)
        if job not in _announced:
            # Once per job, so that a run's log says its type was emulated (and at what
            # factor): the step times alone cannot, a busy machine slows every type as much.
            _announced.add(job)
            logger.info(
                "%s emulated at speed factor %g (%s): the first step's %.3g ms of compute "
                "slept %.3g ms more",
                job.env.gpu_type,
                factor,
                SPEED_VARIABLE,
                compute * 1e3,
                extra * 1e3,
            )
    stats.sync_ready = ready + min(last, extra)
    stats.sync_done = done + min(last, extra)
    return extra
