"""A job that ends while the controller stops it: requeued only when it stopped for the
controller (it acknowledged the stop request), never when it finished its training.

Found by the end-to-end tests (tests/e2e): the snapshot looked for the ack of the assignment's
round instead of the stop request's, and a job that completed between the stop request and its
next look at the control files was requeued and ran a second time.
"""

from __future__ import annotations

from typing import Any

from sia_slurm.cluster import BatchChoice, JobPhase, Move, Start, Stop
from sia_slurm.config import parse_config
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import RunExit, StopRequest, exit_name, write_document
from sia_slurm.slurm.backend import SlurmBackend

CONFIG = (
    "state_dir: {state_dir}\npartitions:\n"
    "  a100: {{gpu_type: a100, gpus_per_node: 4}}\n"
    "  rtx: {{gpu_type: rtx, gpus_per_node: 4}}\n"
    "  t4: {{gpu_type: t4, gpus_per_node: 4}}\n"
    "restart: {{checkpoint_timeout_s: 30}}\n"
)


def backend_for(fake: Any) -> SlurmBackend:
    config = parse_config(CONFIG.format(state_dir=fake.paths.state_dir))
    return SlurmBackend(config, fake, fake.clock)


def placed(kind: type, sia_id: str, round_index: int, node: str) -> Any:
    config = Configuration(node.split("-")[0], 1, 1)
    return kind(sia_id, round_index, config, (NodeShare(node, 1),), BatchChoice(32, 32, 0))


def running_job(fake: Any, sia_id: str = "a") -> tuple[str, SlurmBackend]:
    """A job started in round 1 by the backend and now running on t4-1."""
    job_id = fake.submit(sia_id)
    backend = backend_for(fake)
    assert backend.apply([placed(Start, sia_id, 1, "t4-1")])[0].ok
    fake.start(job_id, ["t4-1"])
    fake.clear_calls()
    return job_id, backend


def ended(fake: Any, job_id: str, state: str) -> None:
    fake.job(job_id).update(job_state=state, priority=1, state_reason="None", gres_detail=[])


def phase_of(backend: SlurmBackend, sia_id: str = "a") -> tuple[JobPhase, str]:
    (job,) = [j for j in backend.snapshot().jobs if j.sia_id == sia_id]
    return job.phase, job.message


def test_a_job_that_acked_a_later_stop_then_failed_is_pending_not_failed(fake_slurm: Any) -> None:
    """The launcher exits 75 (FAILED in Slurm) after acknowledging a stop; the ack to look for
    is that of the stop request's round (5), not the assignment's (1)."""
    job_id, backend = running_job(fake_slurm)
    write_document(fake_slurm.paths.stop_request("a"), StopRequest("a", 5))
    fake_slurm.paths.ack("a", 5, job_id, 0).write_text("")
    ended(fake_slurm, job_id, "FAILED")
    phase, message = phase_of(backend)
    assert phase is JobPhase.PENDING, message
    fake_slurm.paths.ack("a", 5, job_id, 0).unlink()
    # Without the ack it did not stop: it failed. Its launcher's record says by whose doing.
    phase, message = phase_of(backend)
    assert phase is JobPhase.PENDING and "brought back" in message  # none: Slurm's doing
    exit_record = RunExit("a", job_id, 0, "failed", 1, message="exit 1")
    write_document(fake_slurm.paths.job_dir("a") / exit_name(job_id, 0), exit_record)
    phase, message = phase_of(backend)
    assert phase is JobPhase.FAILED and "its own code failed" in message, message


def test_a_job_that_completed_without_acking_the_stop_is_done(fake_slurm: Any) -> None:
    job_id, backend = running_job(fake_slurm)
    write_document(fake_slurm.paths.stop_request("a"), StopRequest("a", 5))
    ended(fake_slurm, job_id, "COMPLETED")
    assert phase_of(backend) == (JobPhase.DONE, "completed before it was stopped")
    fake_slurm.paths.ack("a", 5, job_id, 0).write_text("")  # it did stop for us: requeue it
    assert phase_of(backend)[0] is JobPhase.PENDING


