"""A real multi-node Slurm on one machine, with typed fake GPUs, for tests and demos.

``spec`` parses the cluster shape, ``render`` writes slurm.conf and gres.conf (pure functions),
``process`` starts and stops daemons by pid, and ``cluster`` ties them together behind
``DevCluster.up() / down() / status()``; ``controller_config`` renders the controller's sia.yaml
for a cluster of that shape.
"""

from sia_slurm.devcluster.cluster import DevCluster, DevClusterError
from sia_slurm.devcluster.controller_config import controller_config
from sia_slurm.devcluster.spec import DEFAULT_SPEC, DevClusterSpec, NodeGroupSpec

__all__ = [
    "DEFAULT_SPEC",
    "DevCluster",
    "DevClusterError",
    "DevClusterSpec",
    "NodeGroupSpec",
    "controller_config",
]
