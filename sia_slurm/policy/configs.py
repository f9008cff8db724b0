"""Configuration sets: which (GPU type, nodes, GPUs) shapes a policy may hand out.

Sia restricts each GPU type with ``N_t`` nodes of ``R_t`` GPUs to powers of two inside a node and
whole nodes across nodes (reference section 4). Power-of-two partial-node jobs pack into a node like
a buddy allocator and distributed jobs never share a node, so any set of configurations whose GPU
counts fit the type's capacity has a valid placement, and the set has only ``N_t + log2(R_t)``
entries per type instead of Pollux's ``O(N_t * R_t)``.

When ``R_t`` is not a power of two, a node is split into ``R_t / V`` power-of-two *virtual nodes*
of ``V`` GPUs, ``V`` the largest power of two dividing ``R_t`` (6 -> 3 x 2, 12 -> 3 x 4); the same
rule then applies to virtual nodes: powers of two up to ``V`` inside a virtual node, whole virtual
nodes beyond. A multi-node configuration spreads its GPUs as evenly as possible
(:func:`node_shares`).
"""

from __future__ import annotations

from sia_slurm.core import Configuration
from sia_slurm.policy.base import ClusterView, GpuTypeView


def virtual_node_size(gpus_per_node: int) -> int:
    """The largest power of two dividing ``gpus_per_node`` (the node itself if a power of two)."""
    return gpus_per_node & -gpus_per_node


def nodes_needed(gpus: int, gpus_per_node: int) -> int:
    """Fewest nodes of ``gpus_per_node`` GPUs that hold ``gpus`` GPUs."""
    return -(-gpus // gpus_per_node)


def node_shares(config: Configuration) -> tuple[int, ...]:
    """GPUs per node of a configuration, largest first: as even as possible over its nodes."""
    base, extra = divmod(config.gpus, config.nodes)
    return tuple([base + 1] * extra + [base] * (config.nodes - extra))


def fits_type(config: Configuration, view: GpuTypeView) -> bool:
    """Whether the type's usable nodes could hold the configuration on an empty cluster."""
    if config.gpu_type != view.gpu_type or config.gpus > view.capacity:
        return False
    if config.nodes == 1:
        return config.gpus <= view.max_node_gpus
    return config.nodes <= view.nodes_with(node_shares(config)[0])


def type_configurations(view: GpuTypeView) -> tuple[Configuration, ...]:
    """Sia's configuration set for one GPU type, by increasing GPU count, limited to what the
    type's usable nodes can hold (a down node removes whole-node entries)."""
    size = virtual_node_size(view.gpus_per_node)
    counts: list[int] = []
    gpus = 1
    while gpus <= size:
        counts.append(gpus)
        gpus *= 2
    per_node = view.gpus_per_node // size
    counts.extend(k * size for k in range(2, view.num_nodes * per_node + 1))
    configs = []
    for count in counts:
        config = Configuration(view.gpu_type, nodes_needed(count, view.gpus_per_node), count)
        if fits_type(config, view):
            configs.append(config)
    return tuple(configs)


def configuration_set(cluster: ClusterView) -> dict[str, tuple[Configuration, ...]]:
    """:func:`type_configurations` for every GPU type of the cluster."""
    return {name: type_configurations(view) for name, view in cluster.types.items()}


def shape_for(view: GpuTypeView, gpus: int) -> Configuration | None:
    """The fewest-nodes configuration of exactly ``gpus`` GPUs on a type, or ``None`` if it
    cannot fit (rigid, pinned, FIFO and Gavel jobs run at their requested count)."""
    if gpus <= view.max_node_gpus:
        return Configuration(view.gpu_type, 1, gpus)
    config = Configuration(view.gpu_type, nodes_needed(gpus, view.gpus_per_node), gpus)
    return config if fits_type(config, view) else None
