"""The protocol between releases (issue 37, item 3; docs/protocol.md, "Between releases").

A release reads its own protocol version and the one before, and writes to each job in the
version its side speaks. ``tests/fixtures/protocol/v1/`` holds the files release 0.2.0 writes
(protocol 1), kept as they are: when a later release changes a document, it bumps
``PROTOCOL_VERSION`` and these become the previous release's files, which it must still read.
The machinery for a version 2 is exercised here with a document that has a field of version 2.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.core import JobKind
from sia_slurm.protocol import (
    FIELD_BOUNDS,
    OLDEST_PROTOCOL,
    PROTOCOL_VERSION,
    Assignment,
    Document,
    JobSpec,
    MetricsReport,
    ProtocolError,
    RunExit,
    RunRefusal,
    StopRequest,
    document_json,
    from_json,
    to_json,
)

FIXTURES = Path(__file__).parent / "fixtures" / "protocol"

# What each file of protocol 1 held as release 0.2.0 wrote it (tests/fixtures/protocol/v1).
REFERENCE: dict[str, Document] = {
    "spec.json": JobSpec(
        "alice-1",
        "bert",
        kind=JobKind.ADAPTIVE,
        init_batch_size=12,
        max_gpus=8,
        submit_time=1764320000.5,
        checkpoint_dir="/home/alice/ckpt",
        command=("python", "train.py", "--lr", "0.1"),
        owner_uid=1001,
        max_failures=2,
    ),
    "assignment.json": Assignment(
        "alice-1",
        7,
        "a100",
        "a100",
        1,
        2,
        ("node-a1",),
        48,
        24,
        0,
        restarts=1,
        slurm_job_id="41",
        slurm_restart_count=1,
        not_before=1764320060.0,
    ),
    "assignment-profiling.json": Assignment(
        "bob-2", 3, "t4", "t4", 1, 1, ("node-t1",), 32, 32, 0, profile_sweep=(8, 16, 32, 64)
    ),
    "stop.json": StopRequest("alice-1", 8, 1764320120.25),
    "metrics.json": MetricsReport(
        "alice-1",
        1764320100.0,
        "a100",
        1,
        2,
        24,
        0,
        0.125,
        0.01,
        2.5,
        40.0,
        steps=300,
        round_index=7,
        slurm_job_id="41",
        slurm_restart_count=1,
        node_list=("node-a1",),
    ),
    "exit-41.1.json": RunExit("alice-1", "41", 1, "completed", 0, 1764320300.0, "done"),
    "refusal-41.1.json": RunRefusal(
        "alice-1", "41", 1, ("node-a1",), 7, 1764320061.0, "assignment is for another run"
    ),
}


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_the_kept_files_of_protocol_1_read_as_they_were_written(name: str) -> None:
    reference = REFERENCE[name]
    payload = json.loads((FIXTURES / "v1" / name).read_text())
    assert payload["version"] == 1
    assert from_json(type(reference), payload, name) == reference  # type: ignore[type-var]


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_this_release_writes_protocol_1_files_byte_for_byte_as_kept(name: str) -> None:
    """Fails when a document's JSON form changes: then the change is a new protocol version
    (PROTOCOL_VERSION + 1; the fields it adds carry ``metadata={"since": N}``), and these
    files stay as the previous release's, still read by the test above."""
    kept = json.loads((FIXTURES / "v1" / name).read_text())
    assert to_json(REFERENCE[name], 1) == kept


def test_this_release_reads_its_own_protocol_and_the_one_before() -> None:
    assert PROTOCOL_VERSION - OLDEST_PROTOCOL <= 1 and OLDEST_PROTOCOL >= 1


# ---- the machinery for a second version, with a document that has a field of version 2 --------


@dataclass(frozen=True)
class StopV2:
    """A stop request as a version 2 might have it: a ``grace_s`` added."""

    sia_id: str
    round_index: int
    time: float = 0.0
    grace_s: float = field(default=0.0, metadata={"since": 2})
    version: int = 2


