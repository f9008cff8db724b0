"""The dashboard's predicted and measured goodput mean the same thing (issue 34).

On the demo they were 2-21x apart for short jobs, and the measured side was right: the
predicted one was the goodput of the job's *last decision*, which (a) may be a rebatch or a
move the job never ran because it finished first, and (b) carries the gradient statistics of
its round, while the measured one applies the statistics of the job's newest report; a demo
job goes through its app's whole training in minutes, so they move (ncf: efficiency 0.37 at
32,768 when the controller decided, 0.999 in its last report). Now both are of the reported
shape, on the report's statistics: they differ by the throughput model's error only.

The database is written as the service writes it (``record_jobs`` then ``record_round`` per
round), from the real controller, Sia policy and goodput models; the jobs' last reports are
their ``metrics.json`` files, read through the user-file door as the dashboard reads them.
"""

from __future__ import annotations

import os
import sqlite3
from dataclasses import dataclass, replace

import pytest

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot, Rebatch, Start
from sia_slurm.controller import Controller, Decision, EstimatorFactory
from sia_slurm.model.efficiency import GradientStats, efficiency
from sia_slurm.policy.base import NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec, MetricsReport, StatePaths, write_document
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.report import JobRow, report_from_db
from sia_slurm.report.goodput import DecisionPoint, goodput_pair, measured_goodput
from sia_slurm.service.summary import record_round
from sia_slurm.slurm.observe.jobfiles import SlurmRecord
from sia_slurm.state import Store

T0 = 1_700_000_000.0
NODES = (NodeView("a100-1", "a100", 4, 4), NodeView("a100-2", "a100", 4, 4))
M0 = {"stats": 256, "rebatched": 128}
# ncf's statistics when the controller rebatched it in the demo (noise scale M0*var/sqr of
# 18,570: efficiency 0.37 at 32,768), then those of its last report (63.7 million: 0.999).
EARLY = GradientStats(grad_sqr=1.0, grad_var=18_570 / 256)
LATE = GradientStats(grad_sqr=1053.15, grad_var=262_015_801.0)
NOISY = GradientStats(grad_sqr=1.0, grad_var=40.0)  # cifar10: worth a larger batch
SLOWER = {"stats": 1.05, "rebatched": 1.02}  # what each job really takes over the prediction


def report(
    sia_id: str, time: float, decision: Decision, stats: GradientStats, steps: int
) -> MetricsReport:
    """A report of the shape ``decision`` assigned, the job's :data:`SLOWER` times the time
    that decision predicted."""
    micro_batches = decision.accum_steps + 1
    iteration = decision.batch_size / decision.throughput * SLOWER[sia_id]
    return MetricsReport(
        sia_id, time, "a100", 1, 1, decision.local_bsz, decision.accum_steps,
        iteration / micro_batches, 0.0, stats.grad_sqr, stats.grad_var, steps=steps,
    )  # fmt: skip


def applied(jobs: dict[str, JobSnapshot], actions: tuple[object, ...]) -> None:
    """What the cluster does with the round's starts and rebatches."""
    for action in actions:
        job = jobs[action.sia_id]  # type: ignore[attr-defined]
        if isinstance(action, Start):
            jobs[job.sia_id] = replace(
                job,
                phase=JobPhase.RUNNING,
                config=action.config,
                placement=action.placement,
                batch=action.batch,
            )
        elif isinstance(action, Rebatch):
            jobs[job.sia_id] = replace(job, batch=action.batch)


