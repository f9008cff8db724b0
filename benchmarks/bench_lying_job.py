"""Does lying in a metrics report pay? One job among honest ones lies, the others tell the truth.

The controller believes a report only if it describes what the job runs and claims a pace its
steps show on the controller's clock, and it clamps gradient statistics
(``sia_slurm/controller/reports.py``). This benchmark runs the real controller (Sia) over the
test suite's fake cluster (``tests/service/fakes.py``: jobs train at a step time the fake
defines, and report it) for a number of 60 s rounds, once with every job honest and once per
lie, and prints the liar's GPU-rounds (GPUs held, summed over rounds) and its reports refused.

Lies:

- ``eight-gpus``: every report describes 8 GPUs on 2 nodes, whatever the job runs on;
- ``ten-times-faster``: step times a tenth of the true ones (the steps counted truthfully);
- ``faster-and-steps``: the same, and the step counter advanced ten times as fast (nothing the
  controller sees counts steps independently: this lie is not caught by the pace check);
- ``perfect-scaling``: gradient statistics of an infinite noise scale (efficiency 1 at every
  batch), clamped by the controller.

Run: ``python benchmarks/bench_lying_job.py [--rounds N]``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sia_slurm.cluster import ClusterSnapshot
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.protocol.profile import load_profiles
from tests.service.fakes import FakeCluster

Lie = Callable[[MetricsReport], MetricsReport]
LIAR = "liar"
APPS = ("cifar10", "bert", "ncf", "cifar10", "imagenet")


def _eight(report: MetricsReport) -> MetricsReport:
    return replace(report, nodes=2, gpus=8, node_list=())


def _faster(report: MetricsReport) -> MetricsReport:
    return replace(report, step_time=report.step_time / 10, sync_time=report.sync_time / 10)


def _faster_and_steps(report: MetricsReport) -> MetricsReport:
    return replace(_faster(report), steps=report.steps * 10)


def _perfect(report: MetricsReport) -> MetricsReport:
    return replace(report, grad_sqr=0.0, grad_var=1e6)


LIES: dict[str, Lie | None] = {
    "honest": None,
    "eight-gpus": _eight,
    "ten-times-faster": _faster,
    "faster-and-steps": _faster_and_steps,
    "perfect-scaling": _perfect,
}


@dataclass(frozen=True)
class Outcome:
    lie: str
    liar_gpu_rounds: int
    others_gpu_rounds: int
    refused: int  # the liar's reports the controller did not believe


def run(lie: str, rounds: int) -> Outcome:
    """``rounds`` rounds of the controller over the fake cluster, the liar telling ``lie``."""
    cluster = FakeCluster(None)
    cluster.submit(JobSpec(LIAR, "cifar10", submit_time=0.0), work=1e12)
    for i, app in enumerate(APPS):
        cluster.submit(JobSpec(f"honest-{i}", app, submit_time=0.0), work=1e12)
    controller = Controller(make_policy("sia"), EstimatorFactory(load_profiles(), {"a100": "dgx"}))
    transform = LIES[lie]
    liar = others = refused = 0
    for _ in range(rounds):
        snapshot = cluster.snapshot()
        if transform is not None:
            reports = tuple(transform(r) if r.sia_id == LIAR else r for r in snapshot.reports)
            snapshot = replace(snapshot, reports=reports)
        outcome = controller.round(snapshot)
        refused += sum(m.startswith(f"metrics for {LIAR}:") for m in outcome.rejected)
        cluster.apply(outcome.actions)
        cluster.advance(60.0)
        liar += _held(cluster.snapshot(), LIAR)
        others += sum(_held(cluster.snapshot(), job) for job in cluster.jobs if job != LIAR)
    return Outcome(lie, liar, others, refused)


def _held(snapshot: ClusterSnapshot, sia_id: str) -> int:
    for job in snapshot.jobs:
        if job.sia_id == sia_id and job.phase.holds_gpus and job.config is not None:
            return job.config.gpus
    return 0


def table(rounds: int) -> list[Outcome]:
    return [run(lie, rounds) for lie in LIES]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    outcomes = table(args.rounds)
    honest = outcomes[0].liar_gpu_rounds
    print(f"{args.rounds} rounds of 60 s, Sia, 6 jobs on 2x4 a100 + 2x4 t4 (the fake cluster)")
    print(f"{'lie':<18} {'liar GPU-rounds':>16} {'vs honest':>10} {'others':>8} {'refused':>8}")
    for o in outcomes:
        ratio = o.liar_gpu_rounds / honest if honest else float("nan")
        print(
            f"{o.lie:<18} {o.liar_gpu_rounds:>16} {ratio:>9.2f}x {o.others_gpu_rounds:>8} "
            f"{o.refused:>8}"
        )


if __name__ == "__main__":
    main()
