"""Hostile documents, drawn by hypothesis, through the real readers and a real round (issue 35,
item 7).

Whatever bytes a user leaves in a file, a reader returns a document within every bound of
:data:`~sia_slurm.protocol.FIELD_BOUNDS` or raises :class:`ProtocolError` whose message starts
with the file's path: nothing else escapes, nothing hangs. Hand-picked cases (the 5000-digit
integer, ``NaN``) are in test_protocol_bounds.py; here the values are drawn: raw bytes, any JSON
text (integers of any length, ``NaN``/``Infinity``/``1e999``, control characters, lone
surrogates, deep nesting, long lists), a valid document with one field replaced, and every
field at and around its bounds; a job's own profile (``profile.json``) likewise. Then one evil
job among honest ones, in a real controller round (Sia, the shipped profiles) and in a real
:class:`SlurmBackend` snapshot over real files (its spec, metrics, profile, and its launcher's
refusal and exit records): the round completes and the honest jobs are untouched.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import fields, replace
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from sia_slurm.cluster import BatchChoice, ClusterSnapshot, JobPhase, JobSnapshot, Start
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller.decide import Decision, RoundOutcome
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import NodeShare, NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import (
    FIELD_BOUNDS,
    MAX_ACCUM,
    MAX_BATCH,
    MAX_COUNT,
    MAX_FAILURES,
    MAX_GPUS,
    MAX_GRAD_STAT,
    MAX_MESSAGE_CHARS,
    MAX_RESTARTS,
    MAX_SECONDS,
    MAX_STEP_SECONDS,
    MAX_UID,
    NAME,
    SIA_ID,
    Assignment,
    Document,
    ExitCause,
    JobSpec,
    MetricsReport,
    ProtocolError,
    RunExit,
    RunRefusal,
    StatePaths,
    StopRequest,
    exit_name,
    from_json,
    read_document,
    refusal_name,
    to_json,
)
from sia_slurm.protocol.profile import AppProfile, load_profiles
from sia_slurm.protocol.profile_json import profile_from_json, profile_to_json
from sia_slurm.safefiles import MAX_FILE_BYTES, MAX_ITEMS, MAX_STRING_CHARS, parse_json
from sia_slurm.service.summary import record_round
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.state.store import Store
from sia_slurm.state.tree import set_up
from sia_slurm.userfiles import JobDirectory
from tests.slurm.conftest import FakeClock, FakeSlurm
from tests.slurm.test_backend import backend_for

# Examples: 30 per document type and kind of hostile file (720), 100 profiles, 50 rounds of each
# kind, 75 + 50 Slurm snapshots: about 20 s on two cores, for CI's time (longer runs, 14,400
# files and 2,100 rounds of each kind, found nothing more than the lone surrogate, now refused).
PER_KIND = settings(max_examples=30, deadline=None)
FUZZ = settings(max_examples=100, deadline=None)
ROUNDS = settings(max_examples=50, deadline=None)
UID = os.geteuid()

# ------------------------------------------------------------------------------------------------
# A valid document of each type: what a field is replaced in, and the bounds are drawn around.

_SPEC = JobSpec(
    "j1", "cifar10", JobKind.ADAPTIVE, init_batch_size=128, max_batch_size=1024, min_gpus=1,
    max_gpus=8, requested_gpus=2, requested_gpu_type="a100", requested_batch_size=256,
    restart_cost=30.0, submit_time=5.0, checkpoint_dir="/ckpt", command=("python", "train.py"),
    profile="cifar10", owner_uid=1000, max_failures=3,
)  # fmt: skip
_ASSIGNMENT = Assignment(
    "j1", 3, "a100", "a100", 1, 2, ("a100-1",), 64, 32, 0, restarts=1, slurm_job_id="14",
    slurm_restart_count=0, not_before=5.0,
)  # fmt: skip
_REPORT = MetricsReport(
    "j1", 10.0, "a100", 1, 2, 32, 0, 0.2, 0.02, 1.0, 2.0, steps=7, round_index=3,
    slurm_job_id="14", slurm_restart_count=0, node_list=("a100-1",),
)  # fmt: skip
VALID: dict[type[Any], dict[str, Any]] = {
    JobSpec: to_json(_SPEC),
    Assignment: to_json(_ASSIGNMENT),
    MetricsReport: to_json(_REPORT),
    StopRequest: to_json(StopRequest("j1", 3, 5.0)),
    RunExit: to_json(RunExit("j1", "14", 0, "failed", 1, 5.0, "it broke")),
    RunRefusal: to_json(RunRefusal("j1", "14", 0, ("a100-1",), 3, 5.0, "not mine")),
}
DOCUMENTS = tuple(VALID)
_SENTINEL = "@@replaced@@"


def _with_literal(payload: Mapping[str, Any], field: str, literal: str) -> str:
    """``payload`` as JSON text with ``field``'s value spelled ``literal`` verbatim (which may
    be no JSON at all, or a number no float holds)."""
    return json.dumps({**payload, field: _SENTINEL}).replace(json.dumps(_SENTINEL), literal)


# ------------------------------------------------------------------------------------------------
# Any JSON text: numbers of any size or none, strings of any character, any nesting

_EDGE_NUMBERS = (
    "0", "-0", "-0.0", "1", "-1", "9" * 19, "-" + "9" * 19, "1" + "0" * 19, "-1" + "0" * 19,
    str(2**63 - 1), str(2**63), str(2**64), "1e300", "-1e300", "1.0000000000000002e300",
    "1e301", "1e308", "1.8e308", "1e999", "-1e999", "1e-400", "4.9e-324", "NaN", "Infinity",
    "-Infinity", "1E2", "1.5", "100000.0", "1e11", "100000000001",
)  # fmt: skip
_LONE_SURROGATES = st.integers(0xD800, 0xDFFF).map(lambda c: f'"a\\u{c:04x}"')  # JSON strings
_SCALARS = st.one_of(
    st.sampled_from(("null", "true", "false")),
    st.integers().map(str),
    st.integers(-(10**40), 10**40).map(str),
    st.sampled_from(_EDGE_NUMBERS),
    st.integers(20, 6000).map(lambda n: "9" * n),
    st.floats(allow_nan=True, allow_infinity=True).map(json.dumps),
    st.text(max_size=40).map(json.dumps),  # control characters as \\u escapes
    st.text(max_size=40).map(lambda s: json.dumps(s, ensure_ascii=False)),  # raw
    _LONE_SURROGATES,
    st.integers(MAX_STRING_CHARS - 2, MAX_STRING_CHARS + 2).map(lambda n: json.dumps("x" * n)),
    st.sampled_from(("a100", "a100-1", "14", "", "cifar10", "failed", "j1")).map(json.dumps),
)
_KEYS = st.one_of(
    st.sampled_from(sorted({k for payload in VALID.values() for k in payload})).map(json.dumps),
    st.text(max_size=12).map(json.dumps),
    _LONE_SURROGATES,
)


def _containers(children: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.lists(children, max_size=5).map(lambda xs: "[" + ",".join(xs) + "]"),
        st.lists(st.tuples(_KEYS, children), max_size=5).map(
            lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"
        ),
    )


def _nested(depth: int, leaf: str, as_object: bool) -> str:
    if as_object:
        return '{"a":' * depth + leaf + "}" * depth
    return "[" * depth + leaf + "]" * depth


def _many(count: int, as_object: bool) -> str:
    if as_object:
        return "{" + ",".join(f'"k{i}":0' for i in range(count)) + "}"
    return "[" + ",".join("0" * count) + "]"


JSON_VALUES = st.one_of(
    st.recursive(_SCALARS, _containers, max_leaves=8),
    st.builds(  # around MAX_DEPTH, and past what the decoder's recursion holds
        _nested,
        st.integers(1, 12) | st.integers(12, MAX_FILE_BYTES // 2 - 16),
        _SCALARS,
        st.booleans(),
    ),
    st.builds(_many, st.integers(MAX_ITEMS - 2, MAX_ITEMS + 2), st.booleans()),
)


def json_objects(keys: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    """An object text whose keys are mostly a document's fields, each valued by any JSON."""
    return st.lists(st.tuples(keys, JSON_VALUES), max_size=8).map(
        lambda kv: "{" + ",".join(f"{k}:{v}" for k, v in kv) + "}"
    )


