"""Protocol documents to and from JSON, and their files read and written whole.

Writing leaves out what an older job side would not know; reading is the door a user's file
comes through: every key known, every value of its type and within its bound
(:data:`~sia_slurm.protocol.bounds.FIELD_BOUNDS`), and any failure a :class:`ProtocolError`
that names the file and the field.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, asdict, fields
from pathlib import Path
from typing import Any, TypeVar

from sia_slurm.core import JobKind
from sia_slurm.protocol.bounds import FIELD_BOUNDS
from sia_slurm.protocol.documents import (
    PROTOCOL_VERSION,
    Assignment,
    Document,
    JobSpec,
    MetricsReport,
    RunExit,
    RunRefusal,
    StopRequest,
)
from sia_slurm.safefiles import (
    MAX_FILE_BYTES,
    ProtocolError,
    read_json,
    write_json_atomic,
)

_D = TypeVar("_D", JobSpec, Assignment, MetricsReport, StopRequest, RunExit, RunRefusal)


_ADDED_FIELDS: dict[type, tuple[str, ...]] = {Assignment: ("profile_sweep",)}


def to_json(document: Document) -> dict[str, Any]:
    """The JSON object of a protocol document (tuples become lists, enums their values).

    A field added after version 1 is left out while it holds its default (an assignment's
    empty ``profile_sweep``), so that a job side that predates it reads the document."""
    payload = asdict(document)
    for key in _ADDED_FIELDS.get(type(document), ()):
        if not payload[key]:
            del payload[key]
    for key, value in payload.items():
        if isinstance(value, tuple):
            payload[key] = list(value)
        elif isinstance(value, JobKind):
            payload[key] = value.value
    return payload


def write_document(path: Path, document: Document) -> None:
    write_json_atomic(path, to_json(document))


def _field_checkers() -> dict[str, Callable[[Any], bool]]:
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)

    def is_num(v: Any) -> bool:
        return (isinstance(v, int | float)) and not isinstance(v, bool)

    return {
        "int": is_int,
        "float": is_num,
        "str": lambda v: isinstance(v, str),
        "int | None": lambda v: v is None or is_int(v),
        "float | None": lambda v: v is None or is_num(v),
        "str | None": lambda v: v is None or isinstance(v, str),
        "JobKind": lambda v: isinstance(v, str) and v in {k.value for k in JobKind},
        "tuple[str, ...]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
        "tuple[int, ...]": lambda v: isinstance(v, list) and all(is_int(x) for x in v),
    }


_CHECKERS = _field_checkers()


def from_json(cls: type[_D], payload: Mapping[str, Any], where: str) -> _D:
    """Build ``cls`` from a JSON object, naming ``where`` and the field on any problem.

    Unknown keys are refused (a typo would otherwise be silently ignored); a newer
    ``version`` than this code knows is refused with a message that says so; every value is
    checked against :data:`FIELD_BOUNDS`. Whatever else goes wrong while building the document
    is a :class:`ProtocolError` too: nothing but the door's rejection escapes a reader.
    """
    known = {f.name: f for f in fields(cls)}
    bounds = FIELD_BOUNDS[cls]
    unknown = sorted(set(payload) - set(known))
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(unknown)}")
    version = payload.get("version", PROTOCOL_VERSION)
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{where}: version: this sia-slurm speaks protocol {PROTOCOL_VERSION}, got {version!r}"
        )
    values: dict[str, Any] = {}
    for name, spec in known.items():
        if name not in payload:
            if spec.default is MISSING and spec.default_factory is MISSING:
                raise ProtocolError(f"{where}: {name}: missing")
            continue
        value = payload[name]
        check = _CHECKERS[str(spec.type)]
        if not check(value):
            raise ProtocolError(f"{where}: {name}: expected {spec.type}, got {value!r:.80}")
        bound = bounds.get(name)
        problem = "" if bound is None else bound.problem(value)
        if problem:
            raise ProtocolError(f"{where}: {name}: {problem}")
        values[name] = tuple(value) if isinstance(value, list) else value
    try:
        return cls(**values)
    except ProtocolError as exc:
        raise ProtocolError(f"{where}: {exc}") from None
    except Exception as exc:  # the door's rejection, whatever the value broke
        raise ProtocolError(f"{where}: {type(exc).__name__}: {exc}") from None


def read_document(cls: type[_D], path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> _D:
    """Read and validate one protocol file (:class:`ProtocolError` names file and field)."""
    return from_json(cls, read_json(path, max_bytes=max_bytes), str(path))
