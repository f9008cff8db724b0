"""The credential race (issue 18): a job requeued and relaunched at once.

slurmd revokes a requeued job's credential in the second of the kill, and refuses a launch
whose credential was created in that same second ("Killing non-startable batch JobId=N: Job
credential revoked": the job ends FAILED). The backend therefore releases a requeued job to
start at Slurm's BeginTime - cred_expire + 1 (the kill's second + 2), never ``StartTime=now``.
Here one job grows and shrinks in place on the same node 20 times in a row while two busy
processes load both cores; every relaunch must run, and its counter must go on. With the old
rule (a start time in the past, as ``StartTime=now``) the same test failed at relaunch 19 of 20
(2026-11-23): the race is real on this machine, and this test catches it.

Only the killed run's nodes revoke the credential, so a relaunch on other nodes is released
in the kill's second itself (one to two seconds sooner: every profiling move, most moves
across types); the second test moves one job between two nodes 20 times under the same load.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from sia_slurm.cluster import JobPhase, Move, Start
from sia_slurm_dev import DevCluster
from tests.cpuload import busy_cores
from tests.slurm.test_backend_live import backend_for, placed, wait_for_phase

pytestmark = pytest.mark.slurm

RELAUNCHES = 20


@pytest.fixture
def cpu_load() -> Iterator[None]:
    """Both cores busy, as on a loaded CI machine (where the race was seen)."""
    with busy_cores():
        yield


def test_twenty_relaunches_in_place_under_load_all_run(
    dev_cluster: DevCluster, live_submitter: Any, cpu_load: None
) -> None:
    """On the node that revoked the credential: released at the kill's second + 2."""
    shapes = [("a100-1", 2 if relaunch % 2 else 1) for relaunch in range(1, RELAUNCHES + 1)]
    relaunch_all(dev_cluster, live_submitter, "inplace", shapes)


def test_twenty_relaunches_to_other_nodes_under_load_all_run(
    dev_cluster: DevCluster, live_submitter: Any, cpu_load: None
) -> None:
    """To a node the killed run did not use, released in the kill's own second (the
    relaunch floor is the kill's second there: only the killed run's nodes revoked the
    credential). With the race on such a node too, this fails as the test above did."""
    shapes = [("a100-2" if relaunch % 2 else "a100-1", 1) for relaunch in range(1, RELAUNCHES + 1)]
    relaunch_all(dev_cluster, live_submitter, "across", shapes)


def relaunch_all(
    dev_cluster: DevCluster, live_submitter: Any, sia_id: str, shapes: list[tuple[str, int]]
) -> None:
    """Start ``sia_id`` on a100-1, then move it to each (node, GPUs) of ``shapes`` in turn:
    every relaunch must run, with its Slurm restart counter going on."""
    backend = backend_for(dev_cluster, live_submitter.paths)
    job_id = live_submitter.submit(sia_id, partition="a100", gpus=1)
    try:
        (result,) = backend.apply([placed(Start, sia_id, 1, "a100", ["a100-1"], 1)])
        assert result.ok, result.message
        wait_for_phase(backend, sia_id, JobPhase.RUNNING, 60)
        for relaunch, (node, gpus) in enumerate(shapes, start=1):
            move = placed(Move, sia_id, relaunch + 1, "a100", [node], gpus)
            (result,) = backend.apply([move])
            assert result.ok, (relaunch, result.message)
            job = wait_for_phase(backend, sia_id, JobPhase.RUNNING, 60)
            assert job.slurm_job_id == job_id and job.restarts == relaunch
            assert job.config is not None and job.config.gpus == gpus
            assert [share.node for share in job.placement] == [node]
        starts = live_submitter.events(sia_id)
        runs = [e for e in starts if e["event"] == "start"]
        assert [e["slurm_restart_count"] for e in runs] == list(range(len(shapes) + 1))
        assert not [e for e in starts if e["event"] == "refused"]
        log = (dev_cluster.layout.log_dir / "slurmctld.log").read_text()
        assert f"Killing non-startable batch JobId={job_id}" not in log
    finally:
        dev_cluster.runner().run(["scancel", job_id], check=False)
