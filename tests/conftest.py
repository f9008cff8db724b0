"""Shared fixtures. ``dev_cluster`` brings up a real Slurm (munged, slurmctld, six slurmd with
typed fake GPUs) once per test session and takes it down afterwards.

If Slurm cannot start, every test that uses it errors with the reason: these tests are never
skipped (CI installs the Debian packages; see scripts/install.sh).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from sia_slurm.devcluster import DEFAULT_SPEC, DevCluster, DevClusterSpec

REPO = Path(__file__).resolve().parent.parent
# Tests use their own port range so that a developer's `dev-cluster up` can keep running.
TEST_PORT_BASE = int(os.environ.get("SIA_TEST_PORT_BASE", "17817"))


@pytest.fixture(scope="session")
def dev_cluster_spec() -> DevClusterSpec:
    return DevClusterSpec.parse(DEFAULT_SPEC)


@pytest.fixture(scope="session")
def dev_cluster(
    tmp_path_factory: pytest.TempPathFactory, dev_cluster_spec: DevClusterSpec
) -> Iterator[DevCluster]:
    root = tmp_path_factory.mktemp("dev-cluster")
    cluster = DevCluster(root, port_base=TEST_PORT_BASE)
    cluster.up(dev_cluster_spec)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def slurm_env(dev_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point Slurm client commands run by the code under test at the dev cluster."""
    for key, value in dev_cluster.env.items():
        monkeypatch.setenv(key, value)
    return dev_cluster.env
