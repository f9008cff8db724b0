"""The shared controller round, on hand-made snapshots with the real goodput model and policies."""

from __future__ import annotations

from collections import Counter

import pytest

from sia_slurm.cluster import (
    BatchChoice,
    ClusterSnapshot,
    JobPhase,
    JobSnapshot,
    Move,
    Rebatch,
    Start,
    Stop,
)
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import NodeShare, NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.protocol.profile import load_profiles

NODES = (
    NodeView("a100-1", "a100", 4, 4),
    NodeView("a100-2", "a100", 4, 4),
    NodeView("t4-1", "t4", 4, 4),
    NodeView("t4-2", "t4", 4, 4),
)


@pytest.fixture(scope="module")
def factory() -> EstimatorFactory:
    return EstimatorFactory(load_profiles(), {"a100": "dgx"})


def pending(sia_id: str, app: str = "cifar10", **spec: object) -> JobSnapshot:
    return JobSnapshot(JobSpec(sia_id, app, **spec), JobPhase.PENDING)  # type: ignore[arg-type]


def running(
    sia_id: str,
    config: Configuration,
    nodes: tuple[NodeShare, ...],
    batch: BatchChoice,
    phase: JobPhase = JobPhase.RUNNING,
    app: str = "cifar10",
    **spec: object,
) -> JobSnapshot:
    return JobSnapshot(
        JobSpec(sia_id, app, **spec),  # type: ignore[arg-type]
        phase,
        config=config,
        placement=nodes,
        batch=batch,
    )


@pytest.mark.parametrize("policy", ["sia", "pollux", "gavel", "fifo"])
def test_pending_jobs_start_within_capacity(factory: EstimatorFactory, policy: str) -> None:
    controller = Controller(make_policy(policy), factory)
    jobs = tuple(pending(f"j{i}", app) for i, app in enumerate(["cifar10", "bert", "ncf"] * 3))
    outcome = controller.round(ClusterSnapshot(0.0, NODES, jobs))
    starts = [a for a in outcome.actions if isinstance(a, Start)]
    assert starts, "an empty cluster must start something"
    used: Counter[str] = Counter()
    for start in starts:
        assert sum(s.gpus for s in start.placement) == start.config.gpus
        b = start.batch
        assert b.batch_size == start.config.gpus * b.local_bsz * (b.accum_steps + 1)
        for share in start.placement:
            used[share.node] += share.gpus
    capacity = {node.name: node.usable_gpus for node in NODES}
    assert all(used[node] <= capacity[node] for node in used)
    assert {d.sia_id for d in outcome.decisions} == {job.sia_id for job in jobs}
    assert controller.round_index == 1


def test_steady_job_is_kept_and_reports_are_learned(factory: EstimatorFactory) -> None:
    controller = Controller(make_policy("sia"), factory)
    first = controller.round(ClusterSnapshot(0.0, NODES, (pending("j1"),)))
    (start,) = first.actions
    assert isinstance(start, Start)
    job = running("j1", start.config, start.placement, start.batch)
    report = MetricsReport(
        "j1", 60.0, start.config.gpu_type, start.config.nodes, start.config.gpus,
        start.batch.local_bsz, start.batch.accum_steps, 0.1, 0.0, 1.0, 1.0,
    )  # fmt: skip
    stray = MetricsReport("ghost", 60.0, "t4", 1, 1, 32, 0, 0.1, 0.0, 1.0, 1.0)
    outcome = controller.round(ClusterSnapshot(60.0, NODES, (job,), reports=(report, stray)))
    assert controller.jobs["j1"].reports == 1
    assert any("ghost" in message for message in outcome.rejected)
    assert not [a for a in outcome.actions if isinstance(a, Stop | Start)]
    assert controller.jobs["j1"].max_gpus_seen == start.config.gpus


def test_restoring_job_keeps_its_configuration(factory: EstimatorFactory) -> None:
    controller = Controller(make_policy("sia"), factory)
    config = Configuration("t4", 1, 1)
    job = running(
        "j1", config, (NodeShare("t4-1", 1),), BatchChoice(128, 128, 0), JobPhase.STARTING
    )
    outcome = controller.round(ClusterSnapshot(0.0, NODES, (job,)))
    assert outcome.actions == ()
    (decision,) = outcome.decisions
    assert decision.action == "keep" and decision.after == str(config)


def test_preempted_job_stops_before_others_start(factory: EstimatorFactory) -> None:
    """FIFO keeps the running rigid job; with Sia a 1-node cluster is shared: stops come first."""
    one_node = (NodeView("t4-1", "t4", 4, 4),)
    controller = Controller(make_policy("sia"), factory)
    hog = running(
        "hog", Configuration("t4", 1, 4), (NodeShare("t4-1", 4),), BatchChoice(512, 128, 0),
        max_gpus=4,
    )  # fmt: skip
    jobs = (hog, *(pending(f"j{i}") for i in range(4)))
    outcome = controller.round(ClusterSnapshot(1e6, one_node, jobs))
    kinds = [type(action) for action in outcome.actions]
    assert Start in kinds
    assert Stop in kinds or Move in kinds, "the hog must give GPUs up for the waiting jobs"
    first_start = kinds.index(Start)
    assert all(kind is Start for kind in kinds[first_start:])


def test_batch_only_change_is_a_rebatch(factory: EstimatorFactory) -> None:
    controller = Controller(make_policy("sia"), factory)
    first = controller.round(ClusterSnapshot(0.0, NODES, (pending("j1"),)))
    (start,) = first.actions
    assert isinstance(start, Start)
    odd = BatchChoice(start.batch.batch_size + start.config.gpus, start.batch.local_bsz + 1, 0)
    job = running("j1", start.config, start.placement, odd)
    outcome = controller.round(ClusterSnapshot(60.0, NODES, (job,)))
    assert [type(a) for a in outcome.actions] == [Rebatch]
    rigid = running("r1", start.config, start.placement, odd, kind=JobKind.RIGID)
    outcome = Controller(make_policy("sia"), factory).round(ClusterSnapshot(0.0, NODES, (rigid,)))
    assert not [a for a in outcome.actions if isinstance(a, Rebatch)]


def test_unknown_app_is_reported_and_others_still_run(factory: EstimatorFactory) -> None:
    controller = Controller(make_policy("sia"), factory)
    outcome = controller.round(
        ClusterSnapshot(0.0, NODES, (pending("bad", "resnet9000"), pending("ok")))
    )
    assert any("bad" in m and "resnet9000" in m for m in outcome.rejected)
    assert [a.sia_id for a in outcome.actions] == ["ok"]


def test_finished_and_vanished_jobs_are_forgotten(factory: EstimatorFactory) -> None:
    controller = Controller(make_policy("sia"), factory)
    controller.round(ClusterSnapshot(0.0, NODES, (pending("a"), pending("b"))))
    assert set(controller.jobs) == {"a", "b"}
    done = JobSnapshot(JobSpec("a", "cifar10"), JobPhase.DONE, finish_time=50.0)
    controller.round(ClusterSnapshot(60.0, NODES, (done,)))
    assert controller.jobs == {}
