"""The shape of a dev cluster: ``a100:2x4,rtx:2x4,t4:2x4`` = GPU type : nodes x GPUs per node."""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_SPEC = "a100:2x4,rtx:2x4,t4:2x4"
_GROUP = re.compile(r"^(?P<type>[a-z][a-z0-9_]*):(?P<nodes>\d+)x(?P<gpus>\d+)$")


@dataclass(frozen=True)
class NodeGroupSpec:
    """``nodes`` nodes of ``gpus_per_node`` GPUs of ``gpu_type``, in a partition of that name."""

    gpu_type: str
    nodes: int
    gpus_per_node: int

    @property
    def partition(self) -> str:
        return self.gpu_type

    def node_names(self) -> list[str]:
        return [f"{self.gpu_type}-{i}" for i in range(1, self.nodes + 1)]


@dataclass(frozen=True)
class DevClusterSpec:
    groups: tuple[NodeGroupSpec, ...]

    @classmethod
    def parse(cls, text: str) -> DevClusterSpec:
        """Parse ``TYPE:NODESxGPUS[,...]``; raise ValueError naming the bad part."""
        groups = []
        for part in (p.strip() for p in text.split(",")):
            match = _GROUP.match(part)
            if match is None:
                raise ValueError(
                    f"bad cluster spec part {part!r} in {text!r}: expected TYPE:NODESxGPUS "
                    "with a lower-case type name, e.g. a100:2x4"
                )
            group = NodeGroupSpec(match["type"], int(match["nodes"]), int(match["gpus"]))
            if not 1 <= group.nodes <= 64 or not 1 <= group.gpus_per_node <= 64:
                raise ValueError(
                    f"bad cluster spec part {part!r}: nodes and GPUs per node "
                    "must be between 1 and 64"
                )
            if any(g.gpu_type == group.gpu_type for g in groups):
                raise ValueError(f"GPU type {group.gpu_type!r} appears twice in {text!r}")
            groups.append(group)
        return cls(tuple(groups))

    def __str__(self) -> str:
        return ",".join(f"{g.gpu_type}:{g.nodes}x{g.gpus_per_node}" for g in self.groups)

    def node_names(self) -> list[str]:
        return [name for group in self.groups for name in group.node_names()]
