"""The one door through which the controller reads a file that a user can write.

A managed job's directory ``jobs/<sia_id>/`` belongs to the job's user, who may put anything
there: a symlink to ``/etc/shadow``, a FIFO that blocks a reader for ever, a 1 GB file, a file
owned by somebody else (hard-linked in), or swap the directory itself for a symlink between
two looks. So the controller never opens such a path by name. :class:`JobDirectory` opens the
directory once, without following a symlink, and checks on the descriptor that it is a real
directory owned by the Slurm job's user; every file in it is then opened relative to that
descriptor with ``O_NOFOLLOW | O_NONBLOCK`` and checked on its own descriptor: a regular file,
owned by that user, no larger than the cap. Nothing here writes, chmods or removes anything.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from sia_slurm.protocol import (
    Assignment,
    JobSpec,
    MetricsReport,
    ProtocolError,
    RunExit,
    RunRefusal,
    StopRequest,
    check_sia_id,
    from_json,
)
from sia_slurm.safefiles import MAX_FILE_BYTES, READ_FLAGS, parse_json, read_capped

_D = TypeVar("_D", JobSpec, Assignment, MetricsReport, StopRequest, RunExit, RunRefusal)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


class UserFileError(ProtocolError):
    """A user-written file or directory failed a check; the message names it and says why."""


class JobDirectory:
    """``jobs/<sia_id>/`` opened once and checked: a directory owned by ``uid``.

    Use as a context manager; :meth:`read` and :meth:`stat` look only inside it.
    """

    def __init__(self, jobs_dir: Path, sia_id: str, uid: int) -> None:
        self.path = Path(jobs_dir) / check_sia_id(sia_id)
        self.uid = uid
        self._fd = -1
        try:
            self._fd = os.open(self.path, _DIR_FLAGS)
        except FileNotFoundError:
            raise UserFileError(f"{self.path}: does not exist") from None
        except OSError as exc:
            raise UserFileError(f"{self.path}: cannot open: {_why(exc, 'a directory')}") from None
        info = os.fstat(self._fd)
        if info.st_uid != uid:
            self.close()
            raise UserFileError(
                f"{self.path}: owned by uid {info.st_uid}, but the job's Slurm user is uid {uid}"
            )

    def __enter__(self) -> JobDirectory:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def where(self, name: str) -> str:
        return str(self.path / name)

    def stat(self, name: str) -> os.stat_result | None:
        """``lstat`` of ``name`` in the directory; ``None`` if there is none."""
        _check_name(name)
        try:
            return os.stat(name, dir_fd=self._fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UserFileError(f"{self.where(name)}: cannot stat: {_why(exc)}") from None

    def has_own_file(self, name: str) -> bool:
        """Whether ``name`` is a regular file of the job's user (an ack, say): anything else
        there (a symlink, a FIFO, another user's file) counts as absent."""
        info = self.stat(name)
        return info is not None and stat.S_ISREG(info.st_mode) and info.st_uid == self.uid

    def read(self, name: str, *, max_bytes: int = MAX_FILE_BYTES) -> bytes | None:
        """The bytes of ``name``; ``None`` if there is none; :class:`UserFileError` if it is
        not a regular file of the job's user of at most ``max_bytes``."""
        _check_name(name)
        where = self.where(name)
        try:
            fd = os.open(name, READ_FLAGS, dir_fd=self._fd)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise UserFileError(f"{where}: cannot read: {_why(exc)}") from None
        try:
            owner = os.fstat(fd).st_uid
            if owner != self.uid:
                raise UserFileError(
                    f"{where}: owned by uid {owner}, but the job's Slurm user is uid {self.uid}"
                )
            return read_capped(fd, where, max_bytes)
        except ProtocolError as exc:
            raise UserFileError(str(exc)) from None
        finally:
            os.close(fd)

    def read_json(self, name: str) -> dict[str, Any] | None:
        data = self.read(name)
        return None if data is None else parse_json(data, self.where(name))

    def read_document(self, cls: type[_D], name: str) -> _D | None:
        """A validated protocol document, ``None`` if the file is absent."""
        payload = self.read_json(name)
        return None if payload is None else from_json(cls, payload, self.where(name))


def _check_name(name: str) -> None:
    if not name or "/" in name or name in (".", ".."):
        raise UserFileError(f"{name!r}: not a plain file name")


def _why(exc: OSError, expected: str = "a regular file") -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (not followed)"
    if exc.errno == errno.ENOTDIR:
        return f"not {expected}"
    return exc.strerror or str(exc)
