"""The live check's logic against inventories parsed from real output (no daemons needed)."""

from __future__ import annotations

import re
from pathlib import Path

from sia_slurm.cli.live_check import check_live
from sia_slurm.config import parse_config
from sia_slurm.slurm.observe.inventory import SlurmInventory, parse_nodes, parse_partitions

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-22.05"
INVENTORY = SlurmInventory(
    parse_partitions((FIXTURES / "show-partition.txt").read_text()),
    parse_nodes((FIXTURES / "show-node.txt").read_text()),
)


def config(partitions: str):
    return parse_config(f"state_dir: /tmp/x\npartitions:\n{partitions}")


def test_matching_map_passes_with_a_drain_warning() -> None:
    report = check_live(
        config(
            "  a100: {gpu_type: a100, gpus_per_node: 4}\n"
            "  rtx: {gpu_type: rtx, gpus_per_node: 4}\n"
            "  t4: {gpu_type: t4, gpus_per_node: 4}\n"
        ),
        INVENTORY,
    )
    assert report.ok and report.errors == ()
    assert report.warnings == (
        "partitions.t4: node t4-2 is IDLE+DRAIN: not capacity for the scheduler until it is back",
    )


def test_mismatches_are_each_reported() -> None:
    report = check_live(
        config(
            "  a100: {gpu_type: a100, gpus_per_node: 8}\n"
            "  rtx: {gpu_type: t4, gpus_per_node: 4}\n"
            "  v100: {gpu_type: v100, gpus_per_node: 8}\n"
        ),
        INVENTORY,
    )
    assert not report.ok
    assert report.errors == (
        "partitions.a100: node a100-1 has Gres=gpu:a100:4, expected gpu:a100:8 "
        "(gpu_type=a100, gpus_per_node=8)",
        "partitions.a100: node a100-2 has Gres=gpu:a100:4, expected gpu:a100:8 "
        "(gpu_type=a100, gpus_per_node=8)",
        "partitions.rtx: node rtx-1 has Gres=gpu:rtx:4, expected gpu:t4:4 "
        "(gpu_type=t4, gpus_per_node=4)",
        "partitions.rtx: node rtx-2 has Gres=gpu:rtx:4, expected gpu:t4:4 "
        "(gpu_type=t4, gpus_per_node=4)",
        "partitions.v100: Slurm has no partition 'v100' (it has: a100, rtx, t4)",
    )
    assert "partition 't4' has GPU nodes but is not mapped" in report.warnings[-1]


def test_an_unmapped_partition_over_managed_nodes_is_said_as_an_overlay() -> None:
    """A preempting partition over the managed nodes (the dev cluster's hidden ``urgent``)
    is no mistake: said for what it is, not as GPUs the scheduler cannot reach."""
    urgent = (
        "PartitionName=urgent AllowGroups=ALL Default=NO Hidden=YES Nodes=a100-[1-2],t4-1 "
        "PriorityTier=10 State=UP TotalNodes=3"
    )
    partitions = (FIXTURES / "show-partition.txt").read_text() + urgent + "\n"
    lines = (FIXTURES / "show-node.txt").read_text().splitlines()
    overlaid = ("NodeName=a100-1 ", "NodeName=a100-2 ", "NodeName=t4-1 ")
    nodes = "\n".join(  # each node lists the partitions it is in
        re.sub(r"Partitions=(\S+)", r"Partitions=\1,urgent", line) if line.startswith(overlaid)
        else line
        for line in lines
    )  # fmt: skip
    inventory = SlurmInventory(parse_partitions(partitions), parse_nodes(nodes))
    report = check_live(
        config(
            "  a100: {gpu_type: a100, gpus_per_node: 4}\n"
            "  rtx: {gpu_type: rtx, gpus_per_node: 4}\n"
            "  t4: {gpu_type: t4, gpus_per_node: 4}\n"
        ),
        inventory,
    )
    assert report.ok
    assert report.warnings[-1] == (
        "partition 'urgent' overlays managed nodes: its jobs' GPUs count as taken, and a "
        "managed job it preempts is brought back from its checkpoint"
    )
