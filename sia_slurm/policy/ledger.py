"""Free GPUs per node, for policies that allocate whole requested shapes (FIFO, Gavel).

Counting free GPUs per *type* lets such a policy grant a shape that no set of nodes can hold
(12 GPUs on three 4-GPU nodes when every node has one GPU busy); placement then leaves the job
unplaced round after round while the policy believes it runs. A :class:`NodeLedger` makes the
policy grant only shapes that fit on nodes, with the same rules placement uses: a job keeps its
nodes when they are still free, otherwise best fit (fullest nodes first).
"""

from __future__ import annotations

from collections.abc import Iterable

from sia_slurm.core import Configuration
from sia_slurm.policy.base import ClusterView, NodeShare
from sia_slurm.policy.configs import node_shares


class NodeLedger:
    """Usable GPUs left on each node while a policy hands out shapes."""

    def __init__(self, cluster: ClusterView) -> None:
        self._free = {node.name: node.usable_gpus for node in cluster.nodes}
        self._type = {node.name: node.gpu_type for node in cluster.nodes}
        self._order = {node.name: i for i, node in enumerate(cluster.nodes)}

    def take(
        self, config: Configuration, keep: Iterable[NodeShare] = ()
    ) -> tuple[NodeShare, ...] | None:
        """Reserve ``config`` on nodes and return the shares, or ``None`` if it does not fit.

        ``keep`` (a job's current shares) is used when it matches ``config`` and is still free.
        """
        shares = self._kept(config, tuple(keep)) or self._best_fit(config)
        if shares is not None:
            for share in shares:
                self._free[share.node] -= share.gpus
        return shares

    def _kept(
        self, config: Configuration, keep: tuple[NodeShare, ...]
    ) -> tuple[NodeShare, ...] | None:
        if not keep or sum(s.gpus for s in keep) != config.gpus or len(keep) != config.nodes:
            return None
        ok = all(
            self._type.get(s.node) == config.gpu_type and self._free.get(s.node, 0) >= s.gpus
            for s in keep
        )
        return keep if ok else None

    def _best_fit(self, config: Configuration) -> tuple[NodeShare, ...] | None:
        nodes = sorted(
            (node for node, gpu_type in self._type.items() if gpu_type == config.gpu_type),
            key=lambda node: (self._free[node], self._order[node]),
        )
        used: set[str] = set()
        shares = []
        for gpus in node_shares(config):
            node = next((n for n in nodes if n not in used and self._free[n] >= gpus), None)
            if node is None:
                return None
            used.add(node)
            shares.append(NodeShare(node, gpus))
        return tuple(shares)
