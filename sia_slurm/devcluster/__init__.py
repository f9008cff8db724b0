"""A real multi-node Slurm on one machine, with typed fake GPUs, for tests and demos.

``spec`` parses the cluster shape, ``render`` writes slurm.conf and gres.conf (pure functions),
``process`` starts and stops daemons by pid, and ``cluster`` ties them together behind
``DevCluster.up() / down() / status()``.
"""

from sia_slurm.devcluster.cluster import DevCluster, DevClusterError
from sia_slurm.devcluster.spec import DEFAULT_SPEC, DevClusterSpec, NodeGroupSpec

__all__ = ["DEFAULT_SPEC", "DevCluster", "DevClusterError", "DevClusterSpec", "NodeGroupSpec"]
