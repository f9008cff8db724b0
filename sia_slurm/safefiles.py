"""Files written atomically and read without following a link: the floor under the job protocol.

Both sides of :mod:`sia_slurm.protocol` and the controller's own trees write through
:func:`write_text_atomic` (temporary file beside the target, fsync, rename: a reader sees the
old or the new content, never a torn one) and read through :func:`read_json` /
:func:`read_capped` (no symlink followed, no FIFO blocked on, no unbounded read), so a file a
user can swap is never trusted by path. Only the standard library: a job process imports it.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

MAX_FILE_BYTES = 64 * 1024  # no protocol file is legitimately larger


class ProtocolError(ValueError):
    """A protocol file is missing, too large, not JSON, or has a bad field."""


def write_json_atomic(path: Path, payload: Mapping[str, Any], *, mode: int = 0o644) -> None:
    """Write ``payload`` as JSON to ``path`` atomically (temp file beside it, fsync, rename)."""
    text = json.dumps(payload, indent=1, sort_keys=True) + "\n"
    write_text_atomic(path, text, mode=mode)


def write_text_atomic(path: Path, text: str, *, mode: int = 0o644) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically with ``mode``."""
    write_bytes_atomic(path, text.encode("utf-8"), mode=mode)


def write_bytes_atomic(
    path: Path,
    data: bytes | memoryview,
    *,
    mode: int | None = 0o644,
    write: Callable[[IO[bytes], bytes | memoryview], None] | None = None,
) -> None:
    """Write ``data`` to ``path`` atomically: a temporary file beside it, fsync, rename.

    The temporary file is created exclusively (``mkstemp``: never through a planted symlink)
    and its mode set on the open descriptor, never by path, so nothing another account swaps
    into the directory can redirect the write or the chmod. ``mode=None`` keeps mkstemp's
    owner-only 0600 (checkpoints). ``write`` replaces the raw write (the crash tests' seam).
    """
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, exist_ok=True)
        chmod_dir(path.parent, 0o755)  # readable by the job's user whatever the umask
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            if mode is not None:
                os.fchmod(handle.fileno(), mode)
            if write is None:
                handle.write(data)
            else:
                write(handle, data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def chmod_dir(path: Path, mode: int) -> None:
    """chmod a directory through a descriptor opened without following a symlink."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


def read_capped(fd: int, where: str, max_bytes: int) -> bytes:
    """The bytes of the open file ``fd``: a regular file of at most ``max_bytes``.

    Checked on the descriptor (``fstat``), so a FIFO, a device or a huge file is refused
    without a blocking or unbounded read.
    """
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise ProtocolError(f"{where}: not a regular file")
    if info.st_size > max_bytes:
        raise ProtocolError(f"{where}: larger than {max_bytes} bytes")
    data = os.read(fd, max_bytes + 1)
    if len(data) > max_bytes:
        raise ProtocolError(f"{where}: larger than {max_bytes} bytes")
    return data


def read_json(path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> dict[str, Any]:
    """The JSON object in ``path``; :class:`ProtocolError` (naming the file) otherwise.

    The last component is never followed if it is a symlink, and a FIFO never blocks."""
    try:
        fd = os.open(path, READ_FLAGS)
    except OSError as exc:
        raise ProtocolError(f"{path}: cannot read: {_why(exc)}") from None
    try:
        data = read_capped(fd, str(path), max_bytes)
    finally:
        os.close(fd)
    return parse_json(data, str(path))


def parse_json(data: bytes, where: str) -> dict[str, Any]:
    """The JSON object in ``data`` (read from ``where``)."""
    try:
        payload = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ProtocolError(f"{where}: expected a JSON object, got {type(payload).__name__}")
    return payload


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (not followed)"
    return exc.strerror or str(exc)
