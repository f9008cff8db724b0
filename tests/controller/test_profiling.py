"""Sia's profiling of a new model, driven through real rounds of the controller
(docs/profiling.md): one GPU of each type in turn, each run measuring a sweep, the document
checked and kept, two jobs of one app giving one profile, hostile documents refused."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot, Move, Start
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller.profiling import (
    MemoryProfileBook,
    Profiler,
    profile_sweep,
    profiling_limits,
)
from sia_slurm.controller.profiling_state import MAX_REFUSALS
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare, NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.protocol.profile_json import PROFILE_FORMAT

NODES = (NodeView("t4-1", "t4", 4, 4), NodeView("a100-1", "a100", 4, 4))
ALIASES = {"a100": "dgx"}
SPEED = {"t4": 4e-4, "dgx": 1e-4}  # seconds per sample on one GPU


@pytest.fixture(scope="module")
def factory() -> EstimatorFactory:
    return EstimatorFactory(load_profiles(), ALIASES)


def spec(sia_id: str = "new", app: str = "mynet", submit: float = 0.0) -> JobSpec:
    return JobSpec(sia_id, app, init_batch_size=32, max_batch_size=256, submit_time=submit)


def measured(types: list[str], limit: int = 64, **override: Any) -> dict[str, Any]:
    """The document a profiling job writes after measuring ``types`` (profile names)."""
    seed = [
        {
            "gpu_type": t,
            "local_bsz": m,
            "placement": "1",
            "step_time": 0.01 + m * SPEED[t],
            "sync_time": 0.0,
        }
        for t in types
        for m in (2, 4, 8, 16, 32, 64)
        if m <= limit
    ]
    document = {
        "format": PROFILE_FORMAT,
        "app": "mynet",
        "init_batch_size": 32,
        "max_batch_size": 256,
        "min_local_bsz": 2,
        "max_local_bsz": {t: limit for t in types},
        "seed": seed,
        "description": "",
    }
    document.update(override)
    return document


def on(job: JobSpec, gpu_type: str, gpus: int = 1, **fields: Any) -> JobSnapshot:
    node = f"{gpu_type}-1"
    return JobSnapshot(
        job,
        JobPhase.RUNNING,
        config=Configuration(gpu_type, 1, gpus),
        placement=(NodeShare(node, gpus),),
        account="physics",
        **fields,
    )


def pending(job: JobSpec, **fields: Any) -> JobSnapshot:
    return JobSnapshot(job, JobPhase.PENDING, account="physics", **fields)


def controller(factory: EstimatorFactory, book: MemoryProfileBook | None = None) -> Controller:
    profiler = Profiler(book if book is not None else MemoryProfileBook(), factory)
    return Controller(make_policy("sia"), factory, profiler=profiler)


def test_a_new_model_is_profiled_type_by_type_then_scheduled(factory: EstimatorFactory) -> None:
    book = MemoryProfileBook()
    ctl = controller(factory, book)
    job = spec()
    sweep = profile_sweep(profiling_limits(job))
    assert sweep == (2, 4, 8, 16, 32, 64, 128, 256)

    (start,) = ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),))).actions
    assert isinstance(start, Start) and start.config.gpus == 1
    assert start.profile_sweep == sweep
    first = start.config.gpu_type
    other = "t4" if first == "a100" else "a100"

    # While it sweeps, nothing is measured: it keeps its GPU.
    outcome = ctl.round(ClusterSnapshot(60.0, NODES, (on(job, first),)))
    assert outcome.actions == ()
    (decision,) = outcome.decisions
    assert decision.note == "profiling: measured none; to measure a100, t4"
    assert ctl.jobs["new"].profiling == ("physics", "mynet")

    # Its first type measured, it moves to one GPU of the other, measuring again.
    document = measured([ALIASES.get(first, first)])
    (move,) = ctl.round(
        ClusterSnapshot(120.0, NODES, (on(job, first, profiled_document=document),))
    ).actions
    assert isinstance(move, Move) and move.config == Configuration(other, 1, 1)
    assert move.profile_sweep == sweep

    # Every type measured: the profile is checked and kept, and the job is scheduled from it.
    document = measured(["t4", "dgx"])
    outcome = ctl.round(
        ClusterSnapshot(180.0, NODES, (on(job, other, profiled_document=document),))
    )
    record = ctl.jobs["new"]
    assert record.profiling is None and record.profile_document is not None
    kept = book.get("physics", "mynet")
    assert kept is not None and sorted(kept["max_local_bsz"]) == ["dgx", "t4"]
    assert book.meta[("physics", "mynet")]["seconds"] == 180.0
    for action in outcome.actions:
        assert isinstance(action, Move) and action.profile_sweep == ()
    # The model is the measured one: on one GPU at M0 it predicts the measured step times.
    row = record.estimator.evaluate(
        [Configuration("t4", 1, 1), Configuration("a100", 1, 1)], fixed_batch=True
    )
    for got, gpu_type in zip(row.throughput, ("t4", "dgx"), strict=True):
        assert got == pytest.approx(32 / (0.01 + 32 * SPEED[gpu_type]), rel=0.05)


def test_a_run_whose_node_died_before_any_snapshot_saw_it_keeps_its_measurement(
    factory: EstimatorFactory,
) -> None:
    """Moved to its second type, the job measured it, then its node died before the next
    round: Slurm requeued it, so no snapshot ever saw it running there. Its measurement is of a
    type the controller gave it (the move's), not a lie: taken, and that type is not measured
    again (a live test at load: refused as "given only t4", then measured twice)."""
    ctl = controller(factory)
    job = spec()
    (start,) = ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),))).actions
    first = start.config.gpu_type
    other = "t4" if first == "a100" else "a100"
    document = measured([ALIASES.get(first, first)])
    (move,) = ctl.round(
        ClusterSnapshot(60.0, NODES, (on(job, first, profiled_document=document),))
    ).actions
    assert isinstance(move, Move) and move.config.gpu_type == other
    both = measured(["t4", "dgx"])
    outcome = ctl.round(  # requeued by Slurm after its node's death: pending, no GPUs
        ClusterSnapshot(120.0, NODES, (pending(job, restarts=2, profiled_document=both),))
    )
    record = ctl.jobs["new"]
    assert record.profiling is None and record.profile_document is not None, outcome.decisions
    assert all("refused" not in d.note for d in outcome.decisions), outcome.decisions


def test_a_later_job_of_the_app_and_account_reuses_the_kept_profile(
    factory: EstimatorFactory,
) -> None:
    book = MemoryProfileBook()
    book.put("physics", "mynet", measured(["t4", "dgx"]), {})
    ctl = controller(factory, book)
    outcome = ctl.round(ClusterSnapshot(0.0, NODES, (pending(spec()),)))
    assert ctl.jobs["new"].profiling is None
    for action in outcome.actions:
        assert isinstance(action, Start) and action.profile_sweep == ()
    # Another account's job of the same app profiles for itself.
    other = JobSnapshot(spec("theirs"), JobPhase.PENDING, account="biology")
    ctl.round(ClusterSnapshot(60.0, NODES, (other,)))
    assert ctl.jobs["theirs"].profiling == ("biology", "mynet")


def test_two_jobs_of_one_new_app_give_one_profile(factory: EstimatorFactory) -> None:
    book = MemoryProfileBook()
    ctl = controller(factory, book)
    first, second = spec("first", submit=0.0), spec("second", submit=5.0)
    outcome = ctl.round(ClusterSnapshot(10.0, NODES, (pending(first), pending(second))))
    assert [a.sia_id for a in outcome.actions] == ["first"]
    (waits,) = [d for d in outcome.decisions if d.sia_id == "second"]
    assert waits.action == "wait" and "waits for job first's profile of mynet" in waits.note

    # The profiler ends half way: the second takes over with the type already measured.
    start = outcome.actions[0]
    assert isinstance(start, Start)
    measured_type = ALIASES.get(start.config.gpu_type, start.config.gpu_type)
    running = on(first, start.config.gpu_type, profiled_document=measured([measured_type]))
    ctl.round(ClusterSnapshot(70.0, NODES, (running, pending(second))))
    outcome = ctl.round(ClusterSnapshot(130.0, NODES, (pending(second),)))
    (start2,) = outcome.actions
    assert isinstance(start2, Start) and start2.sia_id == "second"
    assert start2.config.gpu_type != start.config.gpu_type  # the measured type is not redone


def test_a_job_without_an_app_profiles_for_itself(factory: EstimatorFactory) -> None:
    book = MemoryProfileBook()
    ctl = controller(factory, book)
    job = spec("solo", app="")
    ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),)))
    assert ctl.jobs["solo"].profiling == ("/", "solo")
    ctl.round(ClusterSnapshot(60.0, NODES, (on(job, "t4", profiled_document=measured(["t4"])),)))
    ctl.round(
        ClusterSnapshot(120.0, NODES, (on(job, "a100", profiled_document=measured(["t4", "dgx"])),))
    )
    assert ctl.jobs["solo"].profiling is None
    assert book.documents == {}  # kept for nobody else


def test_without_accounting_jobs_of_an_app_share_under_no_account(
    factory: EstimatorFactory,
) -> None:
    book = MemoryProfileBook()
    ctl = controller(factory, book)
    job = spec()
    snapshot = JobSnapshot(job, JobPhase.PENDING)  # no Slurm accounting: account ""
    ctl.round(ClusterSnapshot(0.0, NODES, (snapshot,)))
    assert ctl.jobs["new"].profiling == ("", "mynet")
    for t, (site_type, types) in enumerate((("t4", ["t4"]), ("a100", ["t4", "dgx"]))):
        running = on(job, site_type, profiled_document=measured(types))
        running = JobSnapshot(**{**running.__dict__, "account": ""})
        ctl.round(ClusterSnapshot(60.0 * (t + 1), NODES, (running,)))
    assert book.get("", "mynet") is not None


def test_a_job_without_its_initial_batch_cannot_be_profiled(factory: EstimatorFactory) -> None:
    ctl = controller(factory)
    outcome = ctl.round(ClusterSnapshot(0.0, NODES, (pending(JobSpec("x", "mynet")),)))
    (decision,) = outcome.decisions
    assert decision.action == QUARANTINED and "--init-batch-size" in decision.note


@pytest.mark.parametrize(
    ("document", "said"),
    [
        (measured(["t4", "dgx"]), "type(s) dgx measured, but the job was given only t4"),
        (
            measured(["t4"], seed=[{"gpu_type": "t4", "local_bsz": 2, "placement": "1",
                                     "step_time": float("nan"), "sync_time": 0.0}]),
            "step_time",
        ),
        (measured(["t4"], max_local_bsz={"t4": -3}), "max_local_bsz.t4"),
        (measured(["t4"], seed=[]), "seed"),
        (
            measured(["t4"], seed=[
                {"gpu_type": "t4", "local_bsz": 2, "placement": "1", "step_time": 9.0,
                 "sync_time": 0.0},
                {"gpu_type": "t4", "local_bsz": 64, "placement": "1", "step_time": 0.01,
                 "sync_time": 0.0},
            ]),
            "step times must grow with the batch",
        ),
    ],
)  # fmt: skip
def test_a_hostile_document_is_refused_and_the_job_measured_again_then_held(
    factory: EstimatorFactory, document: dict[str, Any], said: str
) -> None:
    ctl = controller(factory)
    job = spec()
    # First seen on t4 (so the controller gives it no other type: a start's type counts as
    # given from the round that decides it)
    ctl.round(ClusterSnapshot(0.0, NODES, (on(job, "t4"),)))
    profiling = ctl.profiler.profilings[("physics", "mynet")]  # type: ignore[union-attr]
    outcome = ctl.round(ClusterSnapshot(60.0, NODES, (on(job, "t4", profiled_document=document),)))
    assert said in profiling.said and profiling.measured == {}
    assert profiling.refusals == {"t4": 1}
    # Not measured again in the run it lied in: it goes to the other type (no quarantine).
    (move,) = outcome.actions
    assert isinstance(move, Move) and move.config.gpu_type == "a100" and move.profile_sweep
    (decision,) = outcome.decisions
    assert decision.note.startswith("profiling: measured none; to measure a100, t4; last refused: ")
    # The same document read again is not a new refusal.
    ctl.round(ClusterSnapshot(120.0, NODES, (on(job, "t4", profiled_document=document),)))
    assert profiling.refusals == {"t4": 1}
    if "was given only" in said:
        return  # the move gave it a100 (dgx): from now on dgx is a type it was given
    # Measured again on t4 in a later run, refused again: held, with the reason, no GPUs.
    again = copy.deepcopy({**document, "description": "try 2"})  # measured again
    for point in again["seed"][:1]:
        point["step_time"] *= 0.9
    back = on(job, "t4", profiled_document=again, restarts=2)
    outcome = ctl.round(ClusterSnapshot(180.0, NODES, (back,)))
    assert profiling.refusals == {"t4": MAX_REFUSALS}
    (decision,) = outcome.decisions
    assert decision.action == "stop" and decision.note.startswith("profiling: held: ")
    outcome = ctl.round(ClusterSnapshot(240.0, NODES, (pending(job, restarts=3),)))
    assert outcome.actions == () and outcome.decisions[0].action == "wait"


def test_a_run_that_measures_nothing_is_refused_after_the_deadline(
    factory: EstimatorFactory,
) -> None:
    """A script without the elastic wrappers never writes profiled.json: its run is refused
    after the deadline, so profiling can neither hold a GPU forever nor hang."""
    ctl = controller(factory)
    ctl.profiler.deadline_s = 100.0  # type: ignore[union-attr]
    job = spec()
    ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),)))
    ctl.round(ClusterSnapshot(60.0, NODES, (on(job, "t4"),)))
    outcome = ctl.round(ClusterSnapshot(150.0, NODES, (on(job, "t4"),)))
    assert outcome.actions == ()
    outcome = ctl.round(ClusterSnapshot(161.0, NODES, (on(job, "t4"),)))
    profiling = ctl.profiler.profilings[("physics", "mynet")]  # type: ignore[union-attr]
    assert profiling.refusals == {"t4": 1}
    assert "nothing measured on t4 within 100 s" in profiling.said
    (move,) = outcome.actions
    assert isinstance(move, Move) and move.config.gpu_type == "a100"


def test_a_bad_type_is_refused_alone_and_not_twice_for_the_same_points(
    factory: EstimatorFactory,
) -> None:
    """A document with a sound type and an unsound one: the sound one is taken; the unsound
    one, still in the job's later documents until it is measured again, counts once."""
    ctl = controller(factory)
    job = spec()
    ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),)))
    profiling = ctl.profiler.profilings[("physics", "mynet")]  # type: ignore[union-attr]
    bad_t4 = measured(["t4"])
    bad_t4["seed"][-1]["step_time"] = 0.001  # far under the smaller batches': refused
    ctl.round(ClusterSnapshot(60.0, NODES, (on(job, "t4", profiled_document=bad_t4),)))
    assert profiling.refusals == {"t4": 1} and profiling.measured == {}
    both = measured(["t4", "dgx"])
    both["seed"] = bad_t4["seed"] + [p for p in both["seed"] if p["gpu_type"] == "dgx"]
    running = on(job, "a100", profiled_document=both, restarts=1)
    ctl.round(ClusterSnapshot(120.0, NODES, (running,)))
    assert sorted(profiling.measured) == ["dgx"]
    assert profiling.refusals == {"t4": 1}  # the same t4 points: not refused twice


