"""Actuation when Slurm refuses a step (FakeSlurm.fail): the action fails with the command and
Slurm's reason, the job is left where the next round picks it up (held by the controller, no
assignment for a run that never got its shape), the other jobs of the round go on, and
``apply`` never raises for one job's failure."""

from __future__ import annotations

from typing import Any

from sia_slurm.cluster import JobPhase, Stop
from sia_slurm.protocol import Assignment, read_document
from tests.slurm.conftest import BUSY
from tests.slurm.test_backend import backend_for, move, start


def held_by_controller(fake: Any, job_id: str) -> bool:
    job = fake.job(job_id)
    return job["priority"] == 0 and job["state_reason"] == "JobHeldAdmin"


def test_a_refused_reshape_fails_that_start_only_and_the_next_round_places_it(
    fake_slurm: Any,
) -> None:
    a, b = fake_slurm.submit("a"), fake_slurm.submit("b")
    fake_slurm.fail("update", a, reason="Requested node configuration is not available", times=1)
    backend = backend_for(fake_slurm)
    results = backend.apply([start("a", "rtx", ["rtx-1"], 2), start("b", "t4", ["t4-1"], 1)])
    assert [r.ok for r in results] == [False, True], [r.message for r in results]
    assert results[0].message.startswith(f"scontrol update JobId={a} Partition=rtx")
    assert "exit status 1" in results[0].message
    assert f"Requested node configuration is not available for job {a}" in results[0].message
    # Held by the controller (its user cannot release it), in its old shape, no assignment:
    # nothing runs on GPUs the plan did not give it.
    assert held_by_controller(fake_slurm, a) and not fake_slurm.user_release(a)
    assert fake_slurm.job(a)["partition"] == "t4"
    assert not fake_slurm.paths.assignment("a").exists()
    assert fake_slurm.job(b)["priority"] == 1  # the other start was released
    assert ["scontrol", "release", a] not in fake_slurm.calls
    (job,) = [j for j in backend.snapshot().jobs if j.sia_id == "a"]
    assert job.phase is JobPhase.PENDING  # the controller decides it again

    (again,) = backend.apply([start("a", "rtx", ["rtx-1"], 2, round_index=2)])
    assert again.ok, again.message
    assert fake_slurm.job(a)["partition"] == "rtx" and fake_slurm.job(a)["priority"] == 1
    assignment = read_document(Assignment, fake_slurm.paths.assignment("a"))
    assert (assignment.round_index, assignment.partition) == (2, "rtx")


def test_an_update_that_exits_0_without_taking_is_caught_and_placed_next_round(
    fake_slurm: Any,
) -> None:
    a = fake_slurm.submit("a")
    fake_slurm.fail("update", a, setting="Partition", silent=True, times=1)
    backend = backend_for(fake_slurm)
    (result,) = backend.apply([start("a", "a100", ["a100-1"], 4)])
    assert not result.ok
    assert result.message == (
        f"scontrol update of Slurm job {a} exited 0 but did not take: Partition=t4 (wanted "
        "a100); GPUs per node=1 (wanted 4); ReqNodeList=- (wanted a100-1)"
    )
    assert held_by_controller(fake_slurm, a)
    assert not fake_slurm.paths.assignment("a").exists()
    (again,) = backend.apply([start("a", "a100", ["a100-1"], 4, round_index=2)])
    assert again.ok, again.message
    assert fake_slurm.job(a)["partition"] == "a100"


def test_a_refused_release_fails_only_that_job_which_stays_held(fake_slurm: Any) -> None:
    """Batched: ``release A,B`` exits 1 for B; A is released and B, tried alone, fails."""
    a, b = fake_slurm.submit("a"), fake_slurm.submit("b")
    fake_slurm.fail("release", b, times=2)
    backend = backend_for(fake_slurm)
    results = backend.apply([start("a", "t4", ["t4-1"], 1), start("b", "t4", ["t4-2"], 1)])
    assert results[0].ok, results[0].message
    assert not results[1].ok
    assert results[1].message.startswith(f"could not release: scontrol release {b}: exit status")
    assert f"{BUSY} for job {b}" in results[1].message
    assert fake_slurm.calls.count(["scontrol", "release", f"{a},{b}"]) == 1
    assert fake_slurm.job(a)["priority"] == 1
    assert held_by_controller(fake_slurm, b) and not fake_slurm.user_release(b)
    (job,) = [j for j in backend.snapshot().jobs if j.sia_id == "b"]
    assert job.phase is JobPhase.PENDING and job.config is None

    (again,) = backend.apply([start("b", "t4", ["t4-2"], 1, round_index=2)])
    assert again.ok, again.message
    assert fake_slurm.job(b)["priority"] == 1
    assert read_document(Assignment, fake_slurm.paths.assignment("b")).round_index == 2


