"""Reconcile's snapshot must not swallow the metrics reports of the round that follows it.

The Slurm backend hands each metrics report on once (``MetricsInbox``); reconcile takes a
snapshot to see which jobs are live, so the round's own snapshot no longer carries the reports
that snapshot took. The round adds them back.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from sia_slurm.cluster import Action, ActionResult, ClusterSnapshot, Rebatch
from sia_slurm.config import SiaConfig
from sia_slurm.protocol import JobSpec
from sia_slurm.service import open_controller, run_round
from sia_slurm.state import PENDING, Journal, Store
from tests.service.fakes import FakeCluster


class HandsReportsOnce:
    """The fake cluster, handing each report on once, as the Slurm backend's inbox does."""

    def __init__(self, inner: FakeCluster) -> None:
        self.inner = inner
        self.taken: set[tuple[str, float]] = set()
        self.snapshots = 0

    def snapshot(self) -> ClusterSnapshot:
        self.snapshots += 1
        snapshot = self.inner.snapshot()
        fresh = tuple(r for r in snapshot.reports if (r.sia_id, r.time) not in self.taken)
        self.taken.update((r.sia_id, r.time) for r in fresh)
        return dataclasses.replace(snapshot, reports=fresh)

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        return self.inner.apply(actions)


def test_reports_seen_by_reconcile_reach_the_controller(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    cluster.submit(JobSpec("job0", "cifar10", submit_time=cluster.time))
    controller, _ = open_controller(config, store)
    started = run_round(config, cluster, store, controller, dry_run=False)
    assert [type(a).__name__ for a in started.actions] == ["Start"]
    cluster.advance(60.0)  # restored and running: it reports from now on
    with store.transaction():  # an action a crashed process journaled but never confirmed
        Journal(store).add([Rebatch("job0", 0, started.actions[0].batch)], cluster.time)  # type: ignore[attr-defined]
    backend = HandsReportsOnce(cluster)
    before = controller.jobs["job0"].reports

    report = run_round(config, backend, store, controller, dry_run=False)

    assert backend.snapshots == 2  # reconcile's, then the round's
    assert report.reconcile.reapplied == 1 and len(report.reconcile.reports) == 1
    assert controller.jobs["job0"].reports == before + 1
    assert not [e for e in Journal(store).entries() if e.state == PENDING]
