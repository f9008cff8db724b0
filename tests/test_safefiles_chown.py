"""chown and chmod through a descriptor (sia_slurm.safefiles): never through a planted symlink.

The chown tests hand files to another uid, so they need root (as the suite runs)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from sia_slurm.safefiles import chmod_dir, chmod_path, chown_path

OTHER = 4242


def owner(path: Path) -> tuple[int, int]:
    info = os.lstat(path)
    return info.st_uid, info.st_gid


def test_chowns_a_directory_and_a_file(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir()
    file = tmp_path / "f"
    file.write_text("x")
    chown_path(directory, OTHER, OTHER + 1, directory=True)
    chown_path(file, OTHER, OTHER + 1, directory=False)
    assert owner(directory) == (OTHER, OTHER + 1)
    assert owner(file) == (OTHER, OTHER + 1)
    assert file.read_text() == "x"


def test_touch_creates_a_missing_file_and_keeps_an_existing_one(tmp_path: Path) -> None:
    created = tmp_path / "new.log"
    chown_path(created, OTHER, OTHER, directory=False, touch=True)
    assert created.is_file() and owner(created) == (OTHER, OTHER)
    existing = tmp_path / "old.log"
    existing.write_text("kept")
    os.utime(existing, (0, 0))
    chown_path(existing, OTHER, OTHER, directory=False, touch=True)
    assert existing.read_text() == "kept" and owner(existing) == (OTHER, OTHER)
    assert existing.stat().st_mtime > 0  # its times updated, as Path.touch does


def test_chmods_a_directory_and_a_file(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    file = tmp_path / "f"
    file.write_text("x")
    chmod_dir(directory, 0o751)
    chmod_path(file, 0o640, directory=False)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o751
    assert stat.S_IMODE(file.stat().st_mode) == 0o640


@pytest.mark.parametrize("directory", [True, False])
def test_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path, directory: bool) -> None:
    target = tmp_path / "target"
    if directory:
        target.mkdir(mode=0o700)
    else:
        target.write_text("x")
        target.chmod(0o600)
    before = os.stat(target)
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(OSError):
        chown_path(link, OTHER, OTHER, directory=directory)
    with pytest.raises(OSError):
        chown_path(link, OTHER, OTHER, directory=directory, touch=not directory)
    with pytest.raises(OSError):
        chmod_path(link, 0o777, directory=directory)
    after = os.stat(target)
    assert (after.st_uid, after.st_gid, after.st_mode) == (
        before.st_uid,
        before.st_gid,
        before.st_mode,
    )


def test_a_dangling_symlink_is_refused_and_nothing_created(tmp_path: Path) -> None:
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(OSError):
        chown_path(link, OTHER, OTHER, directory=False, touch=True)
    assert not (tmp_path / "missing").exists()


def test_a_file_where_a_directory_is_expected_is_refused(tmp_path: Path) -> None:
    file = tmp_path / "f"
    file.write_text("x")
    before = os.stat(file)
    with pytest.raises(NotADirectoryError):
        chown_path(file, OTHER, OTHER, directory=True)
    with pytest.raises(NotADirectoryError):
        chmod_dir(file, 0o777)
    assert os.stat(file) == before


def test_a_directory_or_fifo_where_a_file_is_expected_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "d"
    directory.mkdir(mode=0o700)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo, 0o600)
    for path in (directory, fifo):
        before = os.stat(path)
        with pytest.raises(OSError, match="not a regular file"):
            chown_path(path, OTHER, OTHER, directory=False)
        with pytest.raises(OSError, match="not a regular file"):
            chmod_path(path, 0o777, directory=False)
        assert os.stat(path) == before
    with pytest.raises(IsADirectoryError):  # refused by the open itself (O_WRONLY)
        chown_path(directory, OTHER, OTHER, directory=False, touch=True)