def test_an_unreadable_document_counts_as_refused(factory: EstimatorFactory) -> None:
    ctl = controller(factory)
    job = spec()
    ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),)))
    problem = "job new: profiled.json: an integer of 5000 digits"
    ctl.round(ClusterSnapshot(60.0, NODES, (on(job, "t4", profiled_problem=problem),)))
    profiling = ctl.profiler.profilings[("physics", "mynet")]  # type: ignore[union-attr]
    assert profiling.refusals == {"t4": 1} and profiling.said == problem
    assert profiling.refused_run == {"new": (0, "t4")}


def test_without_a_profiler_an_unknown_app_is_refused_as_before(factory: EstimatorFactory) -> None:
    outcome = Controller(make_policy("sia"), factory).round(
        ClusterSnapshot(0.0, NODES, (pending(spec()),))
    )
    (decision,) = outcome.decisions
    assert decision.action == QUARANTINED and "no profile for app 'mynet'" in decision.note


def test_a_job_measuring_a_type_stays_until_its_measurement_arrives(
    factory: EstimatorFactory,
) -> None:
    """Moved before its sweep ran, a profiling job would lose it (the simulator saw jobs
    ping-pong between types): on an unmeasured type, it is offered that type alone."""
    ctl = controller(factory)
    job = spec()
    ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),)))
    for t in (60.0, 120.0, 180.0):
        outcome = ctl.round(ClusterSnapshot(t, NODES, (on(job, "t4"),)))
        assert outcome.actions == ()
        assert ctl.jobs["new"].profile_types == frozenset({"t4"})


