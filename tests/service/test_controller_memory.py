"""The controller's memory between processes (sia_slurm/service/controller_memory.py): the previous
allocation as a JSON document (format 3) or converted from a pickle (format 2), stored reports,
fallbacks."""

from __future__ import annotations

import json
import os
import pickle
from types import MappingProxyType

import numpy as np
import pytest

from sia_slurm import __version__
from sia_slurm.cluster import BatchChoice, ClusterSnapshot, JobPhase, JobSnapshot
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.core import Configuration
from sia_slurm.policy.allocation_json import allocation_to_json
from sia_slurm.policy.base import Allocation, JobAllocation, NodeShare, NodeView, SolveInfo
from sia_slurm.policy.gavel import GavelState
from sia_slurm.policy.pollux import PolluxState
from sia_slurm.policy.registry import make_policy
from sia_slurm.policy.shares import SharesConfig
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.service.controller_memory import decode_allocation, load_memory, save_memory
from sia_slurm.service.summary import record_round
from sia_slurm.state import MEMORY_FORMAT, Store
from sia_slurm.state.memory import SavedAllocation, controller_row, dump_pickle

NODES = (NodeView("a100-1", "a100", 4, 4), NodeView("t4-1", "t4", 4, 4))


def allocation(state: object) -> Allocation:
    share = JobAllocation(Configuration("a100", 1, 2), 256, 128, 0, 1234.5)
    return Allocation(
        {"j1": share}, 60.0, 7, state, SolveInfo("optimal", 0.01), {"j1": (NodeShare("a100-1", 2),)}
    )


STATES = [
    None,
    GavelState(MappingProxyType({"j1": MappingProxyType({"a100": 60.0})}), 0.0),
    PolluxState(("j1",), ("a100-1", "t4-1"), np.array([[2, 0]])),
]


@pytest.mark.parametrize("state", STATES, ids=["none", "gavel", "pollux"])
@pytest.mark.parametrize("form", [3, 2])
def test_allocation_round_trips(state: object, form: int) -> None:
    """Format 3 (the JSON text as stored) and format 2 (a pickle of an earlier release) give the
    same allocation back."""
    original = allocation(state)
    if form == 3:
        text = json.dumps(allocation_to_json(original))
        saved = SavedAllocation(3, __version__, document=json.loads(text))
    else:
        saved = SavedAllocation(2, "0.0.1", pickled=dump_pickle(original))
    loaded = decode_allocation(saved)
    assert loaded.jobs == original.jobs and loaded.node_hints == original.node_hints
    assert (loaded.time, loaded.round_index, loaded.info) == (60.0, 7, original.info)
    if isinstance(state, PolluxState):
        assert isinstance(loaded.state, PolluxState)
        assert np.array_equal(loaded.state.replicas, state.replicas)
    else:
        assert loaded.state == state


def test_unpickler_refuses_foreign_callables() -> None:
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        decode_allocation(SavedAllocation(2, "0.0.1", pickled=pickle.dumps(os.system)))
    with pytest.raises(ValueError, match="expected a pickled Allocation, got dict"):
        decode_allocation(SavedAllocation(2, "0.0.1", pickled=pickle.dumps({"not": "one"})))


def report(sia_id: str, step: float, local_bsz: int = 128) -> MetricsReport:
    return MetricsReport(sia_id, 0.0, "t4", 1, 1, local_bsz, 0, step, 0.0, 1.0, 4.0)


def remembered_controller(
    factory: EstimatorFactory, store: Store, policy: str = "gavel"
) -> Controller:
    controller = Controller(make_policy(policy), factory)
    jobs = (JobSnapshot(JobSpec("j1", "cifar10"), JobPhase.PENDING),)
    snapshot = ClusterSnapshot(0.0, NODES, jobs)
    controller.round(snapshot)
    with store.transaction():
        store.record_jobs(snapshot)
        save_memory(store, controller, policy, [], 0, 0.0)
    return controller


def test_reports_are_capped_per_shape(factory: EstimatorFactory, store: Store) -> None:
    controller = remembered_controller(factory, store)
    reports = [report("j1", 0.3 + i / 100) for i in range(10)] + [report("j1", 0.5, 64)]
    reports.append(report("stranger", 0.3))
    with store.transaction():
        save_memory(store, controller, "gavel", reports, 1, 1.0, keep_per_shape=4)
    rows = store.conn.execute("SELECT shape, report FROM reports ORDER BY id").fetchall()
    shapes = [row["shape"] for row in rows]
    assert shapes == ["t4/1/1/128"] * 4 + ["t4/1/1/64"]
    assert '"step_time": 0.39' in rows[3]["report"], "the newest reports are kept"
    controller.jobs.clear()  # the job finished: its reports go
    with store.transaction():
        save_memory(store, controller, "gavel", [], 2, 2.0)
    assert store.conn.execute("SELECT COUNT(*) FROM reports").fetchone()[0] == 0


