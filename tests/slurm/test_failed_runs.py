"""Runs that Slurm ends badly (issue 18 item 2): the job's own failure or Slurm's?

A run whose own code failed (its launcher's ``exit-<run>.json`` says so, or Slurm ended it
OUT_OF_MEMORY) ends the job FAILED once its ``max_failures`` are spent; a run Slurm ended (no
exit of its own: a refused launch, a failed node, a killed batch step) is brought back from
its checkpoint, up to ``restart.max_slurm_failures``. Pure rules first, then the backend on
the fake Slurm (the real daemons: tests/e2e/test_failures_live.py).
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from sia_slurm.cluster import BatchChoice, JobPhase, Start
from sia_slurm.config import parse_config
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import (
    ExitCause,
    JobSpec,
    ProtocolError,
    RunExit,
    exit_name,
    write_document,
)
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.observe.jobfiles import RunId, SlurmRecord
from sia_slurm.slurm.observe.jsonparse import SlurmJob
from sia_slurm.slurm.observe.managed import failed_run

CONFIG = (
    "state_dir: {state_dir}\npartitions:\n"
    "  t4: {{gpu_type: t4, gpus_per_node: 4}}\n"
    "restart: {{checkpoint_timeout_s: 30, max_slurm_failures: {slurm_budget}}}\n"
)


def slurm_job(state: str, job_id: str = "7", restarts: int = 0, reason: str = "None") -> SlurmJob:
    return SlurmJob(
        job_id=job_id,
        name="j",
        state=state,
        flags=(),
        reason=reason,
        comment="sia-slurm:a",
        partition="t4",
        nodes=(),
        node_count=1,
        tasks=1,
        cpus=1,
        gpus_per_node=(),
        requested_gpus_per_node=1,
        required_nodes=(),
        restart_count=restarts,
        held=False,
        submit_time=1.0,
        start_time=2.0,
        end_time=3.0,
        user_id=1000,
        group_id=1000,
    )


RECORD = SlurmRecord("7", 1000, 1.0)


def exit_of(cause: ExitCause, job_id: str = "7", restarts: int = 0, status: int = 1) -> RunExit:
    return RunExit("a", job_id, restarts, cause.value, status, message=f"exit {status}")


def rule(job: SlurmJob, record: SlurmRecord = RECORD, exit_record: RunExit | None = None,
         max_failures: int = 0, max_slurm_failures: int = 10) -> Any:  # fmt: skip
    return failed_run(
        job,
        record,
        exit_record,
        max_failures=max_failures,
        max_slurm_failures=max_slurm_failures,
    )


# ------------------------------------------------------------------------------------------------
# The rule


@pytest.mark.parametrize("state", ["PENDING", "RUNNING", "COMPLETED", "CANCELLED", "TIMEOUT"])
def test_runs_that_did_not_fail_or_were_ended_on_purpose_are_no_failures(state: str) -> None:
    assert rule(slurm_job(state)) is None


@pytest.mark.parametrize("state", ["FAILED", "NODE_FAIL", "BOOT_FAIL", "PREEMPTED"])
def test_a_run_that_left_no_exit_of_its_own_was_ended_by_slurm_and_comes_back(state: str) -> None:
    failure = rule(slurm_job(state, reason="NonZeroExitCode"))
    assert (failure.run, failure.users_fault, failure.again) == (RunId("7", 0), False, True)
    assert failure.message == (
        f"Slurm ended Slurm job 7 run 0 {state} (reason NonZeroExitCode; no exit of its own); "
        "brought back from its checkpoint (Slurm failure 1 of restart.max_slurm_failures 10)"
    )


@pytest.mark.parametrize(
    "cause",
    [ExitCause.REFUSED, ExitCause.TERMINATED, ExitCause.LAUNCH_FAILED, ExitCause.ABORTED],
)
def test_a_run_refused_or_signalled_is_not_the_jobs_failure(cause: ExitCause) -> None:
    """Refused, signalled, never launched (srun started no task, or the rendezvous failed),
    or killed under an srun that exited 0 (a node failure): brought back, Slurm's budget."""
    failure = rule(slurm_job("FAILED"), exit_record=exit_of(cause))
    assert not failure.users_fault and failure.again
    assert f"its launcher {cause.value}" in failure.message