# ------------------------------------------------------------------------------------------------
# The four kinds of hostile file, per document type


Valid = Mapping[str, Any]


def arbitrary_bytes(cls: type[Any], payload: Valid) -> st.SearchStrategy[bytes]:
    valid = json.dumps(payload).encode()
    sia_id = json.dumps(payload["sia_id"]).encode()
    return st.one_of(
        st.binary(max_size=256),
        st.binary(max_size=64).map(lambda junk: valid[: len(valid) // 2] + junk),
        st.binary(max_size=16).map(lambda junk: valid.replace(sia_id, sia_id[:-1] + junk + b'"')),
        st.sampled_from(("utf-8-sig", "utf-16", "utf-16-be", "utf-32", "latin-1")).map(
            lambda codec: json.dumps(payload, ensure_ascii=False).encode(codec)
        ),
        st.integers(MAX_FILE_BYTES - 4, MAX_FILE_BYTES + 4).map(  # around the size cap
            lambda size: valid[:-1] + b" " * max(size - len(valid), 0) + b"}"
        ),
    )


def arbitrary_json(cls: type[Any], payload: Valid) -> st.SearchStrategy[bytes]:
    fields_of = st.sampled_from(sorted(payload)).map(json.dumps)
    return st.one_of(JSON_VALUES, json_objects(fields_of | _KEYS)).map(str.encode)


def one_field_replaced(cls: type[Any], valid: Valid) -> st.SearchStrategy[bytes]:
    names = st.sampled_from([*sorted(valid), "version", "unknown"])
    replaced = st.builds(_with_literal, st.just(valid), names, JSON_VALUES)
    dropped = st.sampled_from(sorted(valid)).map(
        lambda name: json.dumps({k: v for k, v in valid.items() if k != name})
    )
    return (replaced | dropped).map(str.encode)


def _numbers_around(low: float, high: float, integral: bool) -> st.SearchStrategy[Any]:
    """Numbers at, just inside and just past ``[low, high]``, integers and floats alike."""
    edges: list[Any] = [
        float(low), math.nextafter(low, -math.inf), math.nextafter(low, math.inf),
        float(high), math.nextafter(high, math.inf), math.nextafter(high, -math.inf),
        -0.0, 5e-324,
    ]  # fmt: skip
    if integral:
        edges += [int(low) - 1, int(low), int(low) + 1, int(high) - 1, int(high), int(high) + 1]
    inside = st.integers(int(low), int(high)) if integral else st.floats(low, high)
    return st.sampled_from(edges) | inside


def _names_around(pattern: re.Pattern[str], longest: int) -> st.SearchStrategy[str]:
    """Strings the pattern takes (at their longest) and the ones just past it."""
    return st.one_of(
        st.from_regex(pattern, fullmatch=True),
        st.sampled_from(
            (
                "a" * longest, "a" * (longest + 1), "", "-a", ".a", "a\n", "a\t", "a b",
                "a/b", "..", "a\u2028", "\u0661", "1" * longest, "1" * (longest + 1),
                "a" * MAX_STRING_CHARS, "a\x1b[2J",
            )
        ),
    )  # fmt: skip


def _texts_around() -> st.SearchStrategy[str]:
    """Any text, and text around the message and string limits or holding a control."""
    lengths = (MAX_MESSAGE_CHARS, MAX_MESSAGE_CHARS + 1, MAX_STRING_CHARS, MAX_STRING_CHARS + 1)
    return st.one_of(
        st.text(max_size=30),
        st.sampled_from(lengths).map(lambda n: "é" * n),
        st.sampled_from(("a\nb", "a\tb", "a\rb", "\x00", "\x7f", "\x85", "\u202e", "\ud800")),
    )


def _lists_around(item: st.SearchStrategy[str], most: int) -> st.SearchStrategy[list[str]]:
    counts = sorted({0, 1, min(most, MAX_ITEMS) - 1, min(most, MAX_ITEMS), MAX_ITEMS + 1})
    return st.one_of(
        st.lists(item, max_size=4),
        st.tuples(item, st.sampled_from(counts)).map(lambda pair: [pair[0]] * pair[1]),
    )


def _around(cls: type[Any], name: str) -> st.SearchStrategy[Any]:
    """Values for field ``name`` of ``cls`` at and around its bound (or its type)."""
    bound = FIELD_BOUNDS[cls].get(name)
    kind = {spec.name: str(spec.type) for spec in fields(cls)}[name]
    if name == "sia_id":
        return _names_around(SIA_ID, 64)
    if name == "kind":
        return st.sampled_from([*(k.value for k in JobKind), "ADAPTIVE", ""])
    if name == "cause":
        return st.sampled_from([c.value for c in ExitCause]) | _names_around(NAME, 64)
    if bound is None or (bound.pattern is not None and bound.says == "one line of text"):
        return _texts_around()
    if bound.pattern is not None:
        longest = 255 if "host" in bound.says else 20 if bound.says.startswith("a Slurm") else 64
        names = _names_around(bound.pattern, longest)
        if kind.startswith("tuple"):
            return _lists_around(names, bound.items or MAX_ITEMS)
        return names
    if bound.items is not None:  # a command: any strings, around the count
        return _lists_around(_texts_around(), bound.items)
    assert bound.low is not None and bound.high is not None
    numbers = _numbers_around(bound.low, bound.high, kind.startswith("int"))
    return (numbers | st.none()) if "None" in kind else numbers


def near_bounds(cls: type[Any], valid: Valid) -> st.SearchStrategy[bytes]:
    """The valid document with some fields drawn at and around their bounds."""
    optional = {name: _around(cls, name) for name in valid if name != "version"}
    optional["version"] = st.sampled_from([0, 1, 2, 1.0, True, "1"])
    drawn = st.fixed_dictionaries({}, optional=optional)  # type: ignore[arg-type]
    return drawn.map(lambda over: json.dumps({**valid, **over}).encode())


STRATEGIES: dict[str, Callable[[type[Any], Valid], st.SearchStrategy[bytes]]] = {
    "bytes": arbitrary_bytes,
    "json": arbitrary_json,
    "one-field": one_field_replaced,
    "bounds": near_bounds,
}

# ------------------------------------------------------------------------------------------------
# What a returned document must respect

_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def assert_printable(value: Any, where: str) -> None:
    """Every string of a document is at most 4096 characters, with no control character but
    tab and newline (the reader's bounds), whatever the field."""
    texts = value if isinstance(value, tuple) else (value,)
    for text in texts:
        if isinstance(text, str):
            assert len(text) <= MAX_STRING_CHARS, where
            assert not _CONTROL.search(text), (where, text)
            text.encode("utf-8")  # no lone surrogate: every message quoting it can be stored


def assert_within_bounds(document: Document) -> None:
    """Every field of ``document`` within :data:`FIELD_BOUNDS`, checked here afresh (not with
    :meth:`Bound.problem`, the code under test)."""
    bounds = FIELD_BOUNDS[type(document)]
    checkers = {"int": int, "float": (int, float), "str": str}
    for spec in fields(document):
        value = getattr(document, spec.name)
        where = f"{type(document).__name__}.{spec.name} = {value!r:.80}"
        assert not isinstance(value, bool), where
        base = str(spec.type).split(" |")[0]
        if value is not None and base in checkers:
            assert isinstance(value, checkers[base]), where
        if isinstance(value, float):
            assert math.isfinite(value), where
        assert_printable(value, where)
        if spec.name == "message":
            assert len(value) <= MAX_MESSAGE_CHARS, where
        bound = bounds.get(spec.name)
        if bound is None or value is None:
            continue
        if isinstance(value, int | float):
            assert bound.low is not None and bound.high is not None, where
            assert bound.low <= value <= bound.high, where
            continue
        items = value if isinstance(value, tuple) else (value,)
        if bound.items is not None:
            assert len(items) <= bound.items, where
        if bound.pattern is not None:
            assert all(bound.pattern.fullmatch(item) for item in items), where


# ------------------------------------------------------------------------------------------------
# 1. Every document type, through both readers


@pytest.fixture(scope="module")
def jobs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``jobs/`` with one job directory ``j1``, owned by this process's uid."""
    root = tmp_path_factory.mktemp("state") / "jobs"
    (root / "j1").mkdir(parents=True)
    return root


def read_both(cls: type[Any], path: Path) -> Document | str:
    """The document at ``path`` (``jobs/j1/<name>``) read by :func:`read_document` and by
    :meth:`JobDirectory.read_document`: the same document, or the same :class:`ProtocolError`
    naming the file (its message); any other exception propagates."""
    outcomes: list[Document | str] = []
    try:
        outcomes.append(read_document(cls, path))
    except ProtocolError as exc:
        outcomes.append(str(exc))
    with JobDirectory(path.parent.parent, path.parent.name, UID) as directory:
        try:
            outcomes.append(directory.read_document(cls, path.name))
        except ProtocolError as exc:
            outcomes.append(str(exc))
    by_path, by_directory = outcomes
    assert by_path == by_directory
    return by_path


def check_file(cls: type[Any], path: Path, data: bytes) -> None:
    path.write_bytes(data)
    outcome = read_both(cls, path)
    if isinstance(outcome, str):
        assert outcome.startswith(f"{path}: "), outcome
        outcome.encode("utf-8")  # the refusal names no lone surrogate: it can be stored
        event("refused")
    else:
        assert type(outcome) is cls
        assert_within_bounds(outcome)
        event("accepted")


@pytest.mark.heavy
@pytest.mark.parametrize("strategy", sorted(STRATEGIES))
@pytest.mark.parametrize("cls", DOCUMENTS, ids=lambda cls: cls.__name__)
@PER_KIND
@given(data=st.data())
def test_a_hostile_file_gives_a_document_within_bounds_or_a_protocol_error(
    jobs_dir: Path, cls: type[Any], strategy: str, data: st.DataObject
) -> None:
    raw = data.draw(STRATEGIES[strategy](cls, VALID[cls]), label=strategy)
    check_file(cls, jobs_dir / "j1" / f"{cls.__name__}.json", raw)


def test_the_valid_documents_and_their_bounds_are_accepted(jobs_dir: Path) -> None:
    """The strategies' starting points read back as written, and a report with its numbers
    at their upper bounds is taken: the bounds are inclusive."""
    for cls, payload in VALID.items():
        path = jobs_dir / "j1" / f"{cls.__name__}.json"
        path.write_text(json.dumps(payload))
        assert to_json(read_both(cls, path)) == payload  # type: ignore[arg-type]
    path = jobs_dir / "j1" / "metrics.json"
    top = {"time": MAX_SECONDS, "grad_sqr": MAX_GRAD_STAT, "steps": MAX_COUNT}
    path.write_text(json.dumps({**VALID[MetricsReport], **top, "step_time": MAX_STEP_SECONDS}))
    assert isinstance(read_both(MetricsReport, path), MetricsReport)


# A lone surrogate (a JSON ``\\ud800`` escape) passed the door once (found here): no control
# character, but no UTF-8 holds it. Accepted in a free-text field, or named in a refusal (an
# unknown field's name, a key on the path of a bad value), it reached a message the state
# database cannot store (sqlite raises UnicodeEncodeError), which failed the round's commit
# before apply, every round, for every job. The door now refuses it; these are the exact cases.
SURROGATE = "\\ud800"  # as the JSON text spells it
LONE_SURROGATES = {
    "accepted in a spec's profile": (JobSpec, f'"profile": "/x/{SURROGATE}"'),
    "accepted in an exit's message": (RunExit, f'"message": "boom {SURROGATE}"'),
    "named as an unknown field": (JobSpec, f'"{SURROGATE}": 1'),
    "named on the path of a bad value": (MetricsReport, f'"{SURROGATE}": {{"a": "\\u0001"}}'),
}


def with_member(cls: type[Any], member: str) -> str:
    """The valid document's JSON text with ``member`` (``"key": value``, verbatim) added."""
    return json.dumps(VALID[cls])[:-1] + ", " + member + "}"


def not_utf8(texts: Iterable[object]) -> list[str]:
    """The strings among ``texts`` that UTF-8 cannot encode."""
    bad = []
    for text in texts:
        if isinstance(text, str):
            try:
                text.encode("utf-8")
            except UnicodeEncodeError:
                bad.append(text)
    return bad


def strings_of(outcome: Document | str) -> list[object]:
    """A reader's outcome as its strings: the refusal's message, or every field's values."""
    if isinstance(outcome, str):
        return [outcome]
    values = to_json(outcome).values()
    return [item for value in values for item in (value if isinstance(value, list) else [value])]


@pytest.mark.parametrize("case", sorted(LONE_SURROGATES))
def test_a_lone_surrogate_never_leaves_the_door(jobs_dir: Path, case: str) -> None:
    cls, member = LONE_SURROGATES[case]
    path = jobs_dir / "j1" / "surrogate.json"
    path.write_text(with_member(cls, member))
    assert not_utf8(strings_of(read_both(cls, path))) == []


# ------------------------------------------------------------------------------------------------
# 2. A job's own profile document


def _extreme_ints(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers in ``[low, high]``, its ends and their neighbours often."""
    edges = sorted({low, min(low + 1, high), max(high - 1, low), high})
    return st.sampled_from(edges) | st.integers(low, high)


def _extreme_floats(low: float, high: float) -> st.SearchStrategy[float]:
    """Floats in ``[low, high]``, its ends, the smallest positive ones and ``1e-300`` often."""
    edges = (low, math.nextafter(low, math.inf), 1e-300, 5e-324, high, math.nextafter(high, low))
    return st.sampled_from([e for e in edges if low <= e <= high]) | st.floats(low, high)


PROFILES = load_profiles()
GPU_TYPES = tuple(PROFILES.gpu_types)
PROFILE = profile_to_json(PROFILES.app("cifar10"))


def _profile_paths(document: Mapping[str, Any]) -> list[tuple[str | int, ...]]:
    """Every value's path in the profile document (keys and list indices)."""
    found: list[tuple[str | int, ...]] = []

    def walk(value: Any, path: tuple[str | int, ...]) -> None:
        found.append(path)
        if isinstance(value, dict):
            for key, item in value.items():
                walk(item, (*path, key))
        elif isinstance(value, list):
            for index, item in enumerate(value):
                walk(item, (*path, index))

    walk(document, ())
    return found[1:]


def _replace_at(document: Any, path: tuple[str | int, ...], literal: str | None) -> str:
    """``document`` as JSON text with the value at ``path`` spelled ``literal`` (or removed)."""
    copy = json.loads(json.dumps(document))
    parent = copy
    for step in path[:-1]:
        parent = parent[step]
    if literal is None:  # removed; the key a path adds (``unknown``) is not there to remove
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        else:
            del parent[path[-1]]
        return json.dumps(copy)
    parent[path[-1]] = _SENTINEL
    return json.dumps(copy).replace(json.dumps(_SENTINEL), literal)


def _with_memory_limit(key: str, value: str) -> str:
    """The profile with one more memory limit, its key and value spelled verbatim."""
    text = json.dumps(PROFILE)
    return text.replace('"max_local_bsz": {', f'"max_local_bsz": {{{key}: {value}, ', 1)


@st.composite
def _seed_rows(draw: st.DrawFn, limits: Mapping[str, int]) -> dict[str, Any]:
    gpu_type = draw(st.sampled_from(sorted(limits)))
    digit = draw(st.sampled_from("19\u0663"))  # an Arabic-Indic 3 is a digit to str.isdigit
    step_time = draw(_extreme_floats(5e-324, MAX_STEP_SECONDS))
    return {
        "gpu_type": gpu_type,
        "local_bsz": draw(_extreme_ints(1, limits[gpu_type])),
        "placement": digit * draw(_extreme_ints(1, MAX_STRING_CHARS)),
        "step_time": step_time,
        "sync_time": min(
            step_time * draw(st.sampled_from((0.0, 0.5, 1 - 2**-52))),
            math.nextafter(step_time, 0.0),
        ),
    }


@st.composite
def extreme_profiles(draw: st.DrawFn) -> str:
    """A profile every value of which is at the extremes of what the reader takes: batches
    of 1 or 2**24, seed steps of 5e-324 s or a day, placements of one node or 4096."""
    types = draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, unique=True))
    limits = {gpu_type: draw(_extreme_ints(1, MAX_BATCH)) for gpu_type in types}
    least = draw(_extreme_ints(1, MAX_BATCH))
    init = draw(_extreme_ints(least, MAX_BATCH))
    document = {
        **PROFILE,
        "init_batch_size": init,
        "max_batch_size": draw(_extreme_ints(init, MAX_BATCH)),
        "min_local_bsz": least,
        "max_local_bsz": limits,
        "seed": draw(st.lists(_seed_rows(limits), min_size=1, max_size=6)),
    }
    return json.dumps(document)


PROFILE_TEXTS = st.one_of(
    st.builds(
        _replace_at,
        st.just(PROFILE),
        st.sampled_from([*_profile_paths(PROFILE), ("unknown",)]),
        JSON_VALUES | st.none(),
    ),
    st.builds(
        _with_memory_limit,
        _KEYS | st.sampled_from(GPU_TYPES).map(json.dumps),
        JSON_VALUES,
    ),
    json_objects(st.sampled_from(sorted(PROFILE)).map(json.dumps) | _KEYS),
    extreme_profiles(),
)


def assert_profile_within_bounds(profile: AppProfile) -> None:
    assert isinstance(profile.name, str) and profile.name
    assert_printable(profile.name, "app")
    assert_printable(profile.description, "description")
    assert 1 <= profile.min_local_bsz <= profile.init_batch_size <= profile.max_batch_size
    assert profile.max_batch_size <= MAX_BATCH
    assert profile.max_local_bsz and set(profile.max_local_bsz) <= set(GPU_TYPES)
    assert all(1 <= limit <= MAX_BATCH for limit in profile.max_local_bsz.values())
    assert profile.seed and set(profile.seed) <= set(profile.max_local_bsz)
    for gpu_type, observations in profile.seed.items():
        for obs in observations:
            assert 1 <= obs.local_bsz <= profile.max_local_bsz[gpu_type]
            assert 1 <= obs.nodes <= obs.gpus
            assert 0 < obs.step_time <= MAX_STEP_SECONDS and math.isfinite(obs.step_time)
            assert 0 <= obs.sync_time < obs.step_time


def read_profile(path: Path) -> AppProfile | str:
    """The profile at ``path`` (``jobs/j1/profile.json``) as the controller reads it: the
    bounded JSON through the user-file door, then every value checked."""
    with JobDirectory(path.parent.parent, path.parent.name, UID) as directory:
        try:
            payload = directory.read_json(path.name)
            assert payload is not None
            return profile_from_json(payload, directory.where(path.name), GPU_TYPES)
        except ProtocolError as exc:
            return str(exc)


@pytest.mark.heavy
@FUZZ
@given(text=PROFILE_TEXTS)
def test_a_hostile_profile_gives_a_profile_within_bounds_or_a_protocol_error(
    jobs_dir: Path, text: str
) -> None:
    path = jobs_dir / "j1" / "profile.json"
    path.write_text(text)
    outcome = read_profile(path)
    if isinstance(outcome, str):
        assert outcome.startswith(f"{path}: "), outcome
        outcome.encode("utf-8")  # the refusal names no lone surrogate: it can be stored
        event("refused")
    else:
        assert_profile_within_bounds(outcome)
        event("accepted")


@pytest.mark.parametrize("member", [f'"{SURROGATE}": 1', f'"description": "{SURROGATE}"'])
def test_a_lone_surrogate_never_leaves_the_profile_reader(jobs_dir: Path, member: str) -> None:
    """Named as an unknown field (refused: the message, a ``fit`` quarantine's note, holds
    it), or accepted as the description."""
    path = jobs_dir / "j1" / "profile.json"
    path.write_text(json.dumps(PROFILE)[:-1] + ", " + member + "}")
    outcome = read_profile(path)
    texts = [outcome] if isinstance(outcome, str) else [outcome.name, outcome.description]
    assert not_utf8(texts) == []


def test_the_shipped_profile_reads_back() -> None:
    profile = profile_from_json(PROFILE, "profile.json", GPU_TYPES)
    assert profile_to_json(profile) == PROFILE


# ------------------------------------------------------------------------------------------------
# 3. One evil job in a real controller round

NODES = (
    NodeView("a100-1", "a100", 4, 4),
    NodeView("a100-2", "a100", 4, 4),
    NodeView("t4-1", "t4", 4, 4),
    NodeView("t4-2", "t4", 4, 4),
)
FACTORY = EstimatorFactory(PROFILES, {"a100": "dgx"})
EVIL = "evil"


def _honest_jobs() -> tuple[JobSnapshot, ...]:
    def spec(sia_id: str, app: str, submit_time: float) -> JobSpec:
        return JobSpec(sia_id, app, submit_time=submit_time)

    return (
        JobSnapshot(spec("h0", "cifar10", 0.0), JobPhase.PENDING),
        JobSnapshot(spec("h1", "bert", 1.0), JobPhase.PENDING),
        JobSnapshot(
            spec("h2", "ncf", 2.0), JobPhase.RUNNING, config=Configuration("t4", 1, 2),
            placement=(NodeShare("t4-1", 2),), batch=BatchChoice(256, 128, 0),
        ),
        JobSnapshot(
            spec("h3", "cifar10", 3.0), JobPhase.RUNNING, config=Configuration("a100", 1, 4),
            placement=(NodeShare("a100-1", 4),), batch=BatchChoice(512, 128, 0),
        ),
    )  # fmt: skip


HONEST = _honest_jobs()
HONEST_REPORT = MetricsReport("h3", 90.0, "a100", 1, 4, 128, 0, 0.1, 0.01, 1.0, 2.0)
NOW = 100.0
# Where a running evil job may sit: the GPUs the honest ones leave free.
EVIL_PLACEMENTS = (
    (Configuration("a100", 1, 4), (NodeShare("a100-2", 4),)),
    (Configuration("t4", 1, 1), (NodeShare("t4-2", 1),)),
    (Configuration("t4", 2, 4), (NodeShare("t4-1", 2), NodeShare("t4-2", 2))),
)


def through_the_door(cls: type[Any], payload: Mapping[str, Any]) -> Any:
    """``payload`` as the reader takes it from a file (text, bounded parse, typed fields);
    the example is discarded if the reader refuses it: only accepted documents reach a round."""
    text = json.dumps(payload).encode()
    try:
        return from_json(cls, parse_json(text, "evil.json"), "evil.json")
    except ProtocolError:
        assume(False)


_EVIL_SPEC_FIELDS = {
    "kind": st.sampled_from([k.value for k in JobKind]),
    "requested_gpus": _extreme_ints(1, MAX_GPUS),
    "requested_gpu_type": st.none() | st.sampled_from(("a100", "t4", "dgx", "x" * 64)),
    "requested_batch_size": _extreme_ints(0, MAX_BATCH),
    "restart_cost": st.none() | _extreme_floats(0.0, MAX_STEP_SECONDS),
    "submit_time": _extreme_floats(0.0, MAX_SECONDS),
    "checkpoint_dir": st.sampled_from(("", "/", "é" * MAX_STRING_CHARS)),
    "command": st.lists(st.text(st.characters(exclude_categories=["Cc"]), max_size=8)),
    "profile": st.none() | st.sampled_from(("", "cifar10", "bert", "/etc", "dgx")),
    "owner_uid": st.none() | _extreme_ints(0, MAX_UID),
    "max_failures": _extreme_ints(0, MAX_FAILURES),
}


@st.composite
def evil_specs(draw: st.DrawFn) -> JobSpec:
    """A spec the reader accepts, its fields at the extremes of their bounds (the pairs the
    reader checks together, batches and GPU counts, drawn in order)."""
    payload = draw(st.fixed_dictionaries({}, optional=_EVIL_SPEC_FIELDS))  # type: ignore[arg-type]
    init = draw(_extreme_ints(0, MAX_BATCH))
    least = draw(_extreme_ints(1, MAX_GPUS))
    payload.update(
        sia_id=EVIL,
        app=draw(st.sampled_from((*sorted(PROFILES.apps), "cifar10."))),
        init_batch_size=init,
        max_batch_size=draw(st.just(0) | _extreme_ints(init, MAX_BATCH)),
        min_gpus=least,
        max_gpus=draw(st.none() | _extreme_ints(least, MAX_GPUS)),
    )
    return through_the_door(JobSpec, payload)


@st.composite
def evil_reports(draw: st.DrawFn, job: JobSnapshot) -> MetricsReport:
    """A metrics report the reader accepts, its values at the extremes of their bounds; one
    that describes what ``job`` runs (which the controller believes) when it runs."""
    nodes = draw(_extreme_ints(1, MAX_GPUS))
    shape = {
        "gpu_type": draw(st.sampled_from(("a100", "t4", "dgx", "rtx"))),
        "nodes": nodes,
        "gpus": nodes * draw(_extreme_ints(1, MAX_GPUS // nodes)),
        "local_bsz": draw(_extreme_ints(1, MAX_BATCH)),
        "accum_steps": draw(_extreme_ints(0, MAX_ACCUM)),
    }
    if job.config is not None and job.batch is not None and draw(st.integers(0, 3)):
        shape = {
            "gpu_type": job.config.gpu_type,
            "nodes": job.config.nodes,
            "gpus": job.config.gpus,
            "local_bsz": job.batch.local_bsz,
            "accum_steps": job.batch.accum_steps,
        }
    step_time = draw(_extreme_floats(5e-324, MAX_STEP_SECONDS))
    payload = {
        "sia_id": EVIL,
        "time": draw(_extreme_floats(0.0, MAX_SECONDS)),
        **shape,
        "step_time": step_time,
        "sync_time": min(
            step_time * draw(st.sampled_from((0.0, 0.5, 1 - 2**-52))),
            math.nextafter(step_time, 0.0),  # below step_time, however small that is
        ),
        "grad_sqr": draw(_extreme_floats(0.0, MAX_GRAD_STAT)),
        "grad_var": draw(_extreme_floats(0.0, MAX_GRAD_STAT)),
        "steps": draw(_extreme_ints(0, MAX_COUNT)),
        "round_index": draw(_extreme_ints(0, MAX_COUNT)),
        "slurm_restart_count": draw(_extreme_ints(0, MAX_RESTARTS)),
    }
    return through_the_door(MetricsReport, payload)


@st.composite
def evil_jobs(draw: st.DrawFn) -> JobSnapshot:
    """The evil job: a spec the reader accepts, pending, or holding GPUs the honest jobs
    leave free with a batch at the extremes."""
    spec = draw(evil_specs())
    phase = draw(st.sampled_from((JobPhase.PENDING, JobPhase.RUNNING, JobPhase.STARTING)))
    if phase is JobPhase.PENDING:
        return JobSnapshot(spec, phase)
    config, placement = draw(st.sampled_from(EVIL_PLACEMENTS))
    local_bsz = draw(st.sampled_from((1, 32, MAX_BATCH)))
    accum_steps = draw(st.sampled_from((0, 1, MAX_ACCUM)))
    batch = BatchChoice(config.gpus * local_bsz * (accum_steps + 1), local_bsz, accum_steps)
    return JobSnapshot(spec, phase, config=config, placement=placement, batch=batch)


@st.composite
def evil_jobs_reporting(draw: st.DrawFn) -> tuple[JobSnapshot, MetricsReport | None]:
    job = draw(evil_jobs())
    return job, draw(st.none() | evil_reports(job))


def by_job(outcome: RoundOutcome) -> dict[str, Decision]:
    return {decision.sia_id: decision for decision in outcome.decisions}


@cache
def reference(nodes: tuple[NodeView, ...]) -> dict[str, Decision]:
    """The honest jobs' decisions in the round without the evil job, on ``nodes``."""
    snapshot = ClusterSnapshot(NOW, nodes, HONEST, (HONEST_REPORT,))
    return by_job(Controller(make_policy("sia"), FACTORY).round(snapshot))


def without(nodes: tuple[NodeView, ...], held: tuple[NodeShare, ...]) -> tuple[NodeView, ...]:
    """``nodes`` with the GPUs ``held`` (by a quarantined job) taken away."""
    taken = Counter[str]()
    for share in held:
        taken[share.node] += share.gpus
    return tuple(replace(n, usable_gpus=n.usable_gpus - taken[n.name]) for n in nodes)


def assert_within_capacity(outcome: RoundOutcome, evil: JobSnapshot | None) -> None:
    used = Counter[str]()
    for shares in outcome.placement.assignments.values():
        for share in shares:
            used[share.node] += share.gpus
    if evil is not None and EVIL in outcome.quarantined and evil.phase.holds_gpus:
        for share in evil.placement:  # its GPUs stay its own
            used[share.node] += share.gpus
    for node in NODES:
        assert used[node.name] <= node.usable_gpus, (node, used)
    for sia_id, shares in outcome.placement.assignments.items():
        allocated = outcome.allocation.jobs[sia_id].config
        assert sum(share.gpus for share in shares) == allocated.gpus, sia_id


def assert_honest_untouched(outcome: RoundOutcome, evil: JobSnapshot | None) -> None:
    """The round completed within capacity; unless the evil job got GPUs this round, every
    honest job's decision is the one the round makes without it (on the nodes less the GPUs
    a quarantined evil job keeps)."""
    decisions = by_job(outcome)
    assert set(decisions) == {job.sia_id for job in HONEST} | {EVIL}
    assert all(math.isfinite(d.goodput) and d.goodput >= 0 for d in decisions.values())
    assert_within_capacity(outcome, evil)
    if EVIL in outcome.allocation.jobs:
        event("evil allocated GPUs")
        return
    nodes = NODES
    if EVIL in outcome.quarantined and evil is not None and evil.phase.holds_gpus:
        nodes = without(NODES, evil.placement)
    event(f"evil: {decisions[EVIL].action}")
    honest = {k: v for k, v in decisions.items() if k != EVIL}
    assert honest == reference(nodes)


@pytest.mark.heavy
@ROUNDS
@given(drawn=evil_jobs_reporting())
def test_an_evil_spec_and_report_leave_the_honest_jobs_decisions_alone(
    drawn: tuple[JobSnapshot, MetricsReport | None],
) -> None:
    evil, report = drawn
    reports = [HONEST_REPORT] if report is None else [HONEST_REPORT, report]
    snapshot = ClusterSnapshot(NOW, NODES, (*HONEST, evil), tuple(reports))
    outcome = Controller(make_policy("sia"), FACTORY).round(snapshot)
    assert_honest_untouched(outcome, evil)


@pytest.mark.heavy
@ROUNDS
@given(evil=evil_jobs(), text=PROFILE_TEXTS)
def test_an_evil_profile_document_quarantines_its_job_only(evil: JobSnapshot, text: str) -> None:
    """The document as the backend hands it on (within the JSON bounds); one the door refuses
    is a ``read`` quarantine (the backend lists the job as quarantined, not among the jobs),
    one the estimator factory refuses a ``fit`` one."""
    try:
        document = parse_json(text.encode(), "profile.json")
    except ProtocolError as exc:
        read = {EVIL: str(exc)}
        snapshot = ClusterSnapshot(NOW, NODES, HONEST, (HONEST_REPORT,), quarantined=read)
        outcome = Controller(make_policy("sia"), FACTORY).round(snapshot)
        assert_honest_untouched(outcome, None)
        assert by_job(outcome)[EVIL].action == QUARANTINED
        event("profile refused at the door")
        return
    evil = replace(evil, profile_document=document)
    snapshot = ClusterSnapshot(NOW, NODES, (*HONEST, evil), (HONEST_REPORT,))
    outcome = Controller(make_policy("sia"), FACTORY).round(snapshot)
    assert_honest_untouched(outcome, evil)
    try:
        profile_from_json(document, "profile.json", GPU_TYPES)
    except ProtocolError:
        assert by_job(outcome)[EVIL].action == QUARANTINED
        event("profile refused by the model")


@pytest.mark.parametrize("member", [f'"profile": "/x/{SURROGATE}"', f'"{SURROGATE}": 1'])
def test_a_spec_with_a_lone_surrogate_leaves_the_round_recordable(
    tmp_path: Path, member: str
) -> None:
    """The round's record (jobs, decisions: what ``run_round`` commits before it applies
    anything) is stored whatever one spec held: its job is scheduled, or quarantined by the
    door (``read``) or the model (``fit``), with a note the database can hold."""
    path = tmp_path / "jobs" / EVIL / "spec.json"
    path.parent.mkdir(parents=True)
    path.write_text(with_member(JobSpec, member).replace('"j1"', f'"{EVIL}"', 1))
    jobs, quarantined = HONEST, {}
    try:
        with JobDirectory(path.parent.parent, EVIL, UID) as directory:
            spec = directory.read_document(JobSpec, path.name)
        assert spec is not None
        jobs = (*HONEST, JobSnapshot(spec, JobPhase.PENDING))
    except ProtocolError as exc:
        quarantined = {EVIL: str(exc)}
    snapshot = ClusterSnapshot(NOW, NODES, jobs, (HONEST_REPORT,), quarantined=quarantined)
    outcome = Controller(make_policy("sia"), FACTORY).round(snapshot)
    with Store.open(tmp_path / "sia.db") as store, store.transaction():
        store.record_jobs(snapshot)
        record_round(store, outcome, snapshot, dry_run=False, wall_time=NOW, timings={})


# ------------------------------------------------------------------------------------------------
# 4. One evil job on the Slurm side: the real backend over real files

# The evil job's files as its run would write them: Slurm job 101 (the fake's second), run 0,
# started by the controller in round 1 on rtx-1.
EVIL_RUN = {"sia_id": EVIL, "slurm_job_id": "101", "slurm_restart_count": 0}
ON_SLURM: dict[type[Any], dict[str, Any]] = {
    JobSpec: {**VALID[JobSpec], "sia_id": EVIL},
    MetricsReport: {**VALID[MetricsReport], **EVIL_RUN},
    RunExit: {**VALID[RunExit], **EVIL_RUN},
    RunRefusal: {**VALID[RunRefusal], **EVIL_RUN, "node_list": ["rtx-1"], "round_index": 1},
}


def _file_contents(cls: type[Any] | None) -> st.SearchStrategy[bytes | None]:
    if cls is None:
        return st.none() | PROFILE_TEXTS.map(str.encode)
    return st.none() | st.one_of(*(make(cls, ON_SLURM[cls]) for make in STRATEGIES.values()))


EVIL_FILES = st.fixed_dictionaries(
    {
        "spec.json": _file_contents(JobSpec),
        "metrics.json": _file_contents(MetricsReport),
        "profile.json": _file_contents(None),
    }
)


@contextmanager
def fake_slurm_in_a_fresh_state() -> Iterator[FakeSlurm]:
    """A :class:`FakeSlurm` over a fresh state tree with jobs ``good`` and ``evil`` submitted
    (as sia-sbatch does), removed afterwards: each example starts clean."""
    with tempfile.TemporaryDirectory(prefix="hostile-") as tmp:
        paths = StatePaths(Path(tmp) / "state")
        set_up(paths.state_dir, os.geteuid(), os.getegid())
        fake = FakeSlurm(paths, FakeClock())
        assert fake.submit("good") == "100"
        assert fake.submit(EVIL) == EVIL_RUN["slurm_job_id"]
        yield fake


def what_the_good_job_sees(snapshot: ClusterSnapshot) -> tuple[object, ...]:
    """The nodes (GPUs usable) and the honest job's snapshot: none of it holds a path."""
    return snapshot.nodes, [job for job in snapshot.jobs if job.sia_id == "good"]


@cache
def clean_snapshot() -> ClusterSnapshot:
    """The snapshot of the same two jobs, their files as sia-sbatch wrote them."""
    with fake_slurm_in_a_fresh_state() as fake:
        return backend_for(fake).snapshot()


@pytest.mark.heavy
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(files=EVIL_FILES)
def test_evil_job_files_on_slurm_quarantine_that_job_only(files: dict[str, bytes | None]) -> None:
    assume(any(data is not None for data in files.values()))
    with fake_slurm_in_a_fresh_state() as fake:
        evil_dir = fake.paths.job_dir(EVIL)
        for name, data in files.items():
            if data is not None:
                (evil_dir / name).write_bytes(data)
        snapshot = backend_for(fake).snapshot()
    assert [job.sia_id for job in snapshot.jobs if job.sia_id != EVIL] == ["good"]
    assert what_the_good_job_sees(snapshot) == what_the_good_job_sees(clean_snapshot())
    listed = [job for job in snapshot.jobs if job.sia_id == EVIL]
    assert len(listed) + (EVIL in snapshot.quarantined) == 1
    if listed:
        assert_within_bounds(listed[0].spec)
        event("evil scheduled")
    else:  # refused by a reader, naming the file: nothing else escaped it
        assert snapshot.quarantined[EVIL].startswith(f"{evil_dir}/"), snapshot.quarantined
        event("evil quarantined")
    for report in snapshot.reports:
        assert report.sia_id == EVIL and report.slurm_job_id == "101"
        assert_within_bounds(report)
        event("evil's report handed on")


def evil_run(fake: FakeSlurm, ending: str) -> SlurmBackend:
    """The evil job started by the controller in round 1 on rtx-1 (its assignment written,
    released, running), then, for ``ending`` ``FAILED``, failed: its launcher's records
    (``refusal-101.0.json`` while it runs, ``exit-101.0.json`` once it failed) are read."""
    backend = backend_for(fake)
    placement = (NodeShare("rtx-1", 1),)
    grant = Start(EVIL, 1, Configuration("rtx", 1, 1), placement, BatchChoice(32, 32, 0))
    (result,) = backend.apply([grant])
    assert result.ok, result.message
    fake.start(EVIL_RUN["slurm_job_id"], ["rtx-1"])
    if ending == "FAILED":
        fake.job(EVIL_RUN["slurm_job_id"]).update(
            job_state="FAILED", priority=1, state_reason="None", gres_detail=[]
        )
    return backend


@cache
def clean_run_snapshot(ending: str) -> ClusterSnapshot:
    with fake_slurm_in_a_fresh_state() as fake:
        return evil_run(fake, ending).snapshot()


_RECORDS = {"running": (RunRefusal, refusal_name), "FAILED": (RunExit, exit_name)}


@st.composite
def run_records(draw: st.DrawFn) -> tuple[str, bytes]:
    ending = draw(st.sampled_from(sorted(_RECORDS)))
    cls = _RECORDS[ending][0]
    make = draw(st.sampled_from(sorted(STRATEGIES)))
    return ending, draw(STRATEGIES[make](cls, ON_SLURM[cls]))


@pytest.mark.heavy
@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(drawn=run_records())
def test_evil_run_records_on_slurm_are_that_jobs_alone(drawn: tuple[str, bytes]) -> None:
    """A launcher's record of the evil job's run (a refusal while it runs, an exit record
    once it failed) holding anything: a bad one is ignored, never raised (the job is not even
    quarantined), and the honest job is observed as without it."""
    ending, data = drawn
    cls, name_of = _RECORDS[ending]
    with fake_slurm_in_a_fresh_state() as fake:
        backend = evil_run(fake, ending)
        path = fake.paths.job_dir(EVIL) / name_of("101", 0)
        path.write_bytes(data)
        snapshot = backend.snapshot()
    good = [job for job in snapshot.jobs if job.sia_id == "good"]
    assert good == [job for job in clean_run_snapshot(ending).jobs if job.sia_id == "good"]
    assert snapshot.quarantined == {}
    assert [job.sia_id for job in snapshot.jobs] == ["good", EVIL]
    for message in snapshot.rejected:
        if "refusal" in message:
            assert message.startswith(f"job {EVIL}: launcher's refusal ignored: {path}: ")
    event(f"{cls.__name__}: {next(j for j in snapshot.jobs if j.sia_id == EVIL).phase.value}")