def test_a_move_of_a_job_that_completes_instead_of_acking_is_not_requeued(
    fake_slurm: Any,
) -> None:
    """The job finishes its training just as the stop request arrives: it exits 0 without an
    ack. The move fails (nothing left to run), the job is not requeued and reads DONE."""
    job_id, backend = running_job(fake_slurm)
    fake_slurm.ack_delay_s["a"] = float("inf")
    tick = fake_slurm.clock.on_sleep

    def completes(now: float) -> None:
        tick(now)
        if fake_slurm.job(job_id)["job_state"] == "RUNNING":
            ended(fake_slurm, job_id, "COMPLETED")

    fake_slurm.clock.on_sleep = completes
    (result,) = backend.apply([placed(Move, "a", 2, "rtx-1")])
    assert not result.ok
    assert "completed its training before it could be stopped; not moved" in result.message
    assert not any(c[:2] == ["scontrol", "requeuehold"] for c in fake_slurm.calls)
    assert not any(c[:2] == ["scontrol", "release"] for c in fake_slurm.calls)
    assert fake_slurm.job(job_id)["restart_cnt"] == 0
    assert not fake_slurm.paths.stop_request("a").exists()
    assert phase_of(backend) == (JobPhase.DONE, "completed")


def test_a_stop_of_a_job_that_already_completed_is_done_without_a_requeue(
    fake_slurm: Any,
) -> None:
    """A replayed Stop (after a controller crash) finds the job completed with no ack."""
    job_id, backend = running_job(fake_slurm)
    write_document(fake_slurm.paths.stop_request("a"), StopRequest("a", 2))
    ended(fake_slurm, job_id, "COMPLETED")
    (result,) = backend.apply([Stop("a", 2)])
    assert result.ok and "completed its training" in result.message
    assert fake_slurm.verbs() == ["squeue"]
    assert fake_slurm.job(job_id)["restart_cnt"] == 0


def test_a_move_of_a_job_whose_own_code_fails_meanwhile_does_not_requeue_it(
    fake_slurm: Any,
) -> None:
    """Found by the chaos soak: the round decided a move from a snapshot that showed the job
    running; its own code failed as the stop was asked (exit 1, its launcher says so). The
    move must not requeue the failed run (that would bring it back whatever its
    ``--max-failures`` say): it fails, and the next snapshot judges the run, here FAILED with
    the default budget of 0."""
    job_id, backend = running_job(fake_slurm)
    fake_slurm.ack_delay_s["a"] = float("inf")
    tick = fake_slurm.clock.on_sleep

    def crashes(now: float) -> None:
        tick(now)
        if fake_slurm.job(job_id)["job_state"] == "RUNNING":
            ended(fake_slurm, job_id, "FAILED")
            record = RunExit("a", job_id, 0, "failed", 1, now, "exit 1")
            write_document(fake_slurm.paths.job_dir("a") / exit_name(job_id, 0), record)

    fake_slurm.clock.on_sleep = crashes
    (result,) = backend.apply([placed(Move, "a", 2, "rtx-1")])
    assert not result.ok and "ended FAILED by itself before it could be stopped" in result.message
    assert not any(c[:2] == ["scontrol", "requeuehold"] for c in fake_slurm.calls)
    assert fake_slurm.job(job_id)["restart_cnt"] == 0
    assert not fake_slurm.paths.stop_request("a").exists()
    phase, message = phase_of(backend)
    assert phase is JobPhase.FAILED and "its own code failed" in message, message
    # Nor does a Start after a crash that left round 2's stop request behind.
    write_document(fake_slurm.paths.stop_request("a"), StopRequest("a", 2))
    (start,) = backend.apply([placed(Start, "a", 3, "rtx-1")])
    assert not start.ok and "not requeued" in start.message
    assert fake_slurm.job(job_id)["restart_cnt"] == 0
