"""Shared fixtures for the simulator-input tests."""

from __future__ import annotations

from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES_DIR = REPO_ROOT / "data" / "traces"
WORKLOADS_DIR = REPO_ROOT / "data" / "workloads"
CLUSTERS_DIR = REPO_ROOT / "etc" / "clusters"

# A small synthetic trace whose interpolation results can be worked out by hand.
PLACEMENTS = """\
placement,local_bsz,step_time,sync_time
1,10,1.0,0.0
1,20,2.0,0.0
2,10,1.5,0.5
2,20,2.5,0.5
22,10,3.0,1.0
22,20,4.0,1.0
13,10,5.0,1.0
13,20,6.0,1.0
"""
SCALABILITY = """\
local_bsz,step_time,sync_time,num_nodes,num_replicas
10,100.0,50.0,2,4
10,6.0,3.0,4,8
30,8.0,3.0,4,8
10,10.0,7.0,4,16
30,12.0,7.0,4,16
"""


@pytest.fixture
def toy_traces(tmp_path: Path) -> Path:
    """A traces folder with app ``toy`` on trace key ``x``."""
    folder = tmp_path / "traces" / "toy"
    folder.mkdir(parents=True)
    (folder / "placements-x.csv").write_text(PLACEMENTS)
    (folder / "scalability-x.csv").write_text(SCALABILITY)
    return tmp_path / "traces"
