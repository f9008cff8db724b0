"""A real multi-node Slurm on one machine, with typed fake GPUs, for tests and demos.

The distribution sia-slurm-dev (``dev/`` in the checkout: ``pip install -e ./dev``), apart from
sia-slurm so that a site's controller host, which installs sia-slurm alone, carries none of this
developer infrastructure (Debian roots, chroots, the MariaDB and slurmdbd bootstrap). It adds
``sia-slurm dev-cluster`` (:mod:`sia_slurm_dev.cli`) to sia-slurm's command when installed.

``spec`` parses the cluster shape, ``slurm_conf`` writes slurm.conf and gres.conf (pure functions),
``process`` starts and stops daemons by pid, and ``lifecycle`` ties them together behind
``DevCluster.up() / down() / status()``; ``controller_config`` renders the controller's sia.yaml
for a cluster of that shape. ``roots`` builds a Debian root holding another Slurm release
(24.11, 26.05) and ``chroot`` runs a cluster of that release inside it (``DevCluster(...,
slurm="24.11")``: daemons, client wrappers, jobs).

Faults, for tests of what the controller lives through (``sia-slurm dev-cluster kill / start /
restart / drain / resume``): ``kill_slurmctld`` SIGKILLs slurmctld and ``start_slurmctld``
starts it again without ``-c``, from its saved state (what it had not saved, a few seconds'
worth, is gone); ``kill_slurmd`` SIGKILLs one node's slurmd (with ``jobs``, its job processes
too, as when the node dies) and ``start_slurmd`` starts it again; ``drain`` and ``resume``. The
slurm.conf choices that make a dead slurmd's node go DOWN in ~26 s and come back by itself
(SlurmdTimeout, ReturnToService) are explained in ``slurm_conf``; the operations live in ``faults``.
"""

from sia_slurm_dev.controller_config import controller_config
from sia_slurm_dev.lifecycle import DevCluster, DevClusterError
from sia_slurm_dev.spec import DEFAULT_SPEC, DevClusterSpec, NodeGroupSpec

__all__ = [
    "DEFAULT_SPEC",
    "DevCluster",
    "DevClusterError",
    "DevClusterSpec",
    "NodeGroupSpec",
    "controller_config",
]
