"""Which Slurm the real-Slurm tests run on, and on which ports (read once from the environment).

``SIA_TEST_SLURM``: ``system`` (the host's Slurm, Debian 12's 22.05; the default) or a release
run from its cached Debian root, ``24.11`` or ``26.05``. ``SIA_TEST_PORT_BASE``: the session
cluster's slurmctld port (slurmd ports follow); sessions run side by side need bases far
enough apart (scripts/test.sh uses 17817, 20817, 23817).
"""

from __future__ import annotations

import os

# Tests use their own port range so that a developer's `dev-cluster up` can keep running.
TEST_PORT_BASE = int(os.environ.get("SIA_TEST_PORT_BASE", "17817"))
# A second cluster some tests start (tests/slurm/test_dev_cluster.py) sits this far above it.
SECOND_PORT_OFFSET = 500
# The clusters of a pytest session that tests/slurm/test_sigterm_teardown.py starts and stops
# with SIGTERM sit this far above it (its accounting cluster 40 higher, as the session's does).
SIGTERM_PORT_OFFSET = 600
TEST_SLURM = os.environ.get("SIA_TEST_SLURM", "system")
# The release that is: the host's Slurm is Debian 12's 22.05 on the machines this runs on.
TEST_RELEASE = "22.05" if TEST_SLURM == "system" else TEST_SLURM
# How `scontrol show job` prints TresPerNode's GPUs: gres:gpu:2 on 22.05, gres/gpu:2 from 24.11.
TRES_GPU = "gres:gpu" if TEST_RELEASE == "22.05" else "gres/gpu"


def quiet_ports(count: int) -> range:
    """``count`` TCP ports only this session's tests use (27000-27999, outside the dev
    clusters' ports, the rendezvous range 29500-32767 where jobs of every session reserve
    ports, and the kernel's ephemeral range), for tests that need ports no one else binds."""
    if count > 10:
        raise ValueError(f"quiet_ports: at most 10 ports per session, asked {count}")
    start = 27000 + ((TEST_PORT_BASE // 100) % 100) * 10
    return range(start, start + count)