def restore_note(factory: EstimatorFactory, store: Store, policy: str = "gavel") -> str:
    controller, notes = load_memory(store, make_policy(policy), policy, factory)
    assert controller.previous is None and controller.round_index == 1
    (note,) = notes
    return f"{note.what}: {note.reason}"


def test_a_changed_policy_starts_fresh_and_a_new_version_does_not(
    factory: EstimatorFactory, store: Store
) -> None:
    live = remembered_controller(factory, store)
    assert controller_row(store)["format"] == MEMORY_FORMAT
    store.conn.execute("UPDATE controller SET sia_version = '0.0.1'")  # an upgrade since
    restored, notes = load_memory(store, make_policy("gavel"), "gavel", factory)
    assert notes == [] and restored.previous is not None and set(restored.jobs) == {"j1"}
    assert live.previous is not None and isinstance(restored.previous.state, GavelState)
    assert allocation_to_json(restored.previous) == allocation_to_json(live.previous)
    assert "saved by policy 'gavel', the configured policy is 'sia'" in restore_note(
        factory, store, "sia"
    )
    store.conn.execute("UPDATE controller SET allocation = '{\"jobs\": {}}'")
    assert restore_note(factory, store) == (
        f"previous allocation: cannot be loaded (ValueError: {store.path}: "
        "controller.allocation: missing time, round_index, info, node_hints, hints_move_jobs, "
        "state)"
    )


def format_2_row(store: Store, previous: Allocation | None) -> None:
    """Rewrite the saved row as sia-slurm wrote it in memory format 2 (the allocation pickled
    with the same pickler), by an earlier release."""
    store.conn.execute(
        "UPDATE controller SET format = 2, sia_version = '0.0.1', allocation = ?",
        (dump_pickle(previous),),
    )


def test_a_format_2_row_is_converted_and_saved_as_format_3(
    factory: EstimatorFactory, store: Store, caplog: pytest.LogCaptureFixture
) -> None:
    live = remembered_controller(factory, store)
    assert live.previous is not None and isinstance(live.previous.state, GavelState)
    format_2_row(store, live.previous)
    with caplog.at_level("INFO", logger="sia_slurm.service.controller_memory"):
        restored, notes = load_memory(store, make_policy("gavel"), "gavel", factory)
    assert notes == [] and restored.previous is not None
    assert allocation_to_json(restored.previous) == allocation_to_json(live.previous)
    assert "converted from memory format 2 (sia-slurm 0.0.1)" in caplog.text
    with store.transaction():
        save_memory(store, restored, "gavel", [], 1, 60.0)
    row = controller_row(store)
    assert (row["format"], row["sia_version"]) == (MEMORY_FORMAT, __version__)
    assert json.loads(row["allocation"]) == allocation_to_json(live.previous)
    format_2_row(store, live.previous)
    store.conn.execute("UPDATE controller SET allocation = ?", (b"junk",))
    assert "previous allocation: cannot be loaded (UnpicklingError" in restore_note(factory, store)


def test_database_writable_by_others_is_not_unpickled(
    factory: EstimatorFactory, store: Store
) -> None:
    live = remembered_controller(factory, store)
    format_2_row(store, live.previous)
    os.chmod(store.path, 0o666)
    assert "writable by group or others (chmod 600 it)" in restore_note(factory, store)
    os.chmod(store.path, 0o600)
    assert load_memory(store, make_policy("gavel"), "gavel", factory)[0].previous is not None


def test_unreadable_job_spec_leaves_the_job_out(factory: EstimatorFactory, store: Store) -> None:
    remembered_controller(factory, store)
    store.conn.execute('UPDATE jobs SET spec = \'{"sia_id": "j1", "app": 7}\'')
    controller, notes = load_memory(store, make_policy("gavel"), "gavel", factory)
    assert controller.jobs == {}
    assert len(notes) == 1 and "jobs.j1.spec: app: expected str, got 7" in notes[0].reason


def test_usage_ledger_and_shares_survive_a_restart(factory: EstimatorFactory, store: Store) -> None:
    controller = remembered_controller(factory, store)
    controller.usage.record(0.0, {"bio": 1.0, "phys": 4.0}, {"bio": 4.0, "phys": 4.0})
    controller.usage.record(600.0, {"bio": 1.0, "phys": 4.0}, {"bio": 4.0, "phys": 4.0})
    with store.transaction():
        save_memory(store, controller, "gavel", [], 1, 600.0)
    shares = SharesConfig(accounts={"bio": 3, "phys": 1})
    restored, notes = load_memory(store, make_policy("gavel"), "gavel", factory, shares)
    assert notes == [] and restored.shares is shares
    factors = restored.usage.factors(["bio", "phys"])
    assert factors["bio"] > 1.0 == factors["phys"]  # bio held 1 of the 4 it was owed
    assert factors == controller.usage.factors(["bio", "phys"])
    assert restored.usage.to_json() == controller.usage.to_json()  # held/owing since 600 too


