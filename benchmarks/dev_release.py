"""Which Slurm release a benchmark's dev cluster runs: the host's, or one from its Debian root.

Shared by ``benchmarks/restart_time.py`` and ``benchmarks/fidelity.py`` (their ``--slurm``).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm_dev import DevCluster  # noqa: E402
from sia_slurm_dev.chroot import SYSTEM  # noqa: E402
from sia_slurm_dev.roots import RELEASE_SUITES  # noqa: E402

# --slurm: the host's Slurm, or a release run from its Debian root (sia-slurm dev-cluster up).
SLURM_RELEASES = (SYSTEM, *sorted(RELEASE_SUITES))
# What a root's dev cluster shares with the host besides its own directory and the checkout
# (dev/sia_slurm_dev/chroot.py): a benchmark's state tree and job logs must lie there.
ROOT_SHARED_DIRS = (Path("/tmp"), Path("/home"))


def release_problem(directory: Path, slurm: str) -> str | None:
    """Why ``directory`` cannot hold a benchmark's cluster of ``slurm``, or None when it can:
    the release must be one ``dev-cluster up --slurm`` knows, and with a root's release the
    jobs, which run inside the root, must see the state tree and logs under ``directory``."""
    if slurm not in SLURM_RELEASES:
        return f"--slurm: expected one of {', '.join(SLURM_RELEASES)}, got {slurm!r}"
    resolved = directory.absolute().resolve()
    if slurm != SYSTEM and not any(d in resolved.parents for d in ROOT_SHARED_DIRS):
        return (
            f"--dir {directory}: with --slurm {slurm} it must lie under "
            f"{' or '.join(map(str, ROOT_SHARED_DIRS))} (jobs run inside the Slurm root, which "
            "shares only those, the cluster's directory and the checkout with the host)"
        )
    return None


def cluster_env(cluster_dir: Path) -> dict[str, str]:
    """The environment for Slurm commands and ``sia-sbatch`` aimed at the dev cluster that
    ``dev-cluster up`` started in ``cluster_dir``: SLURM_CONF and, for a root's release, PATH
    with its client wrappers first (``DevCluster.env``; the host's 22.05 clients cannot talk to
    a newer slurmctld)."""
    return DevCluster(cluster_dir).env


def slurm_bin_dir(cluster_dir: Path, slurm: str) -> Path | None:
    """The controller's ``slurm.bin_dir`` for that cluster: None (PATH) for the host's Slurm,
    the root's client wrappers otherwise."""
    return DevCluster(cluster_dir, slurm=slurm).bin_dir