@dataclass(frozen=True)
class Run:
    """The state a run left, and per job the decision its last report's shape came from
    (``shape``) and the last one that gave it GPUs (``last``, what the table's batch shows)."""

    state: StatePaths
    shape: dict[str, Decision]
    last: dict[str, Decision]

    def rows(self) -> dict[str, JobRow]:
        """The dashboard's job rows, the last reports read from the jobs' directories."""
        data = report_from_db(self.state.state_dir / "sia.db", state_dir=self.state.state_dir)
        return {row.id: row for row in data.jobs}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Two one-GPU jobs over three rounds, a minute apart, each ending as a demo job did.

    ``stats`` (ncf) starts at M0; its first report (statistics :data:`EARLY`) gets it a
    rebatch, which it runs; its last report, at that batch, has the statistics :data:`LATE`.
    ``rebatched`` (cifar10) starts at M0; its first report gets it a rebatch it never runs:
    it finishes first, its last report still at M0. Both finish before round 2.
    """
    state = StatePaths(tmp_path_factory.mktemp("agreement") / "state")
    controller = Controller(make_policy("sia"), EstimatorFactory(load_profiles(), {"a100": "dgx"}))
    jobs = {
        sia_id: JobSnapshot(
            JobSpec(sia_id, app, init_batch_size=M0[sia_id], max_gpus=1, submit_time=T0),
            JobPhase.PENDING,
        )
        for sia_id, app in (("stats", "ncf"), ("rebatched", "cifar10"))
    }
    shapes: dict[str, Decision] = {}
    last: dict[str, tuple[MetricsReport, Decision]] = {}
    with Store.open(state.state_dir / "sia.db") as store:
        for index in range(3):
            now = T0 + 60.0 * index
            reports: list[MetricsReport] = []
            if index == 1:  # each reports its start's shape
                reports = [
                    report("stats", now - 1, shapes["stats"], EARLY, 100),
                    report("rebatched", now - 1, shapes["rebatched"], NOISY, 100),
                ]
            if index == 2:  # finished; what they last wrote is in their metrics files
                for sia_id, job in jobs.items():
                    jobs[sia_id] = replace(job, phase=JobPhase.DONE, finish_time=now - 5)
            snapshot = ClusterSnapshot(now, NODES, tuple(jobs.values()), tuple(reports))
            outcome = controller.round(snapshot)
            with store.transaction():
                store.record_jobs(snapshot)
                record_round(store, outcome, snapshot, dry_run=False, wall_time=0.0, timings={})
            decided = {d.sia_id: d for d in outcome.decisions}
            if index == 0:
                shapes = dict(decided)
                assert {d.action for d in shapes.values()} == {"start"}
            if index == 1:
                assert {d.action for d in decided.values()} == {"rebatch"}
                shapes["stats"] = decided["stats"]  # it runs this one
                last["stats"] = (
                    report("stats", now + 50, decided["stats"], LATE, 900),
                    decided["stats"],
                )
                last["rebatched"] = (
                    report("rebatched", now + 50, shapes["rebatched"], NOISY, 900),
                    decided["rebatched"],
                )
            applied(jobs, outcome.actions)
    for sia_id, (final, _) in last.items():
        state.job_dir(sia_id).mkdir(parents=True)
        write_document(state.metrics(sia_id), final)
        SlurmRecord(str(len(sia_id)), os.geteuid(), T0).write(state.slurm_record(sia_id))
    return Run(state, shapes, {sia_id: decision for sia_id, (_, decision) in last.items()})


def test_predicted_and_measured_are_of_the_reported_shape_on_its_statistics(run: Run) -> None:
    rows = run.rows()
    for sia_id, final_stats in (("stats", LATE), ("rebatched", NOISY)):
        row, shape = rows[sia_id], run.shape[sia_id]
        assert row.goodput_predicted is not None and row.goodput_measured is not None
        # The one factor both apply: the last report's statistics at its batch.
        factor = float(efficiency(final_stats, M0[sia_id], shape.batch_size))
        assert row.goodput_predicted == pytest.approx(shape.throughput * factor, rel=1e-9)
        # ... so they differ by what the job really took over the prediction, and no more.
        ratio = row.goodput_predicted / row.goodput_measured
        assert ratio == pytest.approx(SLOWER[sia_id], rel=1e-6), sia_id


def test_the_old_pair_was_the_last_decision_against_the_report(run: Run) -> None:
    """What the dashboard showed before, on this database: 2-3x apart for ``stats`` (the
    statistics moved), another batch's goodput for ``rebatched``. The measured side is the
    same then and now."""
    rows = run.rows()
    old = run.last["stats"].goodput  # the rebatch it ran, at its round's statistics
    assert 2.0 < rows["stats"].goodput_measured / old < 3.0  # type: ignore[operator]
    assert run.last["rebatched"].batch_size != run.shape["rebatched"].batch_size
    assert rows["rebatched"].batch_size == run.last["rebatched"].batch_size  # the table's
    assert rows["rebatched"].goodput_predicted != pytest.approx(run.last["rebatched"].goodput)


def test_decisions_keep_their_throughput(run: Run) -> None:
    """The store keeps each decision's predicted throughput apart from its goodput (schema 2):
    goodput is it times the efficiency at the round's statistics, never more."""
    with sqlite3.connect(run.state.state_dir / "sia.db") as conn:
        kept = conn.execute(
            "SELECT sia_id, round_index, goodput, throughput FROM decisions WHERE after != '-'"
        ).fetchall()
    assert kept and all(0 < goodput <= throughput for _, _, goodput, throughput in kept)
    start = run.shape["rebatched"]  # at M0 the efficiency is 1 whatever the statistics
    assert start.goodput == pytest.approx(start.throughput)


def point(
    after: str,
    local_bsz: int,
    goodput: float,
    throughput: float,
    *,
    accum_steps: int = 0,
    quarantined: bool = False,
    profiling: bool = False,
) -> DecisionPoint:
    return DecisionPoint(
        0, 0.0, after, local_bsz * (accum_steps + 1), goodput, quarantined, profiling,
        local_bsz, accum_steps, throughput,
    )  # fmt: skip


def test_which_decision_predicted_the_reported_shape() -> None:
    report = MetricsReport("j", 0.0, "a100", 1, 2, 32, 1, 0.5, 0.1, 1.0, 3.0)
    measured = measured_goodput(report, 64)
    # M0 = 64, batch 128: efficiency 0.8 (test_from_db), applied to the prediction too.
    newest = point("a100:1x2", 32, 100.0, 200.0, accum_steps=1)
    decisions = [
        point("a100:1x2", 32, 50.0, 150.0, accum_steps=1),  # older, same shape
        newest,
        point("a100:1x2", 32, 1.0, 2.0, accum_steps=0),  # another accumulation
        point("a100:1x4", 32, 1.0, 2.0, accum_steps=1),  # another GPU count
        point("a100:1x2", 32, 1.0, 2.0, accum_steps=1, profiling=True),  # placeholders
        point("a100:1x2", 32, 1.0, 2.0, accum_steps=1, quarantined=True),
        point("-", 0, 0.0, 0.0),  # stopped
    ]
    assert goodput_pair(report, decisions, 64) == (pytest.approx(200.0 * 0.8), measured)
    # A database from before decisions kept their throughput: the decision's own goodput.
    old = [*decisions[:1], replace(newest, throughput=0.0), *decisions[2:]]
    assert goodput_pair(report, old, 64) == (100.0, measured)
    # No decision gave that shape: nothing predicted it.
    assert goodput_pair(report, decisions[2:], 64) == (None, measured)
