"""What Slurm says its partitions and nodes are: parsed from ``scontrol -o show``.

``scontrol -o show node|partition`` prints one record per line as ``Key=Value`` pairs on every
Slurm version sia-slurm supports (the JSON forms differ between versions), which
:func:`sia_slurm.slurm.records.parse_records` splits. The parsers are pure functions over that
text, tested against output captured from real daemons.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sia_slurm.slurm.observe.hostlist import split_top_level
from sia_slurm.slurm.records import parse_records
from sia_slurm.slurm.runner import CommandRunner

_GRES_ITEM = re.compile(r"^(?P<name>[A-Za-z0-9_]+)(?::(?P<type>[A-Za-z0-9_.\-]+))?:(?P<count>\d+)")
# Node states in which the node's GPUs are no capacity for the policy. A node powered down by
# Slurm's power saving (IDLE+POWERED_DOWN) is capacity: Slurm boots it for the job it
# allocates it to; while it boots (POWERING_UP) it is NOT_RESPONDING, and that is expected. One
# about to power down (POWER_DOWN) or powering down is no capacity: Slurm starts nothing there.
# A boot that fails sets it DOWN (docs/slurm-actuation.md, "A node that fails to boot").
_UNUSABLE_STATES = (
    "DOWN",
    "DRAIN",
    "FAIL",
    "INVAL",
    "MAINT",
    "NOT_RESPONDING",
    "POWER_DOWN",
    "POWERING_DOWN",
    "FUTURE",
    "UNKNOWN",
    "RESERVED",
)


@dataclass(frozen=True)
class GresEntry:
    """One generic resource of a node, e.g. ``gpu:a100:4`` -> ("gpu", "a100", 4)."""

    name: str
    type: str | None
    count: int

    def __str__(self) -> str:
        middle = f":{self.type}" if self.type else ""
        return f"{self.name}{middle}:{self.count}"


@dataclass(frozen=True)
class NodeInfo:
    name: str
    state: str  # Slurm's state string, e.g. IDLE, MIXED, IDLE+DRAIN, DOWN*
    partitions: tuple[str, ...]
    gres: tuple[GresEntry, ...]
    cpus: int
    gpus_used: int = 0  # GPUs Slurm counts as allocated (GresUsed, with ``scontrol -d``)

    @property
    def usable(self) -> bool:
        """False when the node is down, drained, reserved or otherwise not schedulable."""
        flags = set(re.split(r"[+*~#!%$@^-]", self.state.upper()))
        if "POWERING_UP" in flags:
            flags.discard("NOT_RESPONDING")
        return not flags & set(_UNUSABLE_STATES)

    def gpus(self, gpu_type: str | None = None) -> int:
        """GPUs on the node, of ``gpu_type`` only when given."""
        return sum(
            entry.count
            for entry in self.gres
            if entry.name == "gpu" and (gpu_type is None or entry.type == gpu_type)
        )


@dataclass(frozen=True)
class PartitionInfo:
    name: str
    state: str  # UP, DOWN, DRAIN, INACTIVE
    node_expr: str  # Slurm's hostlist expression, e.g. a100-[1-2]


@dataclass(frozen=True)
class SlurmInventory:
    partitions: tuple[PartitionInfo, ...]
    nodes: tuple[NodeInfo, ...]

    def partition(self, name: str) -> PartitionInfo | None:
        return next((p for p in self.partitions if p.name == name), None)

    def nodes_of(self, partition: str) -> tuple[NodeInfo, ...]:
        return tuple(node for node in self.nodes if partition in node.partitions)


def parse_gres(text: str) -> tuple[GresEntry, ...]:
    """Parse a GRES string such as ``gpu:a100:4(S:0),gpu:t4:2`` (``(null)`` is none)."""
    if not text or text in ("(null)", "N/A"):
        return ()
    entries = []
    for item in split_top_level(text, "()", strict=False):
        match = _GRES_ITEM.match(item.strip())
        if match is None:
            raise ValueError(f"cannot parse GRES item {item!r} in {text!r}")
        entries.append(GresEntry(match["name"], match["type"], int(match["count"])))
    return tuple(entries)


def parse_nodes(text: str) -> tuple[NodeInfo, ...]:
    nodes = []
    for record in parse_records(text):
        if "NodeName" not in record:
            raise ValueError(f"not a node record (no NodeName=): {record!r}")
        partitions = record.get("Partitions", "")
        nodes.append(
            NodeInfo(
                name=record["NodeName"],
                state=record.get("State", "UNKNOWN"),
                partitions=tuple(p for p in partitions.split(",") if p and p != "(null)"),
                gres=parse_gres(record.get("Gres", "")),
                cpus=int(record.get("CPUTot", "0") or 0),
                gpus_used=sum(
                    e.count for e in parse_gres(record.get("GresUsed", "")) if e.name == "gpu"
                ),
            )
        )
    return tuple(nodes)


def parse_partitions(text: str) -> tuple[PartitionInfo, ...]:
    partitions = []
    for record in parse_records(text):
        if "PartitionName" not in record:
            raise ValueError(f"not a partition record (no PartitionName=): {record!r}")
        partitions.append(
            PartitionInfo(
                name=record["PartitionName"],
                state=record.get("State", "UNKNOWN"),
                node_expr=record.get("Nodes", ""),
            )
        )
    return tuple(partitions)


def read_inventory(runner: CommandRunner) -> SlurmInventory:
    """Two commands, whatever the cluster size: all partitions, then all nodes."""
    partitions = runner.run(["scontrol", "-o", "show", "partition"]).stdout
    nodes = runner.run(["scontrol", "-o", "show", "node"]).stdout
    return SlurmInventory(parse_partitions(partitions), parse_nodes(nodes))
