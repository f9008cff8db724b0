"""Does the configured partition-to-GPU map match the running Slurm?

``sia-slurm config check --live`` reads the inventory once and compares it with the config:
every mapped partition must exist and every node in it must carry ``gpus_per_node`` GPUs of the
mapped type. Nodes that are down or drained are reported as warnings (they are simply no capacity
for the policy), mismatches as errors.
"""

from __future__ import annotations

from dataclasses import dataclass

from sia_slurm.config import SiaConfig
from sia_slurm.slurm.observe.inventory import SlurmInventory


@dataclass(frozen=True)
class LiveCheckReport:
    errors: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.errors


def check_live(config: SiaConfig, inventory: SlurmInventory) -> LiveCheckReport:
    errors: list[str] = []
    warnings: list[str] = []
    known = ", ".join(p.name for p in inventory.partitions) or "none"
    for mapped in config.partitions:
        where = f"partitions.{mapped.name}"
        partition = inventory.partition(mapped.name)
        if partition is None:
            errors.append(f"{where}: Slurm has no partition {mapped.name!r} (it has: {known})")
            continue
        if partition.state.upper() != "UP":
            warnings.append(f"{where}: partition is {partition.state}, jobs cannot start there")
        nodes = inventory.nodes_of(mapped.name)
        if not nodes:
            errors.append(f"{where}: partition {mapped.name!r} has no nodes")
            continue
        expected = f"gpu:{mapped.gpu_type}:{mapped.gpus_per_node}"
        for node in nodes:
            have = node.gpus(mapped.gpu_type)
            if have != mapped.gpus_per_node:
                found = ",".join(str(g) for g in node.gres) or "no GRES"
                errors.append(
                    f"{where}: node {node.name} has Gres={found}, expected {expected} "
                    f"(gpu_type={mapped.gpu_type}, gpus_per_node={mapped.gpus_per_node})"
                )
            elif node.gpus() != have:
                warnings.append(
                    f"{where}: node {node.name} also has GPUs of other types "
                    f"({','.join(str(g) for g in node.gres)}); only {expected} is used"
                )
            if not node.usable:
                warnings.append(
                    f"{where}: node {node.name} is {node.state}: not capacity for "
                    "the scheduler until it is back"
                )
    mapped_names = {p.name for p in config.partitions}
    managed_nodes = {n.name for name in mapped_names for n in inventory.nodes_of(name)}
    for partition in inventory.partitions:
        gpu_nodes = [n for n in inventory.nodes_of(partition.name) if n.gpus() > 0]
        if partition.name in mapped_names or not gpu_nodes:
            continue
        if all(n.name in managed_nodes for n in gpu_nodes):
            # An overlay such as a preempting partition: said, but nothing is wrong with it.
            warnings.append(
                f"partition {partition.name!r} overlays managed nodes: its jobs' GPUs count as "
                "taken, and a managed job it preempts is brought back from its checkpoint"
            )
        else:
            warnings.append(
                f"partition {partition.name!r} has GPU nodes but is not mapped: "
                "sia-slurm will not schedule onto it"
            )
    return LiveCheckReport(tuple(errors), tuple(warnings))
