"""How fast each GPU type is expected to be for a model nobody has measured yet.

The shipped profiles measured six models on every profiled type; a type's 1-GPU speed against
the fastest type's varies by model (the paper's Figure 1), but its rank seldom does. So the
expected *speed factor* of a type is, for each app, the type's best 1-GPU throughput
(``local_bsz / step_time`` over its 1-GPU seed points) divided by the fastest type's, averaged
over the apps geometrically (each app weighs the same, whatever its absolute speed), and
normalised so the fastest type is 1.

Two users: the profiler measures a new model's types slowest first, so that its profiling ends
on the type it is likeliest to keep (:mod:`sia_slurm.controller.profiling`); the dev cluster
makes its fake GPU types differ by these factors (``sia_slurm_dev.speed``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from sia_slurm.protocol.profile import AppProfile, ProfileSet


def best_one_gpu_throughput(app: AppProfile, profile_type: str) -> float | None:
    """Samples per second of ``app``'s fastest 1-GPU seed point on ``profile_type``, or None."""
    rates = [
        point.local_bsz / point.step_time
        for point in app.seed.get(profile_type, ())
        if point.gpus == 1
    ]
    return max(rates) if rates else None


def profile_speed_factors(profiles: ProfileSet, profile_types: Iterable[str]) -> dict[str, float]:
    """Speed factor of each of ``profile_types`` (module docstring), fastest = 1.0.

    Only apps with 1-GPU seed points on every one of the types count, so that each factor is
    a mean over the same apps; a type no such app measured is left out (and the others are
    ranked among themselves).
    """
    wanted = sorted(set(profile_types))
    measured = [
        t for t in wanted if any(best_one_gpu_throughput(a, t) for a in profiles.apps.values())
    ]
    logs: dict[str, list[float]] = {t: [] for t in measured}
    for app in profiles.apps.values():
        rates = {t: best_one_gpu_throughput(app, t) for t in measured}
        if not measured or any(rate is None for rate in rates.values()):
            continue
        fastest = max(rate for rate in rates.values() if rate is not None)
        for name, rate in rates.items():
            assert rate is not None
            logs[name].append(math.log(rate / fastest))
    means = {name: math.exp(sum(values) / len(values)) for name, values in logs.items() if values}
    if not means:
        return {}
    top = max(means.values())
    return {name: value / top for name, value in means.items()}