def test_a_refused_requeue_fails_the_move_and_the_next_round_moves_it(fake_slurm: Any) -> None:
    a, b = fake_slurm.submit("a"), fake_slurm.submit("b")
    fake_slurm.start(a, ["t4-1"])
    fake_slurm.start(b, ["t4-2"])
    fake_slurm.fail("requeuehold", a, reason="Job is no longer pending execution", times=2)
    backend = backend_for(fake_slurm)
    results = backend.apply(
        [move("a", "rtx", ["rtx-1"], 1, round_index=3), move("b", "rtx", ["rtx-2"], 1, 3)]
    )
    assert [r.ok for r in results] == [False, True], [r.message for r in results]
    assert results[0].message.startswith(
        f"could not hold Slurm job {a}: scontrol requeuehold {a}: exit status 1"
    )
    assert f"Job is no longer pending execution for job {a}" in results[0].message
    # Still running where it was, on the GPUs it holds; b moved.
    assert fake_slurm.job(a)["job_state"] == "RUNNING" and fake_slurm.job(a)["nodes"] == "t4-1"
    assert fake_slurm.job(b)["partition"] == "rtx"

    (again,) = backend.apply([move("a", "rtx", ["rtx-1"], 1, round_index=4)])
    assert again.ok, again.message
    assert fake_slurm.job(a)["job_state"] == "PENDING" and fake_slurm.job(a)["partition"] == "rtx"
    assert read_document(Assignment, fake_slurm.paths.assignment("a")).round_index == 4


def test_a_stop_whose_final_hold_is_refused_is_held_by_the_next_round(fake_slurm: Any) -> None:
    """The stop itself happened (requeued: GPUs free), so it succeeds and says the hold
    failed; the requeue's hold is its user's, which enforcement replaces at the next round."""
    a = fake_slurm.submit("a")
    fake_slurm.start(a, ["t4-1"])
    fake_slurm.fail("hold", a, times=1)
    backend = backend_for(fake_slurm)
    (result,) = backend.apply([Stop("a", 5)])
    assert result.ok, result.message
    assert result.details["hold"].startswith(
        f"not held by the controller: scontrol hold {a}: exit status 1"
    )
    assert fake_slurm.job(a)["job_state"] == "PENDING"
    assert fake_slurm.job(a)["state_reason"] == "JobHeldUser"  # its user could release it
    backend.snapshot()
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "hold", a]]
    assert held_by_controller(fake_slurm, a)


def test_a_refused_hold_fails_that_start_only_and_apply_does_not_raise(fake_slurm: Any) -> None:
    a, b = fake_slurm.submit("a"), fake_slurm.submit("b")
    fake_slurm.fail("hold", a, times=1)
    backend = backend_for(fake_slurm)
    results = backend.apply([start("a", "rtx", ["rtx-1"], 2), start("b", "t4", ["t4-1"], 1)])
    assert [r.ok for r in results] == [False, True], [r.message for r in results]
    assert f"scontrol hold {a}: exit status 1" in results[0].message
    assert f"{BUSY} for job {a}" in results[0].message
    assert fake_slurm.job(a)["priority"] == 0  # sbatch --hold's hold: never released
    assert not fake_slurm.paths.assignment("a").exists()
    assert fake_slurm.job(b)["priority"] == 1
    (again,) = backend.apply([start("a", "rtx", ["rtx-1"], 2, round_index=2)])
    assert again.ok, again.message
    assert read_document(Assignment, fake_slurm.paths.assignment("a")).round_index == 2


def test_a_refused_hold_after_the_requeue_fails_that_move_only(fake_slurm: Any) -> None:
    a, b = fake_slurm.submit("a"), fake_slurm.submit("b")
    fake_slurm.start(a, ["t4-1"])
    fake_slurm.start(b, ["t4-2"])
    backend = backend_for(fake_slurm)
    fake_slurm.fail("hold", a, times=1)
    results = backend.apply(
        [move("a", "rtx", ["rtx-1"], 1, round_index=3), move("b", "rtx", ["rtx-2"], 1, 3)]
    )
    assert [r.ok for r in results] == [False, True], [r.message for r in results]
    assert f"scontrol hold {a}: exit status 1" in results[0].message
    assert fake_slurm.job(a)["job_state"] == "PENDING" and fake_slurm.job(a)["priority"] == 0
    (again,) = backend.apply([start("a", "rtx", ["rtx-1"], 1, round_index=4)])
    assert again.ok, again.message
