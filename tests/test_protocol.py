"""The job protocol documents: round trips, atomic writes, and errors that name file and field."""

from __future__ import annotations

import json
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

from sia_slurm.core import JobKind
from sia_slurm.protocol import (
    Assignment,
    JobSpec,
    MetricsReport,
    ProtocolError,
    StatePaths,
    StopRequest,
    check_sia_id,
    read_document,
    write_document,
)
from sia_slurm.safefiles import (
    MAX_FILE_BYTES,
    write_bytes_atomic,
    write_json_atomic,
    write_text_atomic,
)


def _report(**overrides: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "sia_id": "j1",
        "time": 10.0,
        "gpu_type": "a100",
        "nodes": 1,
        "gpus": 2,
        "local_bsz": 64,
        "accum_steps": 0,
        "step_time": 0.2,
        "sync_time": 0.05,
        "grad_sqr": 1.5,
        "grad_var": 3.0,
    }
    payload.update(overrides)
    return payload


def test_documents_round_trip(tmp_path: Path) -> None:
    paths = StatePaths(tmp_path)
    spec = JobSpec(
        "j1", "cifar10", kind=JobKind.RIGID, requested_gpus=4, command=("python", "t.py")
    )
    assignment = Assignment(
        "j1", 3, "rtx", "rtx", 2, 4, ("rtx-1", "rtx-2"), 512, 64, 1,
        slurm_job_id="41", slurm_restart_count=2,
    )  # fmt: skip
    report = MetricsReport(**_report(slurm_job_id="41", slurm_restart_count=2))  # type: ignore[arg-type]
    stop = StopRequest("j1", 3, 12.5)
    for path, document in [
        (paths.spec("j1"), spec),
        (paths.assignment("j1"), assignment),
        (paths.metrics("j1"), report),
        (paths.stop_request("j1"), stop),
    ]:
        write_document(path, document)
        assert read_document(type(document), path) == document
    assert assignment.gpus_per_node == 2
    assert json.loads(paths.spec("j1").read_text())["kind"] == "rigid"


def test_two_trees_by_who_writes_them(tmp_path: Path) -> None:
    """The controller's files under control/<id>/, the job user's under jobs/<id>/."""
    paths = StatePaths(tmp_path)
    control, job = tmp_path / "control" / "j1", tmp_path / "jobs" / "j1"
    assert paths.control("j1") == control and paths.job_dir("j1") == job
    assert paths.assignment("j1") == control / "assignment.json"
    assert paths.stop_request("j1") == control / "stop.json"
    assert paths.slurm_record("j1") == control / "slurm.json"
    assert paths.batch_copy("j1") == control / "batch-script"
    assert paths.spec("j1") == job / "spec.json"
    assert paths.ack("j1", 7, "41", 2) == job / "ack-7.41.2"
    assert paths.metrics("j1") == job / "metrics.json"
    with pytest.raises(ProtocolError, match="sia job id"):
        paths.control("../jobs/j1")


def test_atomic_write_leaves_no_temporary_files(tmp_path: Path) -> None:
    path = StatePaths(tmp_path).stop_request("j1")
    for round_index in range(5):
        write_document(path, StopRequest("j1", round_index))
    assert sorted(os.listdir(path.parent)) == ["stop.json"]


@pytest.fixture
def planted_names(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Make mkstemp's random names predictable ("planted", then "fresh", "fresh2"...); the
    list is of the names it tried."""
    tried: list[str] = []

    def candidates() -> Iterator[str]:
        for name in ["planted", "fresh", *(f"fresh{i}" for i in range(2, 50))]:
            tried.append(name)
            yield name

    monkeypatch.setattr(tempfile, "_get_candidate_names", candidates)
    yield tried


def test_atomic_write_never_follows_a_planted_symlink(
    tmp_path: Path, planted_names: list[str]
) -> None:
    """Someone who can write the directory plants symlinks at the temporary name and at the
    file's own name: neither target is written, and the file is the new content."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    directory = tmp_path / "control"
    directory.mkdir()
    (directory / ".assignment.json.planted.tmp").symlink_to(victim)
    (directory / "assignment.json").symlink_to(victim)
    write_json_atomic(directory / "assignment.json", {"round_index": 3}, mode=0o640)
    assert victim.read_text() == "precious\n"
    target = directory / "assignment.json"
    assert not target.is_symlink() and json.loads(target.read_text()) == {"round_index": 3}
    assert stat.S_IMODE(target.stat().st_mode) == 0o640
    assert planted_names == ["planted", "fresh"]  # the planted name was refused, not used
    assert (directory / ".assignment.json.planted.tmp").is_symlink()  # not ours: left alone
    assert sorted(p.name for p in directory.iterdir()) == [
        ".assignment.json.planted.tmp",
        "assignment.json",
    ]


@pytest.mark.parametrize("mode", [0o600, 0o644, 0o755])
def test_atomic_write_sets_the_mode_on_the_descriptor(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: int
) -> None:
    """The exact mode whatever the umask, and never a chmod by path (which a swapped name
    would redirect)."""

    def no_chmod(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"chmod by path: {args}")

    monkeypatch.setattr(os, "chmod", no_chmod)
    monkeypatch.setattr(Path, "chmod", no_chmod)
    old = os.umask(0o077)
    try:
        write_text_atomic(tmp_path / "batch.sh", "#!/bin/sh\n", mode=mode)
        write_document(tmp_path / "stop.json", StopRequest("j1", 2))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "batch.sh").stat().st_mode) == mode
    assert stat.S_IMODE((tmp_path / "stop.json").stat().st_mode) == 0o644  # the default


