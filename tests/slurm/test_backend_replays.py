"""A start or move replayed after the controller died inside it (issue 18 item 7), and the
relaunch floor it must keep: the fake Slurm's job is left where the kill left it, and the
replayed action must bring it to the same end as an uninterrupted one.

The same scenarios run against the real daemons in tests/e2e/test_controller_kill_live.py."""

from __future__ import annotations

from typing import Any

import pytest

from sia_slurm.cluster import Stop
from sia_slurm.protocol import Assignment, read_document
from tests.slurm.test_backend import backend_for, move, start


def start_times(fake: Any) -> list[list[str]]:
    return [c for c in fake.calls if any(a.startswith("StartTime=") for a in c)]


def moved_and_requeued(fake: Any) -> tuple[str, int]:
    """Job ``a`` started on t4-1, running, then grown in place there (the node that revoked
    its credential); returns its Slurm id and the requeue's second."""
    job_id = fake.submit("a")
    backend = backend_for(fake)
    assert backend.apply([start("a", "t4", ["t4-1"], 1)])[0].ok
    fake.start(job_id, ["t4-1"])
    fake.clear_calls()
    (moved,) = backend.apply([move("a", "t4", ["t4-1"], 2, round_index=2)])
    assert moved.ok, moved.message
    return job_id, int(fake.time_of(["scontrol", "requeuehold", job_id]))


@pytest.mark.parametrize(
    ("before", "after", "floor"),
    [
        (["t4-1"], ["rtx-1"], 0),  # other nodes: from the kill's second on, i.e. at once
        (["t4-1", "t4-2"], ["t4-2", "t4-3"], 2),  # one node in common: K + 2
        (["t4-1"], ["t4-1"], 2),  # the same node, another GPU count: K + 2
    ],
)
def test_a_relaunch_waits_out_the_kill_second_only_on_a_node_of_the_killed_run(
    fake_slurm: Any, before: list[str], after: list[str], floor: int
) -> None:
    """Only the killed run's nodes revoked its credential (docs/slurm-actuation.md)."""
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    assert backend.apply([start("a", "t4", before, 1)])[0].ok
    fake_slurm.start(job_id, before)
    gpu_type = after[0].split("-")[0]
    per_node = 2 if after == before else 1
    (moved,) = backend.apply([move("a", gpu_type, after, per_node, round_index=2)])
    assert moved.ok, moved.message
    requeued_at = int(fake_slurm.time_of(["scontrol", "requeuehold", job_id]))
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert assignment.not_before == requeued_at + floor
    assert fake_slurm.job(job_id)["start_time"] == requeued_at + floor


def test_the_floor_is_written_with_the_assignment_and_set_before_the_release(
    fake_slurm: Any,
) -> None:
    job_id, requeued_at = moved_and_requeued(fake_slurm)
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert assignment.not_before == requeued_at + 2
    (update,) = start_times(fake_slurm)
    assert fake_slurm.calls.index(update) < fake_slurm.calls.index(["scontrol", "release", job_id])
    assert fake_slurm.job(job_id)["start_time"] == requeued_at + 2


def test_a_move_replayed_after_its_release_still_brings_the_job_forward(fake_slurm: Any) -> None:
    """Killed between ``release`` and ``StartTime``: the replay finds the job released with
    this round's assignment ("already moved") and must still cut Slurm's requeue delay."""
    job_id, requeued_at = moved_and_requeued(fake_slurm)
    delayed = requeued_at + fake_slurm.cred_expire_s + 1
    fake_slurm.job(job_id).update(start_time=delayed, eligible_time=delayed)  # no StartTime
    fake_slurm.clear_calls()
    (replayed,) = backend_for(fake_slurm).apply([move("a", "t4", ["t4-1"], 2, round_index=2)])
    assert replayed.ok and "already moved" in replayed.message, replayed.message
    assert fake_slurm.job(job_id)["start_time"] == requeued_at + 2
    assert [c[0:2] for c in start_times(fake_slurm)] == [["scontrol", "update"]]


def test_a_replayed_start_keeps_the_floor_it_wrote_and_moves_it_no_earlier(
    fake_slurm: Any,
) -> None:
    """Killed after ``StartTime`` and before ``release``: the job is held with its BeginTime
    at the floor already. Computing the floor again from that BeginTime would give one
    ``cred_expire`` earlier, inside the revoked credential's reach; the replay reuses the
    floor of its assignment for the same run and sends no second StartTime."""
    job_id, requeued_at = moved_and_requeued(fake_slurm)
    fake_slurm.job(job_id).update(priority=0, state_reason="JobHeldAdmin")  # not released yet
    fake_slurm.clear_calls()
    (replayed,) = backend_for(fake_slurm).apply([move("a", "t4", ["t4-1"], 2, round_index=2)])
    assert replayed.ok, replayed.message
    assert start_times(fake_slurm) == []
    assert fake_slurm.job(job_id)["start_time"] == requeued_at + 2
    assert fake_slurm.job(job_id)["priority"] == 1  # released
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert assignment.not_before == requeued_at + 2


