"""The one door through which the controller reads a user's files (``sia_slurm.userfiles``),
and the protocol's own reader: nothing a user plants in a job directory (a symlink, a FIFO, a
huge file, another account's file, a swapped directory) is followed, blocks, or is read."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.protocol import JobSpec, ProtocolError, read_document, write_document
from sia_slurm.safefiles import read_json
from sia_slurm.userfiles import JobDirectory, UserFileError

ME = os.geteuid()
OTHER_UID = 4242


@pytest.fixture
def jobs(tmp_path: Path) -> Path:
    """``jobs/`` with one job directory ``a`` of this account, holding a valid spec."""
    directory = tmp_path / "jobs"
    (directory / "a").mkdir(parents=True)
    write_document(directory / "a" / "spec.json", JobSpec("a", "cifar10"))
    return directory


def promptly(call: Callable[[], Any], fifo: Path | None = None, limit_s: float = 5.0) -> Any:
    """``call()``'s result or exception, failing the test if it takes longer than ``limit_s``
    (a reader blocked on ``fifo`` is let go first, so the test run never hangs)."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the test
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(limit_s)
    if thread.is_alive():
        if fifo is not None:
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # unblock the reader
            thread.join(5.0)
        pytest.fail(f"blocked for more than {limit_s} s")
    assert time.monotonic() - started < limit_s
    if "error" in outcome:
        raise outcome["error"]
    return outcome.get("value")


def test_a_regular_file_of_the_jobs_user_is_read(jobs: Path) -> None:
    with JobDirectory(jobs, "a", ME) as directory:
        assert directory.read_document(JobSpec, "spec.json") == JobSpec("a", "cifar10")
        assert directory.read("metrics.json") is None  # absent is not an error
        assert directory.read_document(JobSpec, "nothing.json") is None
        assert directory.has_own_file("spec.json")
        assert not directory.has_own_file("ack-3")


def test_a_symlinked_file_is_not_followed(jobs: Path, tmp_path: Path) -> None:
    target = tmp_path / "secret.json"
    write_document(target, JobSpec("a", "bert"))
    (jobs / "a" / "spec.json").unlink()
    (jobs / "a" / "spec.json").symlink_to(target)
    (jobs / "a" / "ack-3").symlink_to(target)
    with JobDirectory(jobs, "a", ME) as directory:
        with pytest.raises(UserFileError, match=r"spec\.json: cannot read: is a symbolic link"):
            directory.read("spec.json")
        assert not directory.has_own_file("ack-3")  # a symlink is no acknowledgement
    with pytest.raises(ProtocolError, match="is a symbolic link \\(not followed\\)"):
        read_json(jobs / "a" / "spec.json")


