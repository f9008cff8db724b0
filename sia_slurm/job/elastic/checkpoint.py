"""Checkpoints that survive being killed at any moment.

A checkpoint of step ``N`` is two files in the job's checkpoint directory::

    ckpt-000000000N.pt          torch.save of the state (written to a temporary name, fsync,
                                atomic rename)
    ckpt-000000000N.pt.sha256   "<sha256> <size>" of that file, written the same way *after* it

A checkpoint is *complete* when its digest file exists and matches the data; the digest is
written last, so a writer killed at any point (SIGKILL during the write, between the two
renames, or a file truncated later) leaves at worst an incomplete newest checkpoint, and
:meth:`CheckpointManager.load` falls back to the previous complete one. The newest ``keep``
(default 2) complete checkpoints are kept; older ones and leftovers of killed writers are
removed after each save. Only rank 0 saves; every rank may load.

Loading uses ``torch.load(weights_only=True)``: tensors, numbers, strings, lists and dicts,
which is what model, optimizer, scheduler and sampler state dicts hold. A state that such a
load would refuse (a numpy array, a user class in the user's dict) is refused by
:meth:`CheckpointManager.save` already, naming the key, so it fails at the first save and not
at the first restart. A complete checkpoint that cannot be unpickled is an error, not a reason
to fall back silently.

*Extras* are small side files of a checkpoint (``ckpt-N.pt.<name>``, e.g. the RNG states of
every rank), written before the digest, so a complete checkpoint has them all. At restart
rank 0 verifies the digest and chooses the step; the other ranks load the chosen file memory
mapped (:meth:`CheckpointManager.load_trusted`) without reading it whole to hash it again.
"""

from __future__ import annotations

import collections
import hashlib
import io
import logging
import os
import re
from pathlib import Path
from typing import IO, Any

import torch

from sia_slurm.safefiles import write_bytes_atomic

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^ckpt-(\d{10})\.pt$")
_DIGEST_SUFFIX = ".sha256"


class CheckpointError(RuntimeError):
    """A complete checkpoint could not be read, or the directory cannot be used."""