def test_a_job_stopped_past_its_requeue_delay_starts_without_a_start_time(
    fake_slurm: Any,
) -> None:
    """Slurm reports ``start_time`` 0 for a held job whose BeginTime has passed: there is
    nothing to bring forward (a floor computed from 0 was a StartTime in 1969)."""
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    assert backend.apply([start("a", "t4", ["t4-1"], 1)])[0].ok
    fake_slurm.start(job_id, ["t4-1"])
    assert backend.apply([Stop("a", 2)])[0].ok
    fake_slurm.job(job_id)["start_time"] = 0  # the requeue delay has passed (BeginTime stays)
    fake_slurm.clear_calls()
    (started,) = backend.apply([start("a", "t4", ["t4-1"], 1, round_index=3)])
    assert started.ok, started.message
    assert start_times(fake_slurm) == []
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert (assignment.slurm_restart_count, assignment.not_before) == (1, 0.0)


def test_a_refused_start_time_leaves_the_start_done_at_slurms_begin_time(
    fake_slurm: Any,
) -> None:
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    assert backend.apply([start("a", "t4", ["t4-1"], 1)])[0].ok
    fake_slurm.start(job_id, ["t4-1"])
    fake_slurm.fail("update", job_id, setting="StartTime", times=1)
    (moved,) = backend.apply([move("a", "rtx", ["rtx-1"], 1, round_index=2)])
    assert moved.ok, moved.message
    assert "StartTime was not brought forward" in moved.message
    assert fake_slurm.job(job_id)["priority"] == 1  # released all the same


def test_a_move_replayed_while_the_requeued_job_still_completes_signals_nothing(
    fake_slurm: Any,
) -> None:
    """Killed right after ``requeuehold`` while the job still exits: the replay finds it
    COMPLETING. Signalling it would make scancel retry for ~95 s ("Job can not be altered
    now"); requeueing it again is refused. The replay waits until it is PENDING, then
    places it."""
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    assert backend.apply([start("a", "t4", ["t4-1"], 1)])[0].ok
    fake_slurm.start(job_id, ["t4-1"])
    fake_slurm.completing_s["a"] = 3.0
    fake_slurm.run(["scontrol", "requeuehold", job_id])  # the killed controller's last step
    assert fake_slurm.job(job_id)["job_state"] == "COMPLETING"
    fake_slurm.clear_calls()
    (replayed,) = backend.apply([move("a", "rtx", ["rtx-1"], 1, round_index=2)])
    assert replayed.ok, replayed.message
    verbs = fake_slurm.verbs()
    assert "scancel" not in verbs and "scontrol requeuehold" not in verbs, verbs
    assert fake_slurm.job(job_id)["partition"] == "rtx"
    assert fake_slurm.job(job_id)["priority"] == 1


def test_a_stopped_job_that_completes_instead_ends_the_wait_at_once(fake_slurm: Any) -> None:
    """A completing job that ends COMPLETED (its training was done) is not waited for until
    the requeue timeout: the Stop's result says what it became."""
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    assert backend.apply([start("a", "t4", ["t4-1"], 1)])[0].ok
    fake_slurm.start(job_id, ["t4-1"])
    fake_slurm.job(job_id)["job_state"] = "COMPLETING"
    fake_slurm.clock.on_sleep = lambda now: fake_slurm.job(job_id).update(job_state="COMPLETED")
    began = fake_slurm.clock.now()
    (stopped,) = backend.apply([Stop("a", 2)])
    assert fake_slurm.clock.now() - began < 5.0
    assert not stopped.ok and "COMPLETED, not PENDING" in stopped.message, stopped.message


def test_the_floor_comes_from_the_begin_time_not_the_backfill_estimate(fake_slurm: Any) -> None:
    """A released requeued job Slurm could not start (Resources) shows the backfill
    scheduler's estimate as ``start_time``: with running jobs of unlimited time, a year
    ahead. Held again and decided anew, its floor comes from its BeginTime
    (``eligible_time``), never from that estimate, or it would not start for a year."""
    job_id, requeued_at = moved_and_requeued(fake_slurm)
    a_year = fake_slurm.clock.now() + 365 * 86400
    begin = requeued_at + fake_slurm.cred_expire_s + 1  # as if no StartTime had been sent
    fake_slurm.job(job_id).update(
        start_time=a_year, eligible_time=begin, priority=0, state_reason="JobHeldAdmin"
    )
    fake_slurm.paths.assignment("a").unlink()  # no floor kept: computed again
    (placed,) = backend_for(fake_slurm).apply([move("a", "t4", ["t4-2"], 1, round_index=5)])
    assert placed.ok, placed.message
    assert fake_slurm.job(job_id)["start_time"] == requeued_at + 2
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert assignment.not_before == requeued_at + 2