@pytest.mark.parametrize("cause", [ExitCause.STOPPED, ExitCause.COMPLETED])
def test_a_run_that_stopped_or_completed_by_its_launchers_word_is_no_failure(
    cause: ExitCause,
) -> None:
    assert rule(slurm_job("FAILED"), exit_record=exit_of(cause)) is None


@pytest.mark.parametrize("cause", [ExitCause.FAILED, ExitCause.INVALID])
def test_the_jobs_own_failure_ends_it_without_a_retry_budget(cause: ExitCause) -> None:
    failure = rule(slurm_job("FAILED"), exit_record=exit_of(cause, status=2))
    assert failure.users_fault and not failure.again
    assert failure.message == (
        "its own code failed in Slurm job 7 run 0 (FAILED: exit 2); ended FAILED "
        "(failure 1 of --max-failures 0)"
    )


def test_out_of_memory_is_the_jobs_own_failure_whatever_its_launcher_said() -> None:
    failure = rule(slurm_job("OUT_OF_MEMORY"))
    assert failure.users_fault and not failure.again


def test_max_failures_brings_the_job_back_that_many_times() -> None:
    first = rule(slurm_job("FAILED"), exit_record=exit_of(ExitCause.FAILED), max_failures=2)
    assert first.again and "failure 1 of --max-failures 2" in first.message
    record = RECORD.with_failure(first.run, first.users_fault)
    second = rule(
        slurm_job("FAILED", restarts=1),
        record,
        exit_of(ExitCause.FAILED, restarts=1),
        max_failures=2,
    )
    assert second.again and "failure 2 of --max-failures 2" in second.message
    record = record.with_failure(second.run, second.users_fault)
    third = rule(
        slurm_job("FAILED", restarts=2),
        record,
        exit_of(ExitCause.FAILED, restarts=2),
        max_failures=2,
    )
    assert not third.again and "failure 3 of --max-failures 2" in third.message
    # Seen again (the same run, already counted): the same answer, not one more failure.
    again = rule(slurm_job("FAILED"), record, exit_of(ExitCause.FAILED), max_failures=2)
    assert again.again and "failure 1 of" not in again.message


def test_slurm_failures_have_their_own_budget() -> None:
    record = RECORD
    for restart in range(3):
        failure = rule(slurm_job("NODE_FAIL", restarts=restart), record, max_slurm_failures=2)
        assert failure.again == (restart < 2)
        record = record.with_failure(failure.run, failure.users_fault)
    assert record.slurm_failed_runs == ("7.0", "7.1", "7.2") and record.failed_runs == ()
    assert "Slurm failure 3 of restart.max_slurm_failures 2" in failure.message


def test_an_exit_record_of_another_run_says_nothing_about_this_one() -> None:
    old = exit_of(ExitCause.FAILED, restarts=0)  # the run before: its user's code failed
    failure = rule(slurm_job("FAILED", restarts=1), exit_record=old)
    assert not failure.users_fault and failure.again


def test_bad_exit_records_are_refused_with_the_field() -> None:
    with pytest.raises(ProtocolError, match="cause: expected one of"):
        RunExit("a", "7", 0, "crashed", 1)
    with pytest.raises(ProtocolError, match="not a job id"):
        exit_name("../7", 0)
    with pytest.raises(ProtocolError, match=r"max_failures: expected an integer 0\.\.100"):
        JobSpec("a", "cifar10", max_failures=101)


# ------------------------------------------------------------------------------------------------
# The backend on the fake Slurm


def backend_for(fake: Any, slurm_budget: int = 10) -> SlurmBackend:
    text = CONFIG.format(state_dir=fake.paths.state_dir, slurm_budget=slurm_budget)
    return SlurmBackend(parse_config(text), fake, fake.clock)


def running(fake: Any, max_failures: int = 0, slurm_budget: int = 10) -> tuple[str, Any]:
    """Job ``a`` started by the backend on t4-1 and running there."""
    job_id = fake.submit("a")
    spec = JobSpec("a", "cifar10", max_failures=max_failures)
    write_document(fake.paths.spec("a"), spec)
    backend = backend_for(fake, slurm_budget)
    start = Start(
        "a", 1, Configuration("t4", 1, 1), (NodeShare("t4-1", 1),), BatchChoice(32, 32, 0)
    )
    assert backend.apply([start])[0].ok
    fake.start(job_id, ["t4-1"])
    fake.clear_calls()
    return job_id, backend


