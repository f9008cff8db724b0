"""Protocol documents to and from JSON, and their files read and written whole.

Writing leaves out what an older job side would not know; reading is the door a user's file
comes through: every key known, every value of its type and within its bound
(:data:`~sia_slurm.protocol.bounds.FIELD_BOUNDS`), and any failure a :class:`ProtocolError`
that names the file and the field.

Between releases (docs/protocol.md): a document says the protocol version it was written in.
This release reads its own version and the previous one (:data:`OLDEST_PROTOCOL`), so a job
submitted before an upgrade, or a launcher of the previous release still running, is understood;
a field a version added (``metadata={"since": N}``) is absent from an older document and takes
its default, and what a version renamed or redefined is carried forward by :data:`UPGRADES`. It
writes in the version its reader speaks (``to_json(document, version)``): the fields that reader
would not know are left out while they hold their defaults, and a value it could not understand
is refused here, before any file is written.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import MISSING, Field, asdict, fields
from pathlib import Path
from typing import Any, TypeVar

from sia_slurm.protocol.bounds import FIELD_BOUNDS
from sia_slurm.protocol.documents import (
    OLDEST_PROTOCOL,
    PROTOCOL_VERSION,
    Assignment,
    Document,
    JobKind,
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


# Fields added within version 1, before releases had numbers: left out while empty, so that a
# job side from before them reads the document (an assignment's ``profile_sweep``).
_ADDED_FIELDS: dict[type, tuple[str, ...]] = {Assignment: ("profile_sweep",)}

Payload = dict[str, Any]
# (document class, version v) -> what turns a v payload into a v + 1 one (a field renamed or
# given a new meaning; a field merely added needs nothing: it has a default), and back for
# writing to a reader of v. Empty while the protocol has had one version.
UPGRADES: dict[tuple[type, int], Callable[[Payload], Payload]] = {}
DOWNGRADES: dict[tuple[type, int], Callable[[Payload], Payload]] = {}


def since(spec: Field[Any]) -> int:
    """The protocol version that added the field (1: it was there from the start)."""
    return int(spec.metadata.get("since", 1))


def to_json(document: Document, version: int | None = None) -> dict[str, Any]:
    """The JSON object of a protocol document (tuples become lists, enums their values), in
    protocol ``version`` (the document's own by default): what a reader of that version reads.

    A field that ``version`` does not have is left out while it holds its default; holding
    anything else it cannot be said to that reader, and :class:`ProtocolError` says so (the
    caller offers that job nothing that needs it)."""
    target = document.version if version is None else version
    if not OLDEST_PROTOCOL <= target <= PROTOCOL_VERSION:
        raise ProtocolError(
            f"{type(document).__name__}: cannot be written in protocol {target}: this sia-slurm "
            f"writes protocols {OLDEST_PROTOCOL} to {PROTOCOL_VERSION}"
        )
    payload = asdict(document)
    payload["version"] = target
    for spec in fields(document):
        if since(spec) <= target:
            continue
        if payload[spec.name] != _default(spec):
            raise ProtocolError(
                f"{type(document).__name__}: {spec.name} (protocol {since(spec)}) holds "
                f"{payload[spec.name]!r:.80}, which a reader of protocol {target} would not know"
            )
        del payload[spec.name]
    for step in range(PROTOCOL_VERSION - 1, target - 1, -1):
        downgrade = DOWNGRADES.get((type(document), step))
        if downgrade is not None:
            payload = downgrade(payload)
    for key in _ADDED_FIELDS.get(type(document), ()):
        if key in payload and not payload[key]:
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
    version = _version(payload, where)
    later = sorted(f.name for f in fields(cls) if since(f) > version and f.name in payload)
    if later:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(later)} in protocol {version}")
    for step in range(version, PROTOCOL_VERSION):
        upgrade = UPGRADES.get((cls, step))
        if upgrade is not None:
            payload = upgrade(dict(payload))
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(payload) - set(known))
    if unknown:
        raise ProtocolError(f"{where}: unknown field(s) {', '.join(unknown)}")
    bounds = FIELD_BOUNDS[cls]
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


def _version(payload: Mapping[str, Any], where: str) -> int:
    """The protocol version ``payload`` says it is in (the current one if it says none: the
    files of the first releases said 1 or nothing), if this release reads it."""
    version = payload.get("version", PROTOCOL_VERSION)
    if not isinstance(version, int) or isinstance(version, bool):
        raise ProtocolError(f"{where}: version: expected an integer, got {version!r:.80}")
    if version > PROTOCOL_VERSION:
        raise ProtocolError(
            f"{where}: version: written in protocol {version}, newer than this sia-slurm's "
            f"{PROTOCOL_VERSION}: a newer release wrote it; upgrade sia-slurm here (the "
            "controller first, then the nodes: docs/operations.md, Upgrading)"
        )
    if version < OLDEST_PROTOCOL:
        raise ProtocolError(
            f"{where}: version: written in protocol {version}; this sia-slurm reads protocols "
            f"{OLDEST_PROTOCOL} to {PROTOCOL_VERSION} (its own release's and the one before): "
            "a job of a release two or more before, which must end before such an upgrade"
        )
    return version


def _default(spec: Field[Any]) -> Any:
    """A field's default, as :func:`dataclasses.asdict` gives its value."""
    if spec.default_factory is not MISSING:
        return spec.default_factory()
    return spec.default


def read_document(cls: type[_D], path: Path, *, max_bytes: int = MAX_FILE_BYTES) -> _D:
    """Read and validate one protocol file (:class:`ProtocolError` names file and field)."""
    return from_json(cls, read_json(path, max_bytes=max_bytes), str(path))
