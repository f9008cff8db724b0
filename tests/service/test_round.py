"""One service round against the fake cluster: journal, apply, mark, reconcile, dry run."""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest

from sia_slurm.cluster import Action, ActionResult, ClusterSnapshot, Start
from sia_slurm.config import SiaConfig
from sia_slurm.protocol import JobSpec
from sia_slurm.service import open_controller, reconcile, run_round
from sia_slurm.service.journaled_round import MAX_ATTEMPTS
from sia_slurm.state import DONE, FAILED, PENDING, SKIPPED, Journal, Store
from tests.service.fakes import FakeCluster


def submit(cluster: FakeCluster, count: int, app: str = "cifar10") -> list[str]:
    ids = [f"job{i}" for i in range(count)]
    for sia_id in ids:
        cluster.submit(JobSpec(sia_id, app, submit_time=cluster.time))
    return ids


def one_round(config: SiaConfig, backend: object, store: Store, dry_run: bool = False):  # type: ignore[no-untyped-def]
    controller, _ = open_controller(config, store)
    return run_round(config, backend, store, controller, dry_run)  # type: ignore[arg-type]


def test_round_journals_applies_and_marks(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    ids = submit(cluster, 3)
    report = one_round(config, cluster, store)
    assert report.round_index == 0 and not report.error
    assert [type(a) for a in report.actions] == [Start, Start, Start]
    assert all(r.ok for r in report.results)
    entries = Journal(store).entries()
    assert [(e.kind, e.state, e.attempts) for e in entries] == [("start", DONE, 1)] * 3
    assert {e.sia_id for e in entries} == set(ids)
    assert all(cluster.jobs[i].phase == "starting" for i in ids)
    assert set(store.decisions(0)) == set(ids)
    last = store.last_round()
    assert last is not None and last.jobs_by_phase == {"pending": 3}
    assert sum(c["allocated"] for c in last.gpus.values()) == sum(
        a.config.gpus for a in report.actions
    )  # type: ignore[attr-defined]
    assert (config.state_dir / "metrics" / "sia.prom").exists()
    rows = {row.sia_id: row for row in store.jobs()}
    assert rows["job0"].phase_history == [[0.0, "pending"]] and rows["job0"].remembered


class Inspecting:
    """Wraps the fake cluster; inside ``apply`` it reads the journal through a second
    connection, which sees only committed data."""

    def __init__(self, inner: FakeCluster, db: Path) -> None:
        self.inner, self.db, self.seen = inner, db, []  # type: ignore[var-annotated]

    def snapshot(self) -> ClusterSnapshot:
        return self.inner.snapshot()

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        with sqlite3.connect(self.db) as other:
            self.seen = other.execute("SELECT sia_id, kind, state FROM actions").fetchall()
        return self.inner.apply(actions)


def test_actions_are_committed_before_they_are_issued(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    ids = submit(cluster, 2)
    backend = Inspecting(cluster, config.db_path)
    one_round(config, backend, store)
    assert sorted(backend.seen) == [(i, "start", PENDING) for i in ids]
    assert {e.state for e in Journal(store).entries()} == {DONE}


def test_dry_run_changes_nothing(config: SiaConfig, store: Store, cluster: FakeCluster) -> None:
    submit(cluster, 2)
    before = cluster.path.read_text()  # type: ignore[union-attr]
    report = one_round(config, cluster, store, dry_run=True)
    assert report.actions and report.results == ()
    assert cluster.path.read_text() == before  # type: ignore[union-attr]
    cluster._load()
    assert cluster.apply_calls == 0
    assert {e.state for e in Journal(store).entries()} == {SKIPPED}
    assert store.last_round().dry_run  # type: ignore[union-attr]
    prom = (config.state_dir / "metrics" / "sia.prom").read_text()
    assert "sia_dry_run 1" in prom and 'result="dry-run"' in prom


def test_failed_apply_stays_pending_and_is_reapplied_once(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    ids = submit(cluster, 3)
    broken = FakeCluster(cluster.path, raise_after=0)  # every apply raises (Slurm away)
    report = one_round(config, broken, store)
    assert report.error == "the backend answered 0 of 3 actions"
    assert [e.state for e in Journal(store).entries()] == [PENDING] * 3
    assert [e.attempts for e in Journal(store).entries()] == [1] * 3
    cluster._load()
    assert sum(job.launches for job in cluster.jobs.values()) == 0
    report = one_round(config, cluster, store)
    assert report.reconcile.reapplied == 3 and report.reconcile.failed == 0
    assert not Journal(store).pending()
    assert [cluster.jobs[i].launches for i in ids] == [1, 1, 1]
    assert [cluster.jobs[i].restarts for i in ids] == [0, 0, 0]


def test_a_batch_that_raises_is_applied_one_by_one_in_the_same_round(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    """The actuate stage's isolation: a batch that raises part-way is applied again one
    action at a time at once, so the round's other actions are not held back a round."""
    ids = submit(cluster, 3)
    broken = FakeCluster(cluster.path, raise_after=1)  # a batch raises after its first action
    report = one_round(config, broken, store)
    assert report.error == ""
    assert not Journal(store).pending()
    cluster._load()
    assert [cluster.jobs[i].launches for i in ids] == [1, 1, 1]
    assert [cluster.jobs[i].restarts for i in ids] == [0, 0, 0]


def test_applying_one_by_one_stops_when_every_action_raises(
    config: SiaConfig, store: Store, cluster: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """Three actions in a row that raise, none taken: Slurm is away, not one job's action at
    fault; the rest wait for the next round untried instead of each waiting out a timeout."""
    submit(cluster, 6)
    broken = FakeCluster(cluster.path, raise_after=0)
    one_round(config, broken, store)
    tried_alone = [r for r in caplog.records if "quarantined: actuate" in r.getMessage()]
    assert len(tried_alone) == 3  # the batch, then three alone
    entries = Journal(store).entries()
    assert [e.state for e in entries] == [PENDING] * 6
    assert sum(e.message.startswith("not tried") for e in entries) == 3


def test_reconcile_fails_actions_of_vanished_jobs(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    submit(cluster, 2)
    report = one_round(config, FakeCluster(cluster.path, raise_after=0), store)
    assert report.error
    cluster._load()
    del cluster.jobs["job1"]  # removed from the cluster while the controller was down
    cluster._save()
    result = reconcile(store, cluster, dry_run=False)
    assert (result.reapplied, result.failed) == (1, 1)
    states = {e.sia_id: (e.state, e.message) for e in Journal(store).entries()}
    assert states["job0"][0] == DONE
    assert states["job1"][0] == FAILED and "job gone" in states["job1"][1]


def test_dry_run_leaves_earlier_pending_actions_alone(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    submit(cluster, 1)
    one_round(config, FakeCluster(cluster.path, raise_after=0), store)
    report = one_round(config, cluster, store, dry_run=True)
    assert report.reconcile.left_pending == 1
    assert any(e.state == PENDING for e in Journal(store).entries())
    cluster._load()
    assert cluster.jobs["job0"].launches == 0


class Forgetful(FakeCluster):
    """Answers only the first action of each apply (a buggy backend)."""

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        return super().apply(actions)[:1]


def test_unanswered_actions_stay_pending(config: SiaConfig, store: Store, tmp_path: Path) -> None:
    cluster = Forgetful(tmp_path / "cluster.json")
    submit(cluster, 2)
    report = one_round(config, cluster, store)
    assert "answered 1 of 2" in report.error
    assert sorted(e.state for e in Journal(store).entries()) == [DONE, PENDING]


@contextmanager
def json_log(path: Path) -> Iterator[None]:
    """The controller's JSON log into ``path`` for the block, then the ``sia_slurm`` logger as
    it was (later tests read records through pytest's caplog, which needs propagation)."""
    from sia_slurm.service import configure_logging

    sia_log = logging.getLogger("sia_slurm")
    level, propagate = sia_log.level, sia_log.propagate
    handler = configure_logging(path)
    try:
        yield
    finally:
        handler.close()
        sia_log.removeHandler(handler)
        sia_log.setLevel(level)
        sia_log.propagate = propagate


def test_log_lines_one_per_decision_and_action(
    config: SiaConfig, store: Store, cluster: FakeCluster, tmp_path: Path
) -> None:
    log = tmp_path / "controller.log"
    with json_log(log):
        submit(cluster, 2)
        one_round(config, cluster, store)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    decisions = [e for e in events if e.get("event") == "decision"]
    actions = [e for e in events if e.get("event") == "action"]
    assert len(decisions) == 2 and len(actions) == 2
    assert {e["job"] for e in actions} == {"job0", "job1"}
    assert all(e["result"] == "done" and e["round"] == 0 and e["kind"] == "start" for e in actions)
    assert all(e["message"].startswith("[round=0 job=") for e in decisions + actions)
    assert next(e for e in events if e.get("event") == "round")["actions"] == 2


def test_repeated_reports_are_ingested_once(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    """A backend process remembers which reports it handed on only while it lives; under
    --once each round's backend hands the latest report of every job on again."""
    submit(cluster, 1)
    one_round(config, cluster, store)
    cluster.advance(60.0)
    same = cluster.snapshot()
    assert len(same.reports) == 1
    for _ in range(3):
        controller, _ = open_controller(config, store)
        run_round(config, Fixed(same, cluster), store, controller, False)  # type: ignore[arg-type]
    controller, _ = open_controller(config, store)
    assert controller.jobs["job0"].reports == 1
    assert store.conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0] == 1


class Fixed:
    """Always the same snapshot; actions go to ``inner``."""

    def __init__(self, snapshot: ClusterSnapshot, inner: FakeCluster) -> None:
        self.fixed, self.inner = snapshot, inner

    def snapshot(self) -> ClusterSnapshot:
        return self.fixed

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        return self.inner.apply(actions)


def test_a_poison_action_is_given_up_and_never_blocks_the_others(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    """An action whose apply raises every time is retried, counted, and given up after
    MAX_ATTEMPTS (failed, with why); the other job's action, journaled in the same round,
    goes through in the same round (applied alone), and no round raises."""
    submit(cluster, 2)
    broken = FakeCluster(cluster.path, poison=frozenset({"job0"}))
    report = one_round(config, broken, store)  # both journaled; the batch raises
    assert report.error == "the backend answered 1 of 2 actions"  # job1's, applied alone
    entries = {e.sia_id: e for e in Journal(store).entries()}
    assert {s: (e.state, e.attempts) for s, e in entries.items()} == {
        "job0": (PENDING, 1),
        "job1": (DONE, 1),
    }
    assert entries["job0"].message == "apply raised: RuntimeError: injected failure at job0"
    first = entries["job0"].id
    for _ in range(MAX_ATTEMPTS + 1):
        one_round(config, broken, store)  # never raises
    broken._load()
    assert broken.jobs["job1"].launches == 1 and broken.jobs["job0"].launches == 0
    given_up = next(e for e in Journal(store).entries() if e.id == first)
    assert given_up.state == FAILED
    assert given_up.message == (
        f"given up after {MAX_ATTEMPTS} attempts; last: apply raised: RuntimeError: "
        "injected failure at job0"
    )
    # each round decides job0 afresh; none of its entries is retried beyond the bound
    assert all(e.attempts <= MAX_ATTEMPTS for e in Journal(store).entries())


def test_status_lists_given_up_actions(
    config: SiaConfig, store: Store, cluster: FakeCluster, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from sia_slurm.cli.main import cli

    submit(cluster, 1)
    broken = FakeCluster(cluster.path, poison=frozenset({"job0"}))
    for _ in range(MAX_ATTEMPTS + 1):
        one_round(config, broken, store)
    store.conn.commit()
    result = CliRunner().invoke(
        cli, ["status", "--offline", "--json", "--config", str(config.path)]
    )
    assert result.exit_code == 0, result.output
    (entry, *_) = json.loads(result.output)["given_up_actions"]
    assert entry["job"] == "job0" and entry["kind"] == "start"
    assert entry["message"].startswith(f"given up after {MAX_ATTEMPTS} attempts; last: ")


def test_a_failing_reconcile_leaves_its_entries_pending_and_the_round_goes_on(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    """Slurm unreachable while reconciling (its snapshot raises) but back for the round's
    own snapshot: the round decides and applies; the old entries wait for the next round."""
    submit(cluster, 2)
    assert one_round(config, FakeCluster(cluster.path, raise_after=0), store).error
    assert len(Journal(store).pending()) == 2
    calls = {"snapshot": 0}
    real_snapshot = cluster.snapshot

    def flaky_snapshot() -> ClusterSnapshot:
        calls["snapshot"] += 1
        if calls["snapshot"] == 1:
            raise ConnectionError("slurmctld is not responding")
        return real_snapshot()

    cluster.snapshot = flaky_snapshot  # type: ignore[method-assign]
    report = one_round(config, cluster, store)
    assert report.reconcile.left_pending == 2 and not report.error
    assert calls["snapshot"] == 2  # the round observed after the failed reconcile
    report = one_round(config, cluster, store)  # Slurm is back: the old entries settle
    assert report.reconcile.reapplied + report.reconcile.failed == 2
    assert not Journal(store).pending()


def test_a_job_that_ends_is_logged_once_with_why(
    config: SiaConfig, store: Store, cluster: FakeCluster, tmp_path: Path
) -> None:
    log = tmp_path / "controller.log"
    with json_log(log):
        submit(cluster, 2)
        one_round(config, cluster, store)
        cluster.advance(600)
        cluster._load()
        cluster.jobs["job1"].phase = "failed"
        cluster._save()
        for _ in range(3):
            cluster.advance(1e6)
            one_round(config, cluster, store)
    events = [json.loads(line) for line in log.read_text().splitlines()]
    ended = [(e["job"], e["phase"], e["level"]) for e in events if e.get("event") == "finished"]
    assert sorted(ended) == [("job0", "done", "info"), ("job1", "failed", "error")]
