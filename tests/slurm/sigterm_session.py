"""The test module of the pytest session that tests/slurm/test_sigterm_teardown.py starts and
stops with SIGTERM (not collected by the suite: its name does not start with ``test_``).

Its one test brings up both session clusters, the plain one on a one-node spec (enough to have
munged, slurmctld and a slurmd; six would only slow it down) and the accounting one (slurmdbd
and MariaDB too), writes their daemons to ``$SIA_SIGTERM_REPORT`` and waits to be stopped.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from sia_slurm_dev import DevCluster, DevClusterSpec

# What the stopping test reads: the report's name and the clusters' state directories.
REPORT_VARIABLE = "SIA_SIGTERM_REPORT"


@pytest.fixture(scope="session")
def dev_cluster_spec() -> DevClusterSpec:
    """One node instead of the session's six: these daemons only have to be up and recorded."""
    return DevClusterSpec.parse("t4:1x1")


def _daemons(cluster: DevCluster) -> list[dict[str, object]]:
    recorded = cluster._recorded()
    assert recorded is not None, f"no record in {cluster.layout.root}"
    return [asdict(record) for record in recorded.daemons]


def test_clusters_up_then_wait_for_sigterm(
    dev_cluster: DevCluster, accounting_cluster: DevCluster
) -> None:
    report = Path(os.environ[REPORT_VARIABLE])
    clusters = {"dev": dev_cluster, "accounting": accounting_cluster}
    payload = {
        name: {"root": str(cluster.layout.root), "daemons": _daemons(cluster)}
        for name, cluster in clusters.items()
    }
    partial = report.with_suffix(".tmp")
    partial.write_text(json.dumps(payload))
    partial.replace(report)  # whole or absent: the stopping test polls for it
    time.sleep(300)  # SIGTERM comes long before; if not, the stopping test's timeout ends it
