"""One job's failure is that job's alone: a failure injected at each stage of a round (read,
fit, estimate, allocate, place, actuate) for one job quarantines that job, and every other
job's decision is the one the round makes without it. The real goodput model and Sia."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import pytest

from sia_slurm.cluster import BatchChoice, ClusterSnapshot, JobPhase, JobSnapshot, Start
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller import decide as decide_module
from sia_slurm.controller.decide import Decision, RoundOutcome
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.core import Configuration
from sia_slurm.model import JobGoodputEstimator
from sia_slurm.policy.base import Allocation, NodeShare, NodeView, Policy, PolicyInput
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec
from sia_slurm.protocol.profile import load_profiles

NODES = (
    NodeView("a100-1", "a100", 4, 4),
    NodeView("a100-2", "a100", 4, 4),
    NodeView("t4-1", "t4", 4, 4),
    NodeView("t4-2", "t4", 4, 4),
)
APPS = ("cifar10", "bert", "ncf", "imagenet", "cifar10", "deepspeech2")
BAD = "bad"


@pytest.fixture(scope="module")
def factory() -> EstimatorFactory:
    return EstimatorFactory(load_profiles(), {"a100": "dgx"})


def others() -> tuple[JobSnapshot, ...]:
    return tuple(
        JobSnapshot(JobSpec(f"j{i}", app, submit_time=float(i)), JobPhase.PENDING)
        for i, app in enumerate(APPS)
    )


def bad_job(app: str = "bert") -> JobSnapshot:
    return JobSnapshot(JobSpec(BAD, app, submit_time=2.5), JobPhase.PENDING)


def by_job(outcome: RoundOutcome) -> dict[str, Decision]:
    return {d.sia_id: d for d in outcome.decisions}


def reference(factory: EstimatorFactory) -> dict[str, Decision]:
    """The others' decisions in a round without the bad job at all."""
    outcome = Controller(make_policy("sia"), factory).round(ClusterSnapshot(0.0, NODES, others()))
    return by_job(outcome)


def assert_isolated(outcome: RoundOutcome, expected: dict[str, Decision], stage: str) -> None:
    decisions = by_job(outcome)
    said = decisions.pop(BAD)
    assert said.action == QUARANTINED
    assert said.note.startswith(f"{stage}: "), said.note
    assert outcome.quarantined == {BAD: said.note}
    assert decisions == expected
    assert all(action.sia_id != BAD for action in outcome.actions)


class _Raising:
    """An estimator builder that builds the bad job's estimator with ``breaks`` applied."""

    def __init__(
        self, factory: EstimatorFactory, breaks: Callable[[JobGoodputEstimator], Any]
    ) -> None:
        self.factory = factory
        self.breaks = breaks

    def __call__(self, spec: JobSpec) -> JobGoodputEstimator:
        estimator = self.factory(spec)
        if spec.sia_id == BAD:
            self.breaks(estimator)
        return estimator


def _fit_fails(estimator: JobGoodputEstimator) -> None:
    raise OverflowError("math range error")  # not a ValueError: once stopped every round


def test_read_the_backend_could_not_read_the_job(factory: EstimatorFactory) -> None:
    controller = Controller(make_policy("sia"), factory)
    snapshot = ClusterSnapshot(0.0, NODES, others(), quarantined={BAD: "spec.json: bad"})
    outcome = controller.round(snapshot)
    assert_isolated(outcome, reference(factory), "read")
    assert by_job(outcome)[BAD].phase == "-"


def test_fit_the_model_cannot_be_built(factory: EstimatorFactory) -> None:
    controller = Controller(make_policy("sia"), _Raising(factory, _fit_fails))
    outcome = controller.round(ClusterSnapshot(0.0, NODES, (*others(), bad_job())))
    assert_isolated(outcome, reference(factory), "fit")
    assert "OverflowError: math range error" in outcome.quarantined[BAD]


def test_estimate_the_model_raises_inside_the_policy(factory: EstimatorFactory) -> None:
    def corrupt(estimator: JobGoodputEstimator) -> None:
        estimator._grad_stats = "not statistics"  # type: ignore[assignment]

    controller = Controller(make_policy("sia"), _Raising(factory, corrupt))
    outcome = controller.round(ClusterSnapshot(0.0, NODES, (*others(), bad_job())))
    assert_isolated(outcome, reference(factory), "estimate")


