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
import re
import stat
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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
    chmod_path(path, mode, directory=True)


def chmod_path(path: Path, mode: int, *, directory: bool) -> None:
    """chmod ``path`` (a directory if ``directory``, else a regular file) through a descriptor.

    See :func:`open_checked`: a symlink (or anything other than what is expected) planted at
    ``path`` is refused with :class:`OSError`, never followed."""
    fd = open_checked(path, directory=directory)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def chown_path(path: Path, uid: int, gid: int, *, directory: bool, touch: bool = False) -> None:
    """chown ``path`` (a directory if ``directory``, else a regular file) through a descriptor.

    A chown by path follows a symlink, so one that another account plants at ``path`` between
    our check (or mkdir) and the call would hand root's chown any file on the machine (say
    ``/etc``). See :func:`open_checked`; ``touch`` creates a missing file first and updates its
    times, as :meth:`Path.touch` does, never through a symlink either."""
    fd = open_checked(path, directory=directory, create=touch)
    try:
        if touch:
            os.utime(fd)
        os.fchown(fd, uid, gid)
    finally:
        os.close(fd)


def open_checked(path: Path, *, directory: bool, create: bool = False) -> int:
    """A descriptor (close it) on ``path``, which must be a directory if ``directory``, else a
    regular file; :class:`OSError` otherwise.

    The last component is never followed if it is a symlink (``O_NOFOLLOW``: ``ELOOP``), a FIFO
    never blocks the open (``O_NONBLOCK``), and what was opened is checked with ``fstat``, so a
    chown or chmod on the descriptor reaches exactly what was checked, whatever another account
    swaps in at ``path`` meanwhile. ``create`` (files only): create a missing file, mode 0666
    less the umask, as :meth:`Path.touch` does."""
    flags = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    if directory:
        if create:
            raise ValueError("open_checked: create is for files, not directories")
        flags |= os.O_RDONLY | os.O_DIRECTORY
    elif create:
        flags |= os.O_WRONLY | os.O_CREAT
    else:
        flags |= os.O_RDONLY
    fd = os.open(path, flags, 0o666)
    try:
        kind = os.fstat(fd).st_mode
        if directory and not stat.S_ISDIR(kind):
            raise OSError(errno.ENOTDIR, "not a directory", str(path))
        if not directory and not stat.S_ISREG(kind):
            raise OSError(
                errno.EISDIR if stat.S_ISDIR(kind) else errno.EINVAL,
                "not a regular file",
                str(path),
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


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


# The bounds of every JSON document read through here (``docs/protocol.md``, "Bounds"): no
# protocol file is nested deeper than a list in an object, counts past 2**63, holds a string
# longer than a path or a list longer than a command line. A value past them is refused by the
# reader, never met later by the model, the solver or a terminal.
MAX_DEPTH = 8
MAX_INT_DIGITS = 19  # |n| < 10**19: every int64 and no more
MAX_FLOAT = 1e300  # finite, with room to multiply by a count without overflowing
MAX_STRING_CHARS = 4096  # a path (PATH_MAX) or one argument
MAX_ITEMS = 1024  # keys of one object, items of one list
# Control characters (C0 but tab and newline, DEL, C1): escape sequences for a terminal,
# carriage returns that overwrite a log line. Tab and newline may appear in a command's
# arguments and an exit message; every reader prints strings escaped (``sia_slurm.text``).
# And lone surrogates (a JSON "\ud800"): no UTF-8 holds one, so a message quoting it could not
# be stored (sqlite raises), which failed every round's commit (found by hypothesis).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")


def parse_json(data: bytes, where: str) -> dict[str, Any]:
    """The JSON object in ``data`` (read from ``where``), within the bounds above.

    Whatever is wrong with the bytes is a :class:`ProtocolError` naming ``where`` and, inside
    the document, the path of the bad value (``command[3]``); nothing else escapes: not
    Python's 4300-digit limit on ``int()``, not a ``RecursionError`` from deep nesting, not a
    float that parses to infinity.
    """
    try:
        payload = json.loads(data, parse_int=_bounded_int, parse_constant=float)
    except RecursionError:
        raise ProtocolError(f"{where}: nested deeper than {MAX_DEPTH} levels") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError and whatever else it refuses
        raise ProtocolError(f"{where}: not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise ProtocolError(f"{where}: expected a JSON object, got {type(payload).__name__}")
    problem = out_of_bounds(payload)
    if problem:
        raise ProtocolError(f"{where}: {problem}")
    return payload


@dataclass(frozen=True)
class _LongInteger:
    """An integer literal of too many digits, left unconverted (``int()`` of a long one is
    quadratic, and past 4300 digits it raises); :func:`out_of_bounds` names where it was."""

    digits: int


def _bounded_int(text: str) -> int | _LongInteger:
    digits = len(text.lstrip("-"))
    return _LongInteger(digits) if digits > MAX_INT_DIGITS else int(text)


def out_of_bounds(document: Any) -> str:
    """Why ``document`` (a parsed JSON value) is past the bounds, naming the path of the bad
    value; ``""`` if it is within them. Walks the document without recursion."""
    stack: list[tuple[Any, str, int]] = [(document, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > MAX_DEPTH:
                return f"{path or 'document'}: nested deeper than {MAX_DEPTH} levels"
            if len(value) > MAX_ITEMS:
                return f"{path or 'document'}: {len(value)} items (at most {MAX_ITEMS})"
            if isinstance(value, dict):
                for key, item in value.items():
                    problem = _string_problem(key)
                    if problem:
                        return f"{path or 'document'}: a key {problem}"
                    stack.append((item, f"{path}.{key}" if path else key, depth + 1))
            else:
                stack.extend((item, f"{path}[{i}]", depth + 1) for i, item in enumerate(value))
        elif isinstance(value, str):
            problem = _string_problem(value)
            if problem:
                return f"{path}: {problem}"
        elif isinstance(value, _LongInteger):
            return f"{path}: an integer of {value.digits} digits (at most {MAX_INT_DIGITS})"
        elif isinstance(value, float) and not abs(value) <= MAX_FLOAT:
            return f"{path}: not a finite number within +-{MAX_FLOAT:g}"
        elif isinstance(value, int) and abs(value) >= 10**MAX_INT_DIGITS:
            return f"{path}: an integer past {MAX_INT_DIGITS} digits"
    return ""


def _string_problem(text: str) -> str:
    if len(text) > MAX_STRING_CHARS:
        return f"of {len(text)} characters (at most {MAX_STRING_CHARS})"
    bad = _CONTROL.search(text)
    if bad:
        what = (
            "a lone surrogate" if "\ud800" <= bad.group() <= "\udfff" else "the control character"
        )
        return f"holds {what} {bad.group()!r} at {bad.start()}"
    return ""


def _why(exc: OSError) -> str:
    if exc.errno == errno.ELOOP:
        return "is a symbolic link (not followed)"
    return exc.strerror or str(exc)
