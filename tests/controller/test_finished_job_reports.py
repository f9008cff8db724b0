"""A finished job's last metrics report is not an error.

A job writes a final report when it ends; the round that sees the job DONE also sees that
report. It used to be rejected ("no such live managed job") in every round until Slurm forgot
the job, counted in ``sia_rejected_inputs`` and logged as a warning each time.
"""

from __future__ import annotations

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.policy.base import NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.protocol.profile import load_profiles

NODES = (NodeView("t4-1", "t4", 4, 4),)


def report(sia_id: str, time: float) -> MetricsReport:
    return MetricsReport(sia_id, time, "t4", 1, 1, 32, 0, 0.2, 0.0, 1.0, 2.0)


def test_reports_of_finished_jobs_are_dropped_quietly() -> None:
    controller = Controller(make_policy("sia"), EstimatorFactory(load_profiles()))
    done = JobSnapshot(JobSpec("done-1", "cifar10"), JobPhase.DONE)
    for _ in range(2):
        outcome = controller.round(
            ClusterSnapshot(10.0, NODES, (done,), reports=(report("done-1", 9.0),))
        )
        assert outcome.rejected == () and outcome.actions == ()
    # A report of a job the cluster does not know is still an error.
    outcome = controller.round(ClusterSnapshot(20.0, NODES, (), reports=(report("ghost", 19.0),)))
    assert outcome.rejected == ("metrics for ghost: no such live managed job; ignored",)