class _PolicyFailingOn:
    """Sia, raising whenever the bad job is among the jobs it is asked to allocate."""

    def __init__(self) -> None:
        self.inner: Policy = make_policy("sia")
        self.calls = 0

    def solve(self, policy_input: PolicyInput) -> Allocation:
        self.calls += 1
        if any(job.job_id == BAD for job in policy_input.jobs):
            raise ZeroDivisionError("float division by zero")
        return self.inner.solve(policy_input)


def test_allocate_the_policy_raises_with_the_job(factory: EstimatorFactory) -> None:
    policy = _PolicyFailingOn()
    controller = Controller(policy, factory)  # type: ignore[arg-type]
    outcome = controller.round(ClusterSnapshot(0.0, NODES, (*others(), bad_job())))
    assert_isolated(outcome, reference(factory), "allocate")
    assert policy.calls <= 2 + 2 + 3 + 1  # twice the ends, log2(7) bisecting, the last solve


def test_place_the_placement_raises_with_the_job(
    factory: EstimatorFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_place = decide_module.place

    def place(cluster: Any, allocation: Allocation, views: Any) -> Any:
        if allocation.get(BAD) is not None:
            raise IndexError("list index out of range")
        return real_place(cluster, allocation, views)

    monkeypatch.setattr(decide_module, "place", place)
    controller = Controller(make_policy("sia"), factory)
    outcome = controller.round(ClusterSnapshot(0.0, NODES, (*others(), bad_job("cifar10"))))
    assert_isolated(outcome, reference(factory), "place")


def test_a_quarantined_job_keeps_its_gpus_and_nobody_gets_them(
    factory: EstimatorFactory,
) -> None:
    """A running job that cannot be modelled is neither stopped nor overrun: its four GPUs
    count as taken, as if they were down."""
    shares = (NodeShare("a100-1", 4),)
    running = JobSnapshot(
        JobSpec(BAD, "bert"), JobPhase.RUNNING, config=Configuration("a100", 1, 4),
        placement=shares, batch=BatchChoice(128, 32, 0),
    )  # fmt: skip
    controller = Controller(make_policy("sia"), _Raising(factory, _fit_fails))
    outcome = controller.round(ClusterSnapshot(0.0, NODES, (*others(), running)))
    decisions = by_job(outcome)
    assert decisions[BAD].action == QUARANTINED and decisions[BAD].before == "a100:1x4"
    assert all(action.sia_id != BAD for action in outcome.actions)  # not stopped
    on_it = [
        share
        for action in outcome.actions
        if isinstance(action, Start)
        for share in action.placement
        if share.node == "a100-1"
    ]
    assert on_it == []
    without = tuple(replace(n, usable_gpus=0) if n.name == "a100-1" else n for n in NODES)
    expected = by_job(Controller(make_policy("sia"), factory).round(
        ClusterSnapshot(0.0, without, others())
    ))  # fmt: skip
    assert {k: v for k, v in decisions.items() if k != BAD} == expected


def test_a_failure_of_every_job_is_the_rounds(factory: EstimatorFactory) -> None:
    """A policy that fails whatever it is given is a bug, not a user's value: the round
    raises (the loop logs it) rather than quarantining every job."""

    class Broken:
        def solve(self, policy_input: PolicyInput) -> Allocation:
            raise RuntimeError("policy bug")

    controller = Controller(Broken(), factory)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="policy bug"):
        controller.round(ClusterSnapshot(0.0, NODES, others()))


def test_the_quarantine_is_logged_once_per_change(
    factory: EstimatorFactory, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the service's logging setup (other tests) may have stopped sia_slurm's propagation
    monkeypatch.setattr(logging.getLogger("sia_slurm"), "propagate", True)
    controller = Controller(make_policy("sia"), _Raising(factory, _fit_fails))
    snapshot = ClusterSnapshot(0.0, NODES, (*others(), bad_job()))

    def said() -> Iterator[str]:
        for record in caplog.records:
            if BAD in record.getMessage() and "quarantine" in record.getMessage():
                yield record.getMessage()

    with caplog.at_level(logging.INFO, logger="sia_slurm.controller"):
        for t in (0.0, 60.0, 120.0):
            controller.round(replace(snapshot, time=t))
        assert len(list(said())) == 1
        controller.round(ClusterSnapshot(180.0, NODES, others()))
    assert list(said())[-1] == f"job {BAD}: out of quarantine"