def test_a_malformed_usage_ledger_starts_afresh(factory: EstimatorFactory, store: Store) -> None:
    remembered_controller(factory, store)
    store.set_meta("usage", {"used": {"bio": -1}, "owed": {}})
    restored, notes = load_memory(store, make_policy("gavel"), "gavel", factory)
    assert [n.what for n in notes] == ["usage ledger"]
    assert "meta.usage.used: expected account -> number >= 0" in notes[0].reason
    assert restored.usage.used == {} and restored.usage.time is None
    store.set_meta("usage", {"time": "noon"})
    assert (
        "meta.usage.time: expected a number"
        in load_memory(store, make_policy("gavel"), "gavel", factory)[1][0].reason
    )


def test_a_jobs_own_profile_and_the_last_quarantine_survive_a_restart(
    factory: EstimatorFactory, store: Store
) -> None:
    """A job that brought its own profile (profile.json) is rebuilt from the same document by
    a new process (the directory it came from is never read), its reports replayed; and the
    quarantine reasons of the last round are known, so cron's once-per-round controller logs
    each reason once."""
    from dataclasses import replace

    from sia_slurm.controller.quarantine import QUARANTINED
    from sia_slurm.protocol.profile import load_profiles
    from sia_slurm.protocol.profile_json import profile_to_json

    document = profile_to_json(replace(load_profiles().app("ncf"), name="mine"))
    own = JobSnapshot(
        JobSpec("own", "mine", profile="/home/u/never-read"), JobPhase.PENDING,
        profile_document=document,
    )  # fmt: skip
    bad = JobSnapshot(JobSpec("bad", "nosuchapp"), JobPhase.PENDING)
    controller = Controller(make_policy("gavel"), factory)
    snapshot = ClusterSnapshot(0.0, NODES, (own, bad))
    outcome = controller.round(snapshot)
    with store.transaction():
        store.record_jobs(snapshot)
        record_round(store, outcome, snapshot, dry_run=False, wall_time=0.0, timings={})
        save_memory(store, controller, "gavel", [report("own", 0.2)], 0, 0.0)
    restored, notes = load_memory(store, make_policy("gavel"), "gavel", factory)
    assert notes == []
    record = restored.jobs["own"]
    assert record.profile_document == document
    assert record.estimator.limits == controller.jobs["own"].estimator.limits
    assert restored.quarantine_said == {"bad": outcome.quarantined["bad"]}
    assert {d.sia_id: d.action for d in outcome.decisions}["bad"] == QUARANTINED
    controller.jobs.clear()  # both gone: the document leaves the database with the job
    with store.transaction():
        save_memory(store, controller, "gavel", [], 1, 1.0)
    assert store.meta("profile_document:own") is None


def test_a_profiling_under_way_survives_a_restart(factory: EstimatorFactory, store: Store) -> None:
    """A controller run once per round (cron) continues a profiling where the last process
    left it: the types measured, what each job was given and the documents already refused
    (one refused document counts once, however many processes read it)."""
    from sia_slurm.controller.profiling import MemoryProfileBook, Profiler

    job = JobSpec("p1", "mynet", init_batch_size=32, max_batch_size=128)
    bad = {"format": 1, "app": "mynet"}  # refused: fields missing

    def process(round_index: int, snapshot: ClusterSnapshot) -> Controller:
        profiler = Profiler(MemoryProfileBook(), factory)
        controller, notes = load_memory(
            store, make_policy("sia"), "sia", factory, profiler=profiler
        )
        assert notes == []
        outcome = controller.round(snapshot)
        with store.transaction():
            store.record_jobs(snapshot)
            record_round(store, outcome, snapshot, dry_run=False, wall_time=0.0, timings={})
            save_memory(store, controller, "sia", [], round_index, snapshot.time)
        return controller

    process(0, ClusterSnapshot(0.0, NODES, (JobSnapshot(job, JobPhase.PENDING),)))
    running = JobSnapshot(
        job, JobPhase.RUNNING, config=Configuration("t4", 1, 1),
        placement=(NodeShare("t4-1", 1),), profiled_document=bad,
    )  # fmt: skip
    for round_index in (1, 2, 3):
        controller = process(round_index, ClusterSnapshot(60.0 * round_index, NODES, (running,)))
    assert controller.jobs["p1"].profiling == ("", "mynet")
    (profiling,) = controller.profiler.profilings.values()  # type: ignore[union-attr]
    # t4, where it ran, and dgx, where the controller's own start or move sent it since
    assert profiling.given == {"p1": {"t4", "dgx"}}
    assert profiling.refusals == {"t4": 1}


