"""Rank 0's view of the controller's files, the metrics report, and the job environment."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sia_slurm.job.elastic.control import ControlFiles, SignalFlags
from sia_slurm.job.elastic.metrics_reporter import MetricsReporter
from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.jobenv import JobEnvironment, JobEnvironmentError
from sia_slurm.protocol import (
    Assignment,
    MetricsReport,
    StatePaths,
    StopRequest,
    read_document,
    write_document,
)


def assignment(round_index: int, **overrides: object) -> Assignment:
    values: dict[str, object] = {
        "sia_id": "job-1",
        "round_index": round_index,
        "gpu_type": "a100",
        "partition": "a100",
        "nodes": 1,
        "gpus": 2,
        "node_list": (),
        "batch_size": 16,
        "local_bsz": 8,
        "accum_steps": 0,
    }
    values.update(overrides)
    return Assignment(**values)  # type: ignore[arg-type]


@pytest.fixture
def files(tmp_path: Path) -> ControlFiles:
    return ControlFiles(
        StatePaths(tmp_path),
        "job-1",
        launch_round=3,
        poll_interval_s=1.0,
        slurm_job_id="41",
        restart_count=2,
    )


def test_stop_request_applies_only_when_later_than_the_launch_and_not_acknowledged(
    tmp_path: Path, files: ControlFiles
) -> None:
    paths = StatePaths(tmp_path)
    assert files.pending_stop() is None
    write_document(paths.stop_request("job-1"), StopRequest("job-1", 3))
    assert files.pending_stop() is None  # the stop that preceded this start
    write_document(paths.stop_request("job-1"), StopRequest("job-1", 4))
    stop = files.pending_stop()
    assert stop is not None and stop.round_index == 4
    ack = files.write_ack(4)
    assert ack == paths.ack("job-1", 4, "41", 2) and ack.read_bytes() == b""
    assert ack.name == "ack-4.41.2"  # names the run that wrote it
    assert files.pending_stop() is None
    assert not list(ack.parent.glob(".*.tmp"))


def test_bad_or_foreign_stop_files_are_ignored_with_one_warning(
    tmp_path: Path, files: ControlFiles, caplog: pytest.LogCaptureFixture
) -> None:
    path = StatePaths(tmp_path).stop_request("job-1")
    path.parent.mkdir(parents=True)
    path.write_text('{"sia_id": "job-1", "round_index": "soon"}')
    assert files.pending_stop() is None
    assert files.pending_stop() is None
    assert caplog.text.count("round_index: expected int") == 1
    write_document(path, StopRequest("job-2", 9))
    assert files.pending_stop() is None
    assert "not this job's" in caplog.text


def test_new_assignment_is_reported_once_and_only_when_later(
    tmp_path: Path, files: ControlFiles
) -> None:
    path = StatePaths(tmp_path).assignment("job-1")
    write_document(path, assignment(3))
    assert files.new_assignment(current_round=3) is None
    write_document(path, assignment(5, batch_size=32, local_bsz=16))
    new = files.new_assignment(current_round=3)
    assert new is not None and new.round_index == 5 and new.local_bsz == 16
    assert files.new_assignment(current_round=3) is None  # unchanged file: not read again


def test_an_assignment_hands_the_job_over_when_it_names_another_run_or_other_nodes(
    tmp_path: Path,
) -> None:
    files = ControlFiles(
        StatePaths(tmp_path), "job-1", 3, 1.0, slurm_job_id="41", restart_count=2,
        hostnames=("rtx-1", "rtx-2"),
    )  # fmt: skip
    run = {"slurm_job_id": "41", "slurm_restart_count": 2, "nodes": 2, "gpus": 2}
    assert not files.supersedes(assignment(5, node_list=("rtx-2", "rtx-1"), **run))  # a rebatch
    assert not files.supersedes(assignment(5, node_list=(), **run))
    assert not files.supersedes(assignment(5))  # names no run
    assert files.supersedes(assignment(5, node_list=("a100-1", "a100-2"), **run))
    assert files.supersedes(assignment(5, **{**run, "slurm_restart_count": 3}))
    standalone = ControlFiles(StatePaths(tmp_path), "job-1", 3, 1.0, slurm_job_id="",
                              restart_count=0)  # fmt: skip
    assert not standalone.supersedes(assignment(5, node_list=("a100-1", "a100-2"), **run))


def test_polls_are_rate_limited_unless_woken() -> None:
    now = [100.0]
    files = ControlFiles(
        StatePaths(Path("/nonexistent")),
        "j",
        0,
        1.0,
        clock=lambda: now[0],
        slurm_job_id="41",
        restart_count=0,
    )
    assert files.due()
    now[0] += 0.5
    assert not files.due()
    assert files.due(wake=True)
    now[0] += 1.0
    assert files.due()


def test_signal_flags_record_without_acting() -> None:
    flags = SignalFlags()
    flags.install()
    try:
        os.kill(os.getpid(), 10)  # SIGUSR1
        os.kill(os.getpid(), 15)  # SIGTERM: recorded, the process lives on
        assert flags.wake and flags.terminate == 15
    finally:
        flags.uninstall()


def test_metrics_report_is_a_valid_protocol_document(make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env(gpus=2, batch_size=16, local_bsz=4, accum_steps=1, slurm_job_id="41", restarts=2)
    now = [1000.0]
    reporter = MetricsReporter(env, interval_s=30, clock=lambda: now[0])
    noise = GradientNoise(8, decay=0.0)
    noise.observe(1.0, 2.0, 4, 4)
    assert reporter.report(steps=0, local_bsz=4, accum_steps=1, round_index=1, noise=noise) is None
    reporter.record(0.30, 0.10, 4, 1)
    reporter.record(0.50, 0.20, 4, 1)
    assert not reporter.due()
    now[0] += 30
    assert reporter.due()
    report = reporter.report(steps=7, local_bsz=4, accum_steps=1, round_index=2, noise=noise)
    assert report is not None
    path = StatePaths(env.state_dir).metrics("job-1")
    assert path == env.state_dir / "jobs" / "job-1" / "metrics.json"  # the job's own directory
    on_disk = read_document(MetricsReport, path)
    assert on_disk == report
    # The run that wrote it (SLURM_JOB_ID, SLURM_RESTART_COUNT): the controller takes only
    # its current run's reports.
    assert (report.slurm_job_id, report.slurm_restart_count) == ("41", 2)
    assert (report.step_time, report.sync_time) == pytest.approx((0.4, 0.15))
    assert (report.gpu_type, report.nodes, report.gpus, report.steps) == ("a100", 1, 2, 7)
    assert (report.grad_sqr, report.grad_var) == (noise.grad_sqr, noise.grad_var)
    assert report.round_index == 2
    # the window restarts; the profile keeps everything, and survives a checkpoint
    assert reporter.report(steps=7, local_bsz=4, accum_steps=1, round_index=2, noise=noise) is None
    rows = reporter.profile_state()
    assert rows == [["a100", 1, 2, 4, 1, 2, pytest.approx(0.8), pytest.approx(0.3)]]
    other = MetricsReporter(env)
    other.load_profile_state(rows)
    assert other.profile_state() == rows


def test_job_environment_round_trips_through_variables(tmp_path: Path, make_env) -> None:  # type: ignore[no-untyped-def]
    env = make_env()
    variables = env.to_env()
    assert variables["SIA_LOCAL_BSZ"] == "4" and variables["SIA_LAUNCH_ROUND"] == "1"
    assert JobEnvironment.from_env(variables) == env
    del variables["SIA_GPU_TYPE"]
    with pytest.raises(JobEnvironmentError, match="SIA_GPU_TYPE: not set"):
        JobEnvironment.from_env(variables)
    variables = env.to_env() | {"SIA_GPUS": "two"}
    with pytest.raises(JobEnvironmentError, match="SIA_GPUS: expected an integer, got 'two'"):
        JobEnvironment.from_env(variables)
    with pytest.raises(JobEnvironmentError, match="SIA_BATCH_SIZE: 9 != gpus"):
        make_env(batch_size=9)
    with pytest.raises(JobEnvironmentError, match="SIA_LINGER_S: expected seconds > 0"):
        make_env(linger_s=0.0)