def end(fake: Any, job_id: str, state: str) -> None:
    fake.job(job_id).update(job_state=state, state_reason="NonZeroExitCode", gres_detail=[])


def only(backend: SlurmBackend) -> Any:
    (job,) = backend.snapshot().jobs
    return job


def record_of(fake: Any) -> dict[str, Any]:
    return json.loads(fake.paths.slurm_record("a").read_text())


def test_a_run_slurm_ended_is_requeued_held_and_counted_once(
    fake_slurm: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen by pytest also after a test configured the service's logging (no propagation).
    monkeypatch.setattr(logging.getLogger("sia_slurm"), "propagate", True)
    job_id, backend = running(fake_slurm)
    end(fake_slurm, job_id, "FAILED")  # e.g. "Job credential revoked": the launcher never ran
    job = only(backend)
    assert job.phase is JobPhase.PENDING and "brought back" in job.message
    fake_slurm.clear_calls()
    with caplog.at_level(logging.WARNING, logger="sia_slurm.slurm.actuate.enforce"):
        backend.apply([])
    assert fake_slurm.calls == [["scontrol", "requeuehold", job_id], ["scontrol", "hold", job_id]]
    assert any("brought back" in r.getMessage() for r in caplog.records)
    after = fake_slurm.job(job_id)
    assert (after["job_state"], after["state_reason"]) == ("PENDING", "JobHeldAdmin")
    assert record_of(fake_slurm)["slurm_failed_runs"] == [f"{job_id}.0"]
    # Pending under the controller's hold: decided like any pending job, nothing to undo.
    assert only(backend).phase is JobPhase.PENDING
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == []
    assert record_of(fake_slurm)["slurm_failed_runs"] == [f"{job_id}.0"]


def test_the_jobs_own_failure_ends_it_failed_and_nothing_is_requeued(fake_slurm: Any) -> None:
    job_id, backend = running(fake_slurm)
    end(fake_slurm, job_id, "FAILED")
    bad = RunExit("a", job_id, 0, "failed", 1, message="the training command exited with 1")
    write_document(fake_slurm.paths.job_dir("a") / exit_name(job_id, 0), bad)
    job = only(backend)
    assert job.phase is JobPhase.FAILED
    assert job.message.startswith(f"its own code failed in Slurm job {job_id} run 0 (FAILED: the")
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == []
    assert record_of(fake_slurm)["failed_runs"] == []


def test_a_failure_within_max_failures_is_brought_back_then_the_next_one_ends_it(
    fake_slurm: Any,
) -> None:
    job_id, backend = running(fake_slurm, max_failures=1)
    bad = RunExit("a", job_id, 0, "failed", 1)
    write_document(fake_slurm.paths.job_dir("a") / exit_name(job_id, 0), bad)
    end(fake_slurm, job_id, "FAILED")
    assert only(backend).phase is JobPhase.PENDING
    backend.apply([])
    assert record_of(fake_slurm)["failed_runs"] == [f"{job_id}.0"]
    # Run 1 fails the same way: the budget is spent.
    fake_slurm.job(job_id).update(priority=1, state_reason="None")
    fake_slurm.start(job_id, ["t4-1"])
    assert fake_slurm.job(job_id)["restart_cnt"] == 1
    bad = RunExit("a", job_id, 1, "failed", 1)
    write_document(fake_slurm.paths.job_dir("a") / exit_name(job_id, 1), bad)
    end(fake_slurm, job_id, "FAILED")
    job = only(backend)
    assert job.phase is JobPhase.FAILED and "failure 2 of --max-failures 1" in job.message


def test_a_forged_exit_record_is_read_as_none(fake_slurm: Any) -> None:
    """A file that is not a valid record (the user's to write) counts as no exit of its own:
    all a user gains is their own job's Slurm budget."""
    job_id, backend = running(fake_slurm, slurm_budget=0)
    (fake_slurm.paths.job_dir("a") / exit_name(job_id, 0)).write_text('{"cause": 1}')
    end(fake_slurm, job_id, "FAILED")
    job = only(backend)
    assert job.phase is JobPhase.FAILED
    assert "Slurm failure 1 of restart.max_slurm_failures 0" in job.message
