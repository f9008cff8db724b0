"""Parsers of ``scontrol -o show`` against output captured from the real 22.05 dev cluster
(tests/fixtures/slurm-22.05/: node t4-2 drained with a reason, one job on rtx-1)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from sia_slurm.slurm.inventory import (
    GresEntry,
    parse_gres,
    parse_nodes,
    parse_partitions,
    parse_records,
    read_inventory,
)
from sia_slurm.slurm.runner import CommandResult

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-22.05"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_nodes_from_real_output() -> None:
    nodes = {n.name: n for n in parse_nodes(fixture("show-node.txt"))}
    assert sorted(nodes) == ["a100-1", "a100-2", "rtx-1", "rtx-2", "t4-1", "t4-2"]
    assert nodes["a100-1"].gres == (GresEntry("gpu", "a100", 4),)
    assert nodes["a100-1"].partitions == ("a100",)
    assert nodes["a100-1"].gpus("a100") == 4 and nodes["a100-1"].gpus("t4") == 0
    assert nodes["a100-1"].cpus == 8
    assert nodes["rtx-1"].state == "MIXED" and nodes["rtx-1"].usable
    assert nodes["t4-2"].state == "IDLE+DRAIN" and not nodes["t4-2"].usable


def test_values_with_spaces_stay_whole() -> None:
    (record,) = parse_records(fixture("show-node.txt").splitlines()[5])
    assert record["NodeName"] == "t4-2"
    assert record["Reason"].startswith("fan failure")
    assert record["OS"].startswith("Linux ") and " " in record["OS"]


def test_partitions_from_real_output() -> None:
    partitions = parse_partitions(fixture("show-partition.txt"))
    assert [(p.name, p.state, p.node_expr) for p in partitions] == [
        ("a100", "UP", "a100-[1-2]"),
        ("rtx", "UP", "rtx-[1-2]"),
        ("t4", "UP", "t4-[1-2]"),
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("gpu:a100:4", (GresEntry("gpu", "a100", 4),)),
        ("gpu:a100:4(S:0-1)", (GresEntry("gpu", "a100", 4),)),
        ("gpu:4", (GresEntry("gpu", None, 4),)),
        ("gpu:a100:2(S:0),gpu:t4:1", (GresEntry("gpu", "a100", 2), GresEntry("gpu", "t4", 1))),
        ("(null)", ()),
        ("", ()),
    ],
)
def test_gres_strings(text: str, expected: tuple[GresEntry, ...]) -> None:
    assert parse_gres(text) == expected


def test_bad_gres_names_the_text() -> None:
    with pytest.raises(ValueError, match=r"cannot parse GRES item 'gpu' in 'gpu'"):
        parse_gres("gpu")


@pytest.mark.parametrize(
    ("state", "usable"),
    [
        ("IDLE", True),
        ("MIXED", True),
        ("ALLOCATED", True),
        ("IDLE+DRAIN", False),
        ("DOWN*", False),
        ("IDLE*", True),
        ("MIXED+DRAIN", False),
        ("IDLE+RESERVED", False),
        ("IDLE+MAINT", False),
        ("DOWN+NOT_RESPONDING", False),
    ],
)
def test_usable_states(state: str, usable: bool) -> None:
    line = f"NodeName=n1 State={state} Gres=gpu:t4:4 Partitions=t4 CPUTot=4"
    (node,) = parse_nodes(line)
    assert node.usable is usable


def test_not_a_node_record() -> None:
    with pytest.raises(ValueError, match="no NodeName="):
        parse_nodes(fixture("show-partition.txt"))


class RecordingRunner:
    """A fake runner: answers from captured output and records every argv."""

    def __init__(self, answers: dict[tuple[str, ...], str]):
        self.answers = answers
        self.calls: list[tuple[str, ...]] = []

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        self.calls.append(tuple(argv))
        return CommandResult(tuple(argv), 0, self.answers[tuple(argv)], "")


def test_read_inventory_issues_two_commands() -> None:
    runner = RecordingRunner(
        {
            ("scontrol", "-o", "show", "partition"): fixture("show-partition.txt"),
            ("scontrol", "-o", "show", "node"): fixture("show-node.txt"),
        }
    )
    inventory = read_inventory(runner)
    assert runner.calls == [
        ("scontrol", "-o", "show", "partition"),
        ("scontrol", "-o", "show", "node"),
    ]
    assert [n.name for n in inventory.nodes_of("t4")] == ["t4-1", "t4-2"]
    assert inventory.partition("rtx") is not None and inventory.partition("v100") is None