def test_the_restarts_profiling_took_are_not_charged_afterwards(
    factory: EstimatorFactory,
) -> None:
    ctl = controller(factory)
    job = spec()
    ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),)))
    ctl.round(ClusterSnapshot(60.0, NODES, (on(job, "t4", profiled_document=measured(["t4"])),)))
    done = on(job, "a100", restarts=1, profiled_document=measured(["t4", "dgx"]))
    ctl.round(ClusterSnapshot(120.0, NODES, (done,)))
    record = ctl.jobs["new"]
    assert record.profiling is None and record.profiling_restarts == 1
    view = record.view(now=180.0, restarts=3, current=None, placement=(), restoring=False)
    assert view.restarts == 2  # the two the policy chose, not the profiling's


def test_a_new_model_measures_the_type_expected_slowest_first(factory: EstimatorFactory) -> None:
    """Both types free: the shipped profiles rank t4 well below the A100s (dgx), so the job
    starts on t4 (with every type alike it took the first node's type, the A100s, here) and
    ends its profiling on the A100, where it is likeliest to stay; a full t4
    does not make it wait (the preference is a placeholder's few per cent, not a rule)."""
    factors = controller(factory).profiler.expected_speed  # type: ignore[union-attr]
    assert factors["dgx"] == 1.0 and factors["t4"] < 0.5
    job = spec()
    a100_first = (NodeView("a100-1", "a100", 4, 4), NodeView("t4-1", "t4", 4, 4))  # alike, a100
    snapshot = ClusterSnapshot(0.0, a100_first, (pending(job),))
    (start,) = controller(factory).round(snapshot).actions
    assert isinstance(start, Start) and start.config == Configuration("t4", 1, 1)
    full_t4 = (NodeView("t4-1", "t4", 4, 0), NodeView("a100-1", "a100", 4, 4))
    (start,) = controller(factory).round(ClusterSnapshot(0.0, full_t4, (pending(job),))).actions
    assert isinstance(start, Start) and start.config == Configuration("a100", 1, 1)


