"""Which reports the controller believes (sia_slurm/controller/reports.py): one that does not
describe what the job runs, or claims a pace its steps do not show, is refused, and a lie holds
the job at its minimum; statistics are clamped. The lying-job benchmark at a small size."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sia_slurm.cluster import BatchChoice, ClusterSnapshot, JobPhase, JobSnapshot
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller.reports import (
    MAX_NOISE_SCALE_BATCHES,
    PACE_EARLY_S,
    PACE_WINDOW_S,
    clamped_stats,
)
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare, NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.protocol.profile import load_profiles

NODES = (NodeView("a100-1", "a100", 4, 4), NodeView("t4-1", "t4", 4, 4))
CONFIG = Configuration("a100", 1, 2)
BATCH = BatchChoice(128, 64, 0)


@pytest.fixture(scope="module")
def factory() -> EstimatorFactory:
    return EstimatorFactory(load_profiles(), {"a100": "dgx"})


def running() -> JobSnapshot:
    return JobSnapshot(
        JobSpec("j", "cifar10", min_gpus=1, max_gpus=8), JobPhase.RUNNING, config=CONFIG,
        placement=(NodeShare("a100-1", 2),), batch=BATCH,
    )  # fmt: skip


def report(time: float, steps: int, **changes: object) -> MetricsReport:
    honest = MetricsReport(
        "j", time, "a100", 1, 2, BATCH.local_bsz, BATCH.accum_steps, 0.1, 0.01, 1.0, 2.0,
        steps=steps,
    )  # fmt: skip
    return replace(honest, **changes)  # type: ignore[arg-type]


def rounds(
    factory: EstimatorFactory, reports: list[MetricsReport], times: list[float]
) -> tuple[Controller, list[list[str]]]:
    controller = Controller(make_policy("sia"), factory)
    said = []
    for t, r in zip(times, reports, strict=True):
        outcome = controller.round(ClusterSnapshot(t, NODES, (running(),), (r,)))
        said.append([m for m in outcome.rejected if m.startswith("metrics for j:")])
    return controller, said


def test_an_honest_pace_is_believed(factory: EstimatorFactory) -> None:
    times = [0.0, 60.0, 120.0, 180.0, 240.0]
    reports = [report(t + 1, int(t / 0.1 * 0.8)) for t in times]  # 80% of the claimed pace
    controller, said = rounds(factory, reports, times)
    assert said == [[]] * 5
    assert controller.jobs["j"].reports == 5 and controller.jobs["j"].distrusted == ""


def test_a_pace_the_steps_do_not_show_is_refused_and_holds_the_job_at_its_minimum(
    factory: EstimatorFactory,
) -> None:
    times = [0.0, 60.0, 120.0, 180.0]
    reports = [report(t + 1, int(t / 0.1 / 10)) for t in times]  # a tenth of the claim
    controller, said = rounds(factory, reports, times)
    assert said[0] == []  # the first report on this shape: nothing to judge it by
    assert PACE_EARLY_S <= 60.0 < PACE_WINDOW_S  # judged at the second report, at 2x
    assert "claims 10 steps/s (step_time 0.1 s), but its steps advanced 1/s" in said[1][0]
    assert "(tolerance 8x)" in said[1][0] and "(tolerance 4x)" in said[2][0]
    record = controller.jobs["j"]
    assert record.distrusted and record.reports == 1
    view = record.view(now=240.0, restarts=0, current=CONFIG, placement=(), restoring=False)
    assert view.max_gpus == 1
    outcome = controller.round(ClusterSnapshot(240.0, NODES, (running(),), ()))
    (decision,) = outcome.decisions
    assert decision.after.endswith("x1"), decision  # shrunk to its minimum, not kept at 2


def test_a_smaller_lie_passes_the_early_judgement_and_not_the_full_window(
    factory: EstimatorFactory,
) -> None:
    """Five times the pace its steps show: within twice the tolerance after one round, caught
    once the full window has passed."""
    times = [0.0, 60.0, 120.0]
    reports = [report(t + 1, int(t / 0.1 / 5)) for t in times]
    _, said = rounds(factory, reports, times)
    assert said[:2] == [[], []]
    assert "(tolerance 4x)" in said[2][0]


def test_an_honest_round_that_shows_half_its_steps_is_believed(
    factory: EstimatorFactory,
) -> None:
    """Reports written every 30 s, read every 60 s: the first one read fresh, the second 30 s
    stale, so the second round sees 30 s of steps in 60 s, from a job whose steps also run 2.2x
    slower than its step time says (data loading outside the timed step)."""
    rate = 1 / 0.1 / 2.2  # at 4x after one round this would be a lie: 4.4x
    times = [0.0, 60.0, 120.0, 180.0]
    written = [0.0, 30.0, 120.0, 150.0]
    reports = [report(w + 0.5, int(w * rate)) for w in written]
    controller, said = rounds(factory, reports, times)
    assert said == [[]] * 4
    assert controller.jobs["j"].distrusted == ""


def test_a_report_of_another_configuration_is_a_lie(factory: EstimatorFactory) -> None:
    controller, said = rounds(factory, [report(1.0, 0, nodes=2, gpus=8)], [0.0])
    assert said == [["metrics for j: describes a100:2x8, but the job runs on a100:1x2; ignored"]]
    assert controller.jobs["j"].distrusted
    controller.round(ClusterSnapshot(60.0, NODES, (running(),), (report(61.0, 500),)))
    assert controller.jobs["j"].distrusted == ""  # believed again


def test_a_report_of_the_batch_before_a_rebatch_is_refused_but_no_lie(
    factory: EstimatorFactory,
) -> None:
    controller, said = rounds(factory, [report(1.0, 0, local_bsz=32)], [0.0])
    assert "describes a per-GPU batch of 32 x1, but the job was assigned 64 x1" in said[0][0]
    assert controller.jobs["j"].distrusted == ""


def test_gradient_statistics_are_clamped_to_a_finite_noise_scale() -> None:
    stats = clamped_stats(report(1.0, 0, grad_sqr=0.0, grad_var=5.0), 128, 4096)
    assert stats.grad_sqr > 0
    noise_scale = 128 * stats.grad_var / stats.grad_sqr
    assert noise_scale == pytest.approx(MAX_NOISE_SCALE_BATCHES * 4096)
    honest = clamped_stats(report(1.0, 0, grad_sqr=1.0, grad_var=50.0), 128, 4096)
    assert (honest.grad_sqr, honest.grad_var) == (1.0, 50.0)


@pytest.mark.heavy
def test_lying_about_the_configuration_or_the_pace_earns_no_gpus() -> None:
    from benchmarks.bench_lying_job import run

    honest = run("honest", 12).liar_gpu_rounds
    for lie in ("eight-gpus", "ten-times-faster"):
        outcome = run(lie, 12)
        assert outcome.refused > 0
        assert outcome.liar_gpu_rounds <= honest, (lie, outcome, honest)
