"""benchmarks/bootstrap_transfer.py on made-up types: each projection is exact where its
assumption holds (types that scale alike for Sia's ratio; one absolute all-reduce for the
alternative), and every app's traces have two types or more to project between."""

from __future__ import annotations

from benchmarks.bootstrap_transfer import (
    APPS,
    TRACE_KEYS,
    TypeData,
    absolute_network,
    errors,
    pairs,
    sia_projection,
    trace,
)
from sia_slurm.model.fit import fit_observations
from sia_slurm.protocol.observation import Observation

BATCHES = (8, 16, 32, 64)


def made_up(compute_scale: float, network_scale: float) -> TypeData:
    """Steps of ``(2 ms + 0.1 ms * m) * compute_scale`` and, on 2-4 GPUs of one node, an
    all-reduce of ``5 ms * network_scale`` after it (no overlap)."""
    points = []
    for m in BATCHES:
        compute = (0.002 + 0.0001 * m) * compute_scale
        points.append(Observation(1, 1, m, compute, 0.0))
        for gpus in (2, 4):
            network = 0.005 * network_scale
            points.append(Observation(1, gpus, m, compute + network, network))
    single = [p for p in points if p.gpus == 1]
    return TypeData(
        points=tuple(points),
        single=fit_observations(single),
        full=fit_observations(points),
        xput1=max(p.local_bsz / p.step_time for p in single),
    )


def multi(data: TypeData) -> list[Observation]:
    return [p for p in data.points if p.gpus > 1]


def worst_errors(target: TypeData, source: TypeData) -> tuple[float, float]:
    """The largest absolute error of Sia's projection and of the alternative over the
    target's multi-GPU points, projected from ``source``."""
    sia = [sia_projection(p, target, source) / p.step_time - 1 for p in multi(target)]
    alt = [absolute_network(p, target, source) / p.step_time - 1 for p in multi(target)]
    return max(map(abs, sia)), max(map(abs, alt))


def test_sia_projection_holds_where_the_types_scale_alike() -> None:
    fast, slow = made_up(1.0, 1.0), made_up(3.0, 3.0)  # the all-reduce scales with compute
    sia, alt = worst_errors(slow, fast)
    assert sia < 0.15
    assert alt > 0.3


def test_the_absolute_network_holds_where_the_all_reduce_is_the_networks() -> None:
    fast, slow = made_up(1.0, 1.0), made_up(3.0, 1.0)  # one all-reduce time on both
    sia, alt = worst_errors(slow, fast)
    assert alt < 0.15
    assert sia > 0.3
    rows = list(errors({"fast": fast, "slow": slow}))
    assert len(rows) == len(multi(fast)) + len(multi(slow))  # each type as the target once


def test_every_app_has_at_least_two_types_with_multi_gpu_points() -> None:
    for app in APPS:
        loaded = [key for key in TRACE_KEYS.values() if trace(app, key) is not None]
        assert len(loaded) >= 2, (app, loaded)


def test_the_sources_are_ranked_by_closeness_of_1_gpu_speed() -> None:
    types = {"x1": made_up(1.0, 1.0), "x2": made_up(2.0, 1.0), "x5": made_up(5.0, 1.0)}
    names = {id(data): name for name, data in types.items()}
    ranked = [(rank, names[id(a)], names[id(b)]) for rank, a, b in pairs(types)]
    assert ranked == [
        (0, "x1", "x2"), (1, "x1", "x5"),
        (0, "x2", "x1"), (1, "x2", "x5"),
        (0, "x5", "x2"), (1, "x5", "x1"),
    ]  # fmt: skip