def test_a_symlinked_job_directory_is_refused(jobs: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere"
    real.mkdir()
    write_document(real / "spec.json", JobSpec("b", "cifar10"))
    (jobs / "b").symlink_to(real)
    with pytest.raises(UserFileError, match=f"{jobs / 'b'}: cannot open: not a directory"):
        JobDirectory(jobs, "b", ME)
    (jobs / "c").write_text("")
    with pytest.raises(UserFileError, match="cannot open: not a directory"):
        JobDirectory(jobs, "c", ME)
    with pytest.raises(UserFileError, match=f"{jobs / 'd'}: does not exist"):
        JobDirectory(jobs, "d", ME)


def test_a_directory_swapped_after_it_was_opened_is_not_seen(jobs: Path, tmp_path: Path) -> None:
    """Every file is opened relative to the directory opened and checked at first."""
    decoy = tmp_path / "decoy"
    decoy.mkdir()
    write_document(decoy / "spec.json", JobSpec("a", "bert"))
    with JobDirectory(jobs, "a", ME) as directory:
        os.rename(jobs / "a", tmp_path / "moved")
        (jobs / "a").symlink_to(decoy)
        spec = directory.read_document(JobSpec, "spec.json")
    assert spec is not None and spec.app == "cifar10"


def test_a_fifo_does_not_block_the_reader(jobs: Path) -> None:
    fifo = jobs / "a" / "spec.json"
    fifo.unlink()
    os.mkfifo(fifo)
    os.mkfifo(jobs / "a" / "ack-3")
    with JobDirectory(jobs, "a", ME) as directory:
        with pytest.raises(UserFileError, match=r"spec\.json: not a regular file"):
            promptly(lambda: directory.read("spec.json"), fifo)
        assert not directory.has_own_file("ack-3")
    with pytest.raises(ProtocolError, match=r"spec\.json: not a regular file"):
        promptly(lambda: read_document(JobSpec, fifo), fifo)


def test_a_file_of_another_account_is_refused(jobs: Path) -> None:
    """E.g. another user's file hard-linked into the job's directory."""
    os.chown(jobs / "a" / "spec.json", OTHER_UID, OTHER_UID)
    (jobs / "a" / "ack-3").write_text("")
    os.chown(jobs / "a" / "ack-3", OTHER_UID, OTHER_UID)
    with JobDirectory(jobs, "a", ME) as directory:
        with pytest.raises(
            UserFileError,
            match=f"spec.json: owned by uid {OTHER_UID}, but the job's Slurm user is uid {ME}",
        ):
            directory.read("spec.json")
        assert not directory.has_own_file("ack-3")


def test_a_job_directory_of_another_account_is_refused(jobs: Path) -> None:
    os.chown(jobs / "a", OTHER_UID, OTHER_UID)
    with pytest.raises(
        UserFileError,
        match=f"{jobs / 'a'}: owned by uid {OTHER_UID}, but the job's Slurm user is uid {ME}",
    ):
        JobDirectory(jobs, "a", ME)
    with (  # that account's job: its directory, but not its spec
        JobDirectory(jobs, "a", OTHER_UID) as directory,
        pytest.raises(UserFileError, match=f"owned by uid {ME}"),
    ):
        directory.read("spec.json")


def test_an_oversized_file_is_refused_without_reading_it(jobs: Path) -> None:
    big = jobs / "a" / "metrics.json"
    with open(big, "wb") as handle:
        handle.truncate(1 << 30)  # 1 GB, sparse
    with JobDirectory(jobs, "a", ME) as directory:
        with pytest.raises(UserFileError, match=r"metrics\.json: larger than 65536 bytes"):
            promptly(lambda: directory.read("metrics.json"), limit_s=2.0)
        assert directory.read("spec.json") is not None  # the cap is per file
        with pytest.raises(UserFileError, match=r"spec\.json: larger than 10 bytes"):
            directory.read("spec.json", max_bytes=10)
    with pytest.raises(ProtocolError, match="larger than 65536 bytes"):
        promptly(lambda: read_json(big), limit_s=2.0)


@pytest.mark.parametrize("name", ["../a/spec.json", "a/spec.json", "/etc/passwd", ".", "..", ""])
def test_only_plain_names_are_looked_up(jobs: Path, name: str) -> None:
    with JobDirectory(jobs, "a", ME) as directory:
        with pytest.raises(UserFileError, match="not a plain file name"):
            directory.read(name)
        with pytest.raises(UserFileError, match="not a plain file name"):
            directory.has_own_file(name)


def test_a_directory_where_a_file_belongs_is_refused(jobs: Path) -> None:
    (jobs / "a" / "metrics.json").mkdir()
    with (
        JobDirectory(jobs, "a", ME) as directory,
        pytest.raises(UserFileError, match=r"metrics\.json: not a regular file"),
    ):
        directory.read("metrics.json")


def test_the_sia_id_is_checked_before_any_path_is_made(jobs: Path) -> None:
    with pytest.raises(ProtocolError, match="sia job id"):
        JobDirectory(jobs, "../jobs/a", ME)