@pytest.fixture
def version_2(monkeypatch: pytest.MonkeyPatch) -> None:
    """This release as if it spoke protocol 2 (and so read 1 and 2)."""
    monkeypatch.setattr(document_json, "PROTOCOL_VERSION", 2)
    monkeypatch.setattr(document_json, "OLDEST_PROTOCOL", 1)
    monkeypatch.setitem(FIELD_BOUNDS, StopV2, FIELD_BOUNDS[StopRequest])  # type: ignore[index]


def _read(payload: dict[str, Any]) -> StopV2:
    return from_json(StopV2, payload, "stop.json")  # type: ignore[type-var]


@pytest.mark.usefixtures("version_2")
def test_a_previous_version_document_reads_with_the_new_fields_defaults() -> None:
    old = _read({"sia_id": "j", "round_index": 3, "time": 1.0, "version": 1})
    assert old == StopV2("j", 3, 1.0, 0.0, version=1)  # the writer's version is kept
    new = _read({"sia_id": "j", "round_index": 3, "grace_s": 5.0, "version": 2})
    assert new.grace_s == 5.0 and new.version == 2
    with pytest.raises(ProtocolError, match=r"stop.json: unknown field\(s\) grace_s in protocol 1"):
        _read({"sia_id": "j", "round_index": 3, "grace_s": 5.0, "version": 1})


@pytest.mark.usefixtures("version_2")
def test_writing_for_a_reader_of_the_previous_version_leaves_out_only_defaults() -> None:
    assert to_json(StopV2("j", 3, 1.0), 1) == {
        "sia_id": "j",
        "round_index": 3,
        "time": 1.0,
        "version": 1,
    }
    assert to_json(StopV2("j", 3, 1.0, 5.0))["grace_s"] == 5.0  # its own version: version 2
    with pytest.raises(ProtocolError, match=r"grace_s \(protocol 2\) holds 5.0, which a reader"):
        to_json(StopV2("j", 3, 1.0, 5.0), 1)


@pytest.mark.usefixtures("version_2")
def test_versions_outside_the_two_are_refused_saying_what_to_do() -> None:
    with pytest.raises(ProtocolError, match=r"newer than this sia-slurm's 2: .* upgrade"):
        _read({"sia_id": "j", "round_index": 3, "version": 3})
    with pytest.raises(ProtocolError, match=r"reads protocols 1 to 2 .* must end before"):
        _read({"sia_id": "j", "round_index": 3, "version": 0})
    with pytest.raises(ProtocolError, match="version: expected an integer"):
        _read({"sia_id": "j", "round_index": 3, "version": "2"})
    with pytest.raises(ProtocolError, match="cannot be written in protocol 0"):
        to_json(StopV2("j", 3), 0)


@pytest.mark.usefixtures("version_2")
def test_a_renamed_field_is_carried_forward_and_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """A field renamed by version 2 (``when`` in 1, ``time`` in 2): UPGRADES reads a version 1
    file, DOWNGRADES writes one."""

    def up(payload: dict[str, Any]) -> dict[str, Any]:
        payload["time"] = payload.pop("when", 0.0)
        return payload

    def down(payload: dict[str, Any]) -> dict[str, Any]:
        payload["when"] = payload.pop("time")
        return payload

    monkeypatch.setitem(document_json.UPGRADES, (StopV2, 1), up)
    monkeypatch.setitem(document_json.DOWNGRADES, (StopV2, 1), down)
    old = {"sia_id": "j", "round_index": 3, "when": 9.0, "version": 1}
    assert _read(old) == StopV2("j", 3, 9.0, version=1)
    assert to_json(StopV2("j", 3, 9.0), 1) == old
    monkeypatch.delitem(document_json.UPGRADES, (StopV2, 1))
    with pytest.raises(ProtocolError, match=r"unknown field\(s\) when"):  # without it: refused
        _read(old)