class CheckpointManager:
    """Saves and restores the training state of one job in ``directory``."""

    def __init__(self, directory: Path | str, keep: int = 2):
        if keep < 1:
            raise ValueError(f"keep: expected >= 1, got {keep}")
        self.directory = Path(directory)
        self.keep = keep

    # ---- paths -------------------------------------------------------------------------------

    def path(self, step: int) -> Path:
        return self.directory / f"ckpt-{step:010d}.pt"

    @staticmethod
    def digest_path(path: Path) -> Path:
        return path.with_name(path.name + _DIGEST_SUFFIX)

    def steps(self) -> list[int]:
        """Steps that have a data file (complete or not), newest first."""
        if not self.directory.is_dir():
            return []
        found = (_NAME.match(entry.name) for entry in self.directory.iterdir())
        return sorted((int(match[1]) for match in found if match), reverse=True)

    # ---- save --------------------------------------------------------------------------------

    def extra_path(self, step: int, name: str) -> Path:
        return self.directory / f"ckpt-{step:010d}.pt.{name}"

    def save(self, step: int, state: dict[str, Any], extras: dict[str, Any] | None = None) -> Path:
        """Write ``state`` (and its ``extras``) as the checkpoint of ``step``; durable when
        this returns. A state a ``weights_only`` load would refuse raises CheckpointError."""
        if step < 0:
            raise ValueError(f"step: expected >= 0, got {step}")
        check_loadable(state)
        for name, extra in (extras or {}).items():
            check_loadable(extra, f"{name}")
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CheckpointError(f"{self.directory}: cannot create: {exc.strerror}") from None
        for name, extra in (extras or {}).items():
            self._write_atomic(self.extra_path(step, name), _serialise(extra))
        data = _serialise(state)
        path = self.path(step)
        self._write_atomic(path, data)
        digest = f"{hashlib.sha256(data).hexdigest()} {len(data)}\n".encode()
        self._write_atomic(self.digest_path(path), digest)
        _fsync_dir(self.directory)
        self._prune()
        return path

    def _write_atomic(self, path: Path, data: bytes | memoryview) -> None:
        write_bytes_atomic(path, data, mode=None, write=self._write_bytes)

    def _write_bytes(self, handle: IO[bytes], data: bytes | memoryview) -> None:
        """The raw write (a seam for the crash tests)."""
        handle.write(data)

    def _prune(self) -> None:
        complete = [step for step in self.steps() if self._digest_matches_size(step)]
        keep = set(complete[: self.keep])
        newest = complete[0] if complete else -1
        for step in self.steps():
            if step in keep or step > newest:  # a newer incomplete one may be being written
                continue
            path = self.path(step)
            path.unlink(missing_ok=True)
            for side in self.directory.glob(f"{path.name}.*"):  # digest and extras
                side.unlink(missing_ok=True)
        for leftover in self.directory.glob(".ckpt-*.tmp"):
            leftover.unlink(missing_ok=True)  # only rank 0 writes: these are from dead writers

    def _digest_matches_size(self, step: int) -> bool:
        path = self.path(step)
        try:
            expected = _read_digest(self.digest_path(path))
            return expected is not None and path.stat().st_size == expected[1]
        except OSError:
            return False

    # ---- load --------------------------------------------------------------------------------

    def load(self, step: int | None = None) -> tuple[int, dict[str, Any]] | None:
        """``(step, state)`` of the newest complete checkpoint (or of ``step``); ``None`` if
        there is none. Incomplete or corrupt newer ones are skipped with a warning."""
        candidates = self.steps() if step is None else [step]
        for candidate in candidates:
            data = self._read_verified(candidate)
            if data is None:
                if step is not None:
                    raise CheckpointError(f"{self.path(step)}: incomplete or corrupt checkpoint")
                continue
            try:
                state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as exc:
                raise CheckpointError(
                    f"{self.path(candidate)}: complete checkpoint cannot be loaded: {exc}"
                ) from None
            return candidate, state
        return None

    def load_trusted(self, step: int) -> dict[str, Any]:
        """The state of ``step``, which rank 0 verified: memory mapped, not hashed again."""
        try:
            return torch.load(self.path(step), map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:
            raise CheckpointError(f"{self.path(step)}: cannot be loaded: {exc}") from None

    def load_extra(self, step: int, name: str) -> Any:
        """The extra ``name`` of ``step``'s checkpoint, ``None`` if it has none."""
        path = self.extra_path(step, name)
        if not path.exists():
            return None
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:
            raise CheckpointError(f"{path}: cannot be loaded: {exc}") from None

    def _read_verified(self, step: int) -> bytes | None:
        path = self.path(step)
        digest_path = self.digest_path(path)
        try:
            expected = _read_digest(digest_path)
            data = path.read_bytes()
        except OSError as exc:
            logger.warning("checkpoint %s: unreadable (%s); skipping it", path, exc.strerror)
            return None
        if expected is None:
            logger.warning(
                "checkpoint %s: no valid %s (incomplete); skipping it", path, digest_path.name
            )
            return None
        if len(data) != expected[1] or hashlib.sha256(data).hexdigest() != expected[0]:
            logger.warning(
                "checkpoint %s: %d bytes do not match its digest (%d bytes; truncated or "
                "corrupt); skipping it",
                path,
                len(data),
                expected[1],
            )
            return None
        return data


_SAFE_LEAVES = (
    torch.Tensor,
    int,
    float,
    bool,
    str,
    bytes,
    type(None),
    complex,
    torch.dtype,
    torch.device,
    torch.Size,
)


def check_loadable(value: Any, where: str = "state") -> None:
    """Raise CheckpointError if ``torch.load(weights_only=True)`` would refuse ``value``,
    naming the offending key (``state['user']['table']``). Containers are walked; a leaf of
    another type is tried alone through a real ``weights_only`` load (types the user
    allowed with ``torch.serialization.add_safe_globals`` pass)."""
    if type(value) in _SAFE_LEAVES or type(value) is torch.nn.Parameter:
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, (str, int, float, bool, type(None), tuple)):
                raise CheckpointError(
                    f"checkpoint {where}: key {key!r} of type {type(key).__name__} cannot be "
                    "loaded with torch.load(weights_only=True); use str or int keys"
                )
            check_loadable(item, f"{where}[{key!r}]")
        if type(value) not in (dict, collections.OrderedDict):
            _try_alone(value, where)
        return
    if isinstance(value, (list, tuple, set)):
        for index, item in enumerate(value):
            check_loadable(item, f"{where}[{index}]")
        if type(value) not in (list, tuple, set):
            _try_alone(value, where)
        return
    _try_alone(value, where)


def _try_alone(value: Any, where: str) -> None:
    try:
        torch.load(io.BytesIO(_serialise(value)), weights_only=True)
    except Exception as exc:
        lines = str(exc).splitlines()
        first = next((line.strip() for line in lines if "Unsupported global" in line), "")
        first = first.split(" was not")[0] or type(exc).__name__
        raise CheckpointError(
            f"checkpoint {where}: a {type(value).__module__}.{type(value).__qualname__} "
            "cannot be loaded with torch.load(weights_only=True) at restart; store tensors, "
            "numbers, strings, lists or dicts (e.g. torch.from_numpy(array), or a state "
            "dict), or allow the type with torch.serialization.add_safe_globals "
            f"({first})"
        ) from None


def _serialise(value: Any) -> memoryview:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getbuffer()


def _read_digest(path: Path) -> tuple[str, int] | None:
    """``(sha256 hex, size)`` from a digest file; ``None`` if absent or malformed."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        return None
    parts = text.split()
    if len(parts) != 2 or not re.fullmatch(r"[0-9a-f]{64}", parts[0]) or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


def _fsync_dir(directory: Path) -> None:
    """Make the renames in ``directory`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
