"""Parsers of ``scontrol -o show`` against output captured from the real 22.05 dev cluster
(tests/fixtures/slurm-22.05/: node t4-2 drained with a reason, one job on rtx-1), and, in the
``*_on_every_release`` tests, against the captures of 22.05, 24.11 and 26.05 alike."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from sia_slurm.slurm.observe.inventory import (
    GresEntry,
    parse_gres,
    parse_nodes,
    parse_partitions,
    read_inventory,
)
from sia_slurm.slurm.records import parse_records
from sia_slurm.slurm.runner import CommandResult

FIXTURE_ROOT = Path(__file__).resolve().parent.parent / "fixtures"
FIXTURES = FIXTURE_ROOT / "slurm-22.05"
RELEASES = ("22.05", "24.11", "26.05")


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
        # Slurm's power saving, as the dev cluster's showed them (22.05, 24.11, 26.05): a
        # powered-down node is booted for the job Slurm allocates it, and is NOT_RESPONDING
        # while it boots; one about to power down is not; a failed boot leaves it DOWN.
        ("IDLE+POWERED_DOWN", True),
        ("MIXED+POWERED_DOWN", True),
        ("MIXED+NOT_RESPONDING+POWERING_UP", True),
        ("IDLE+POWER_DOWN", False),
        ("IDLE+POWERING_DOWN", False),
        ("IDLE+DRAIN+POWERED_DOWN", False),
        ("DOWN+POWERED_DOWN+NOT_RESPONDING", False),
        ("DOWN+POWERED_DOWN", False),
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


# ------------------------------------------------------------------------------------------------
# Every release's captures (a100-[1-2], rtx-[1-2], t4-[1-2], 4 GPUs and 8 CPUs each)


def release_fixture(release: str, name: str) -> str:
    return (FIXTURE_ROOT / f"slurm-{release}" / name).read_text()


# show-node.txt: 22.05 was captured with rtx-1 running a job and t4-2 drained; 24.11 and 26.05
# by the capture script (run-1 on a100-1, a 2-node job on rtx-[1-2], an --exclusive job on t4-1).
NODE_STATES = {
    "22.05": {"a100-1": "IDLE", "rtx-1": "MIXED", "t4-2": "IDLE+DRAIN"},
    "24.11": {"a100-1": "MIXED", "a100-2": "IDLE", "rtx-1": "MIXED", "t4-1": "ALLOCATED"},
    "26.05": {"a100-1": "MIXED", "a100-2": "IDLE", "rtx-1": "MIXED", "t4-1": "ALLOCATED"},
}


@pytest.mark.parametrize("release", RELEASES)
def test_nodes_on_every_release(release: str) -> None:
    nodes = {n.name: n for n in parse_nodes(release_fixture(release, "show-node.txt"))}
    assert sorted(nodes) == ["a100-1", "a100-2", "rtx-1", "rtx-2", "t4-1", "t4-2"]
    for name, node in nodes.items():
        gpu_type = name.split("-")[0]
        assert node.gres == (GresEntry("gpu", gpu_type, 4),) and node.gpus(gpu_type) == 4
        assert node.partitions == (gpu_type,) and node.cpus == 8
    for name, state in NODE_STATES[release].items():
        assert nodes[name].state == state
        assert nodes[name].usable is ("DRAIN" not in state)

    drained = {n.name: n for n in parse_nodes(release_fixture(release, "show-node-drained.txt"))}
    assert drained["t4-2"].state == "IDLE+DRAIN" and not drained["t4-2"].usable
    (record,) = [r for r in parse_records(release_fixture(release, "show-node-drained.txt"))
                 if r["NodeName"] == "t4-2"]  # fmt: skip
    assert record["Reason"].split(" [")[0] in ("maintenance", "fan failure")


@pytest.mark.parametrize("release", RELEASES)
def test_partitions_on_every_release(release: str) -> None:
    partitions = parse_partitions(release_fixture(release, "show-partition.txt"))
    assert [(p.name, p.state, p.node_expr) for p in partitions] == [
        ("a100", "UP", "a100-[1-2]"),
        ("rtx", "UP", "rtx-[1-2]"),
        ("t4", "UP", "t4-[1-2]"),
    ]


# One running job: the GPU request is gres:gpu:TYPE:K on 22.05 and gres/gpu:K on 24.11 and 26.05.
SHOWN_JOB = {
    "22.05": ("1", "rtx", "rtx-1", "gres:gpu:rtx:2"),
    "24.11": ("8", "a100", "a100-1", "gres/gpu:2"),
    "26.05": ("8", "a100", "a100-1", "gres/gpu:2"),
}


@pytest.mark.parametrize("release", RELEASES)
def test_job_record_on_every_release(release: str) -> None:
    """Job records have keys with ':' and '/' (AllocNode:Sid=, CPUs/Task=, ReqB:S:C:T=), on
    every release: each is a key of its own, not part of the value before it."""
    (record,) = parse_records(release_fixture(release, "show-job.txt"))
    seen = (record["JobId"], record["Partition"], record["NodeList"], record["TresPerNode"])
    assert seen == SHOWN_JOB[release]
    assert record["JobState"] == "RUNNING" and record["NumTasks"] == "1"
    assert record["CPUs/Task"] == "1" and record["ReqB:S:C:T"] == "0:0:*:*"
    assert ":" in record["AllocNode:Sid"] and " " not in record["AllocNode:Sid"]
