"""The door's bounds: every hostile value a JSON parser accepts is refused by the reader,
naming the file and the field, and docs/protocol.md's table is the code's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sia_slurm.protocol import (
    FIELD_BOUNDS,
    JobSpec,
    MetricsReport,
    ProtocolError,
    RunExit,
    bounds_table,
    read_document,
)
from sia_slurm.safefiles import MAX_DEPTH, MAX_ITEMS, MAX_STRING_CHARS, parse_json

DOCS = Path(__file__).resolve().parents[1] / "docs" / "protocol.md"


def _report(**overrides: object) -> dict[str, object]:
    payload: dict[str, object] = {
        "sia_id": "j1", "time": 10.0, "gpu_type": "a100", "nodes": 1, "gpus": 2,
        "local_bsz": 64, "accum_steps": 0, "step_time": 0.2, "sync_time": 0.05,
        "grad_sqr": 1.5, "grad_var": 3.0,
    }  # fmt: skip
    payload.update(overrides)
    return payload


def _refused(tmp_path: Path, cls: type, text: str) -> str:
    path = tmp_path / "doc.json"
    path.write_text(text)
    with pytest.raises(ProtocolError) as excinfo:
        read_document(cls, path)
    message = str(excinfo.value)
    assert message.startswith(f"{path}: ")
    return message


def _raw(payload: dict[str, object], field: str, literal: str) -> str:
    """``payload`` as JSON with ``field``'s value spelled ``literal`` verbatim."""
    text = json.dumps({**payload, field: "@@"})
    return text.replace('"@@"', literal)


def test_the_docs_table_is_the_codes() -> None:
    text = DOCS.read_text()
    start = text.index("<!-- bounds-table -->\n") + len("<!-- bounds-table -->\n")
    assert text[start : text.index("<!-- /bounds-table -->")] == bounds_table()


@pytest.mark.parametrize(
    ("field", "literal", "said"),
    [
        ("local_bsz", "1" * 5000, "local_bsz: an integer of 5000 digits"),
        ("steps", "-" + "9" * 20, "steps: an integer of 20 digits"),
        ("grad_var", "NaN", "grad_var: not a finite number"),
        ("grad_sqr", "Infinity", "grad_sqr: not a finite number"),
        ("step_time", "1e400", "step_time: not a finite number"),
        ("grad_var", "1e299", "grad_var: expected <= 1e+30"),
        ("step_time", "1e9", "step_time: expected <= 86400"),
        ("gpus", "1000000", "gpus: expected <= 100000"),
        ("accum_steps", "70000", "accum_steps: expected <= 65536"),
        ("gpu_type", json.dumps("a100\x1b[2J"), "gpu_type: holds the control character"),
        ("gpu_type", json.dumps("a100\n"), "gpu_type: expected a name"),
        ("gpu_type", json.dumps("x" * (MAX_STRING_CHARS + 1)), "gpu_type: of 4097 characters"),
        ("node_list", json.dumps(["n"] * (MAX_ITEMS + 1)), "node_list: 1025 items"),
        ("node_list", "[" * 20 + "]" * 20, "node_list"),
        ("time", "[" * 10_000 + "]" * 10_000, "nested deeper than 8 levels"),
    ],
    ids=lambda value: value if len(str(value)) < 30 else f"{str(value)[:12]}..",
)
def test_a_hostile_metrics_value_is_refused_naming_the_field(
    tmp_path: Path, field: str, literal: str, said: str
) -> None:
    assert said in _refused(tmp_path, MetricsReport, _raw(_report(), field, literal))


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"app": "cifar\x1b]8;;http://x\x07"}, "app: holds the control character"),
        ({"app": "../../etc"}, "app: expected a name"),
        ({"sia_id": "a\n"}, "sia job id"),
        ({"command": ["x"] * (MAX_ITEMS + 1)}, "command: 1025 items"),
        ({"checkpoint_dir": "/a\n/b"}, "checkpoint_dir: expected one line of text"),
        ({"max_gpus": 10**15}, "max_gpus: expected <= 100000"),
        ({"owner_uid": -1}, "owner_uid: expected >= 0"),
        ({"restart_cost": -0.5}, "restart_cost: expected >= 0"),
        ({"init_batch_size": 2**40}, "init_batch_size: expected <= 16777216"),
    ],
)
def test_a_hostile_spec_value_is_refused_naming_the_field(
    tmp_path: Path, overrides: dict[str, object], said: str
) -> None:
    payload = {"sia_id": "j1", "app": "cifar10", **overrides}
    assert said in _refused(tmp_path, JobSpec, json.dumps(payload))


def test_a_command_keeps_its_newlines_and_tabs(tmp_path: Path) -> None:
    """A ``python -c`` script spans lines: the reader lets tab and newline through in free
    text (every printer escapes them), and only there."""
    path = tmp_path / "spec.json"
    command = ["python", "-c", "import os\n\tprint(1)"]
    path.write_text(json.dumps({"sia_id": "j1", "app": "cifar10", "command": command}))
    assert read_document(JobSpec, path).command == tuple(command)


def test_an_exit_message_is_cut_not_refused(tmp_path: Path) -> None:
    path = tmp_path / "exit.json"
    payload = {
        "sia_id": "j1", "slurm_job_id": "7", "slurm_restart_count": 0, "cause": "failed",
        "status": 1, "message": "m" * 3000,
    }  # fmt: skip
    path.write_text(json.dumps(payload))
    assert len(read_document(RunExit, path).message) == 2000


def test_depth_is_counted_from_the_document() -> None:
    nested: object = 1
    for _ in range(MAX_DEPTH - 1):
        nested = [nested]
    assert parse_json(json.dumps({"a": nested}).encode(), "f")  # exactly MAX_DEPTH: read
    with pytest.raises(ProtocolError, match="nested deeper"):
        parse_json(json.dumps({"a": [nested]}).encode(), "f")


def test_every_numeric_field_has_a_bound() -> None:
    """A new field cannot slip in unbounded: every int and float field of every document
    has an entry in FIELD_BOUNDS."""
    from dataclasses import fields

    for cls, bounds in FIELD_BOUNDS.items():
        for spec in fields(cls):
            if spec.name != "version" and str(spec.type).split(" ")[0] in ("int", "float"):
                assert spec.name in bounds, f"{cls.__name__}.{spec.name} has no bound"
