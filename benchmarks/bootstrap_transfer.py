"""How well Sia's bootstrap projects a type's multi-GPU step times, against the traces.

Reference section 3: until type A has run a job on several GPUs, its multi-GPU goodput is type
B's times ``xput1(A) / xput1(B)``, as if every type scaled alike. This benchmark asks the
measured traces (``data/traces/<app>/placements-<key>.csv``, the five types of
``profiles/gpu_types.csv``) how far that is from A's measured multi-GPU steps, and sets beside it
one alternative, never used by the controller: A's own compute model (fitted from A's 1-GPU
points alone) with B's all-reduce terms taken as absolute times (B's ``alpha_n``, ``beta_n``,
``alpha_r``, ``beta_r``, ``gamma``), as if the network, not the GPU, set the all-reduce.

For every app, every target type A and every source type B != A: A's 1-GPU points give A's
model and ``xput1(A)``; all of B's points give B's; every multi-GPU point of A is predicted both
ways at its own shape and local batch (no accumulation) and compared with its measured step
time; beside them the floor, A's own model fitted from all its points (what the controller uses
once A has run the job on several GPUs). Prints, per app and pooled, the median and 90th
percentile of the absolute error of the predicted step time, for each; then Sia's error by
the source's rank in closeness of 1-GPU speed to the target (``|log xput1(B) / xput1(A)|``):
whether the type nearest in speed projects best.

``python -m benchmarks.bootstrap_transfer`` (seconds; a fit per type and app).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sia_slurm.model.fit import fit_observations
from sia_slurm.model.throughput import ThroughputParams, step_time
from sia_slurm.protocol.observation import Observation
from sia_slurm.protocol.profile import load_profiles, read_trace_points

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT / "data" / "traces"
# profile type -> its name in the traces (profiles/gpu_types.csv's trace_key)
TRACE_KEYS = {name: t.trace_key for name, t in load_profiles().gpu_types.items() if t.trace_key}
APPS = ("bert", "cifar10", "deepspeech2", "imagenet", "ncf", "yolov3")


@dataclass(frozen=True)
class TypeData:
    """One app's trace on one type: its points, its fitted models and its best 1-GPU rate."""

    points: tuple[Observation, ...]
    single: ThroughputParams  # fitted from the 1-GPU points alone
    full: ThroughputParams  # fitted from every point
    xput1: float  # best 1-GPU samples/s over the 1-GPU points


def trace(app: str, key: str) -> tuple[Observation, ...] | None:
    """The app's points on the type, or None where the type has no file, no 1-GPU point or
    no multi-GPU point (nothing to project from or to)."""
    path = TRACES / app / f"placements-{key}.csv"
    if not path.exists():
        return None
    points = tuple(read_trace_points(path))
    gpus = {p.gpus == 1 for p in points}
    return points if gpus == {True, False} else None


def load(app: str, key: str) -> TypeData | None:
    points = trace(app, key)
    if points is None:
        return None
    single = [p for p in points if p.gpus == 1]
    return TypeData(
        points=points,
        single=fit_observations(single),
        full=fit_observations(points),
        xput1=max(p.local_bsz / p.step_time for p in single),
    )


def predicted(point: Observation, params: ThroughputParams) -> float:
    return float(step_time(params, point.nodes, point.gpus, point.local_bsz))


def sia_projection(point: Observation, target: TypeData, source: TypeData) -> float:
    """A's step at the point's shape from B's model and the xput1 ratio (reference section 3):
    at a fixed local batch, throughput scales by the ratio, so the step time by its inverse."""
    return predicted(point, source.full) * source.xput1 / target.xput1


def absolute_network(point: Observation, target: TypeData, source: TypeData) -> float:
    """A's compute terms with B's all-reduce terms as absolute times."""
    params = replace(source.full, alpha_c=target.single.alpha_c, beta_c=target.single.beta_c)
    return predicted(point, params)


# Per multi-GPU point of A and source B: B's rank (:func:`pairs`), Sia's error, the
# alternative's, A's own model's.
Errors = tuple[int, float, float, float]


def errors(types: dict[str, TypeData]) -> Iterable[Errors]:
    """:data:`Errors` of every multi-GPU point of every target, from every source."""
    for rank, target, source in pairs(types):
        for point in target.points:
            if point.gpus == 1:
                continue
            sia = sia_projection(point, target, source) / point.step_time - 1
            alt = absolute_network(point, target, source) / point.step_time - 1
            own = predicted(point, target.full) / point.step_time - 1
            yield rank, sia, alt, own


def pairs(types: dict[str, TypeData]) -> Iterable[tuple[int, TypeData, TypeData]]:
    """(rank, A, B) for every target A and source B != A, the rank B's in closeness of 1-GPU
    speed to A among A's sources (0: the nearest)."""
    for target_name, target in types.items():
        sources = sorted(
            (abs(math.log(source.xput1 / target.xput1)), name)
            for name, source in types.items()
            if name != target_name
        )
        for rank, (_, name) in enumerate(sources):
            yield rank, target, types[name]


def summary(values: Sequence[float]) -> str:
    absolute = sorted(abs(v) for v in values)
    p90 = absolute[min(len(absolute) - 1, int(0.9 * len(absolute)))]
    return f"{statistics.median(absolute):6.1%} {p90:6.1%}"


def line(name: str, rows: Sequence[Errors]) -> str:
    _, sia, alt, own = (list(column) for column in zip(*rows, strict=True))
    return f"{name:12} {len(rows):6}  {summary(sia):>13}  {summary(alt):>16}  {summary(own):>13}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--apps", nargs="*", default=list(APPS))
    args = parser.parse_args()
    print("absolute error of the predicted multi-GPU step time, median and p90")
    print(f"{'app':12} {'points':>6}  {'Sia (ratio)':>13}  {'absolute network':>16}  "
          f"{'own model':>13}")  # fmt: skip
    pooled: list[Errors] = []
    for app in args.apps:
        types = {
            name: data for name, key in TRACE_KEYS.items() if (data := load(app, key)) is not None
        }
        rows = list(errors(types))
        pooled += rows
        print(line(app, rows))
    print(line("pooled", pooled))
    _, sia, alt, _ = np.abs(np.array(pooled)).T
    better = np.mean(alt < sia)
    ranked: dict[int, list[float]] = {}
    for rank, error, _, _ in pooled:
        ranked.setdefault(rank, []).append(error)
    print(f"the alternative is closer on {better:.0%} of the points")
    print("\nSia's projection by the source's closeness in 1-GPU speed (0: the nearest type)")
    for rank, values in sorted(ranked.items()):
        print(f"{rank:4} {len(values):6}  {summary(values)}")


if __name__ == "__main__":
    main()