def test_bytes_write_without_a_mode_is_owner_only_and_a_failed_write_keeps_the_old_file(
    tmp_path: Path,
) -> None:
    """``mode=None`` (checkpoints) keeps mkstemp's 0600 whatever the umask; a write that raises
    part-way leaves the previous content and no temporary file."""
    target = tmp_path / "ckpt.pt"
    old = os.umask(0o000)
    try:
        write_bytes_atomic(target, b"first", mode=None)
    finally:
        os.umask(old)
    assert stat.S_IMODE(target.stat().st_mode) == 0o600

    def dies_half_way(handle: IO[bytes], data: bytes | memoryview) -> None:
        handle.write(data[:2])
        raise OSError("disk gone")

    with pytest.raises(OSError, match="disk gone"):
        write_bytes_atomic(target, b"second", mode=None, write=dies_half_way)
    assert target.read_bytes() == b"first"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.pt"]


def test_the_reader_follows_no_symlink_and_reads_no_fifo(tmp_path: Path) -> None:
    real = tmp_path / "real.json"
    write_document(real, StopRequest("j1", 2))
    (tmp_path / "link.json").symlink_to(real)
    with pytest.raises(ProtocolError, match=r"link\.json: cannot read: is a symbolic link"):
        read_document(StopRequest, tmp_path / "link.json")
    os.mkfifo(tmp_path / "fifo.json")  # opened without blocking, then refused
    with pytest.raises(ProtocolError, match=r"fifo\.json: not a regular file"):
        read_document(StopRequest, tmp_path / "fifo.json")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"step_time": -1.0}, "step_time"),
        ({"sync_time": 0.3}, "sync_time"),
        ({"grad_var": float("nan")}, "grad_var"),
        ({"nodes": 3}, "nodes"),
        ({"local_bsz": "64"}, "local_bsz: expected int"),
        ({"extra": 1}, "unknown field(s) extra"),
        ({"version": 99}, "version"),
        ({"sia_id": "../etc"}, "sia job id"),
        ({"slurm_restart_count": -1}, "slurm_restart_count: expected >= 0, got -1"),
        ({"slurm_job_id": 41}, "slurm_job_id: expected str"),
    ],
)
def test_bad_metrics_name_the_file_and_the_field(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps(_report(**overrides)))
    with pytest.raises(ProtocolError) as excinfo:
        read_document(MetricsReport, path)
    assert str(path) in str(excinfo.value)
    assert message in str(excinfo.value)


def test_missing_field_is_named(tmp_path: Path) -> None:
    payload = _report()
    del payload["step_time"]
    path = tmp_path / "m.json"
    path.write_text(json.dumps(payload))
    with pytest.raises(ProtocolError, match="step_time: missing"):
        read_document(MetricsReport, path)


def test_not_json_too_large_and_missing(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ProtocolError, match="not valid JSON"):
        read_document(MetricsReport, bad)
    big = tmp_path / "big.json"
    big.write_text(" " * (MAX_FILE_BYTES + 1))
    with pytest.raises(ProtocolError, match="larger than"):
        read_document(MetricsReport, big)
    with pytest.raises(ProtocolError, match="cannot read"):
        read_document(MetricsReport, tmp_path / "absent.json")
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(ProtocolError, match="expected a JSON object"):
        read_document(MetricsReport, listed)


def test_assignment_batch_must_add_up() -> None:
    with pytest.raises(ProtocolError, match="batch_size"):
        Assignment("j1", 0, "t4", "t4", 1, 2, (), 100, 32, 0)
    with pytest.raises(ProtocolError, match="slurm_restart_count: expected integers >= 0"):
        Assignment("j1", 0, "t4", "t4", 1, 2, (), 64, 32, 0, slurm_restart_count=-1)
    with pytest.raises(ProtocolError, match="node_list"):
        Assignment("j1", 0, "t4", "t4", 2, 4, ("t4-1",), 128, 32, 0)


def test_spec_limits() -> None:
    with pytest.raises(ProtocolError, match="max_gpus"):
        JobSpec("j1", "bert", min_gpus=4, max_gpus=2)
    with pytest.raises(ProtocolError, match="init_batch_size"):
        JobSpec("j1", "bert", init_batch_size=512, max_batch_size=256)
    with pytest.raises(ValueError):
        JobSpec("j1", "bert", kind="elastic")  # type: ignore[arg-type]


@pytest.mark.parametrize("good", ["j1", "s1700000000000-ab12", "a.b_c-d"])
def test_sia_ids_accepted(good: str) -> None:
    assert check_sia_id(good) == good


@pytest.mark.parametrize("bad", ["", "../x", "a/b", ".hidden", "x" * 65, "sp ace"])
def test_sia_ids_refused(bad: str) -> None:
    with pytest.raises(ProtocolError):
        check_sia_id(bad)