def test_a_run_that_measured_its_type_before_its_first_report_moves_in_that_round(
    factory: EstimatorFactory,
) -> None:
    """A profiling run writes its measurement seconds after its launch, before its first
    metrics report, so the snapshot still says STARTING (mid-restore). A restoring job keeps
    its configuration; this one may not keep it (its type is measured), and was stopped, then
    started on the next type a round later: a whole round on no GPU per type, 7 s in 15 s of
    the demo's, half a minute of a 60 s one. It moves to the next type in the same round."""
    ctl = controller(factory)
    job = spec()
    (start,) = ctl.round(ClusterSnapshot(0.0, NODES, (pending(job),))).actions
    first = start.config.gpu_type
    other = "t4" if first == "a100" else "a100"
    starting = replace(on(job, first), phase=JobPhase.STARTING)
    outcome = ctl.round(ClusterSnapshot(60.0, NODES, (starting,)))
    assert outcome.actions == ()  # mid-restore on a type still to measure: it stays
    document = measured([ALIASES.get(first, first)])
    measured_run = replace(starting, profiled_document=document)
    (move,) = ctl.round(ClusterSnapshot(120.0, NODES, (measured_run,))).actions
    assert isinstance(move, Move) and move.config == Configuration(other, 1, 1)
    assert move.profile_sweep == profile_sweep(profiling_limits(job))
    # Once every type is measured, the run on the last one is mid-restore again: it stays.
    done = replace(
        on(job, other, restarts=1, profiled_document=measured(["t4", "dgx"])),
        phase=JobPhase.STARTING,
    )
    assert ctl.round(ClusterSnapshot(180.0, NODES, (done,))).actions == ()