def test_the_pace_check_and_a_liars_hold_survive_every_round_in_a_new_process(
    factory: EstimatorFactory, store: Store
) -> None:
    """Under cron's ``--once`` each round is a new process: the first report on the job's shape
    and its distrust come back from the database, so a pace lie is still judged at the second
    report and the liar is still held at its minimum in the round after, when it sends none."""
    config, batch = Configuration("a100", 1, 2), BatchChoice(128, 64, 0)
    job = JobSnapshot(
        JobSpec("j", "cifar10", min_gpus=1, max_gpus=8), JobPhase.RUNNING, config=config,
        placement=(NodeShare("a100-1", 2),), batch=batch,
    )  # fmt: skip

    def once(t: float, reports: tuple[MetricsReport, ...]) -> tuple[Controller, list[str]]:
        controller, notes = load_memory(store, make_policy("sia"), "sia", factory)
        assert notes == []
        snapshot = ClusterSnapshot(t, NODES, (job,), reports)
        outcome = controller.round(snapshot)
        with store.transaction():
            store.record_jobs(snapshot)
            save_memory(store, controller, "sia", outcome.reports_taken, outcome.round_index, t)
        return controller, [m for m in outcome.rejected if m.startswith("metrics for j:")]

    def lie(t: float) -> MetricsReport:  # a step time of 0.1 s, steps at a tenth of that pace
        return MetricsReport(
            "j", t + 1, "a100", 1, 2, 64, 0, 0.1, 0.01, 1.0, 2.0, steps=int(t),
            slurm_job_id="7",
        )  # fmt: skip

    assert once(0.0, (lie(0.0),))[1] == []
    assert json.loads(store.conn.execute(
        "SELECT value FROM meta WHERE key = 'pace:j'"
    ).fetchone()[0]) == {
        "pace": {"shape": ["7", 0, "a100", 1, 2, 64, 0], "time": 0.0, "steps": 0},
        "distrusted": "",
    }  # fmt: skip
    controller, said = once(60.0, (lie(60.0),))
    assert "claims 10 steps/s" in said[0] and controller.jobs["j"].distrusted
    controller, said = once(120.0, ())
    assert controller.jobs["j"].distrusted and said == []
    view = controller.jobs["j"].view(
        now=120.0, restarts=0, current=config, placement=(), restoring=False
    )
    assert view.max_gpus == 1
    store.set_meta("pace:j", {"pace": {"shape": "?"}, "distrusted": ""})
    restored, notes = load_memory(store, make_policy("sia"), "sia", factory)
    assert [n.what for n in notes] == ["job j's pace check"]
    assert restored.jobs["j"].pace is None and "j" in restored.jobs


def test_the_restarts_the_controller_asked_for_are_counted_and_survive_a_restart(
    factory: EstimatorFactory, store: Store
) -> None:
    """The controller counts each move and stop it decides; the snapshot's restarts beyond
    those are the cluster's own (requeues), which sia does not charge; the count is kept."""
    spec = JobSpec("j", "cifar10", min_gpus=1, max_gpus=4, restart_cost=1.0)
    controller = Controller(make_policy("sia"), factory)
    first = controller.round(ClusterSnapshot(0.0, NODES, (JobSnapshot(spec, JobPhase.PENDING),)))
    (start,) = first.actions
    on = JobSnapshot(
        spec, JobPhase.RUNNING, config=start.config, placement=start.placement,  # type: ignore[attr-defined]
        batch=start.batch,  # type: ignore[attr-defined]
    )  # fmt: skip
    grown = controller.round(ClusterSnapshot(600.0, NODES, (on,)))
    assert [type(a).__name__ for a in grown.actions] == ["Move"]
    record = controller.jobs["j"]
    assert record.chosen_restarts == 1
    view = record.view(now=900.0, restarts=3, current=None, placement=(), restoring=False)
    assert (view.restarts, view.requeues) == (3, 2)  # Slurm requeued it twice on its own
    with store.transaction():
        store.record_jobs(ClusterSnapshot(600.0, NODES, (on,)))
        save_memory(store, controller, "sia", [], grown.round_index, 600.0)
    restored, notes = load_memory(store, make_policy("sia"), "sia", factory)
    assert notes == [] and restored.jobs["j"].chosen_restarts == 1
