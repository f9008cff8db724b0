"""The credential race (issue 18): a job requeued and relaunched on the same node at once.

slurmd revokes a requeued job's credential in the second of the kill, and refuses a launch
whose credential was created in that same second ("Killing non-startable batch JobId=N: Job
credential revoked": the job ends FAILED). The backend therefore releases a requeued job to
start at Slurm's BeginTime - cred_expire + 1 (the kill's second + 2), never ``StartTime=now``.
Here one job grows and shrinks in place on the same node 20 times in a row while two busy
processes load both cores; every relaunch must run, and its counter must go on. With the old
rule (a start time in the past, as ``StartTime=now``) the same test failed at relaunch 19 of 20
(2026-11-23): the race is real on this machine, and this test catches it.
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
    backend = backend_for(dev_cluster, live_submitter.paths)
    job_id = live_submitter.submit("inplace", partition="a100", gpus=1)
    try:
        (result,) = backend.apply([placed(Start, "inplace", 1, "a100", ["a100-1"], 1)])
        assert result.ok, result.message
        wait_for_phase(backend, "inplace", JobPhase.RUNNING, 60)
        for relaunch in range(1, RELAUNCHES + 1):
            gpus = 2 if relaunch % 2 else 1
            move = placed(Move, "inplace", relaunch + 1, "a100", ["a100-1"], gpus)
            (result,) = backend.apply([move])
            assert result.ok, (relaunch, result.message)
            job = wait_for_phase(backend, "inplace", JobPhase.RUNNING, 60)
            assert job.slurm_job_id == job_id and job.restarts == relaunch
            assert job.config is not None and job.config.gpus == gpus
        starts = live_submitter.events("inplace")
        runs = [e for e in starts if e["event"] == "start"]
        assert [e["slurm_restart_count"] for e in runs] == list(range(RELAUNCHES + 1))
        assert not [e for e in starts if e["event"] == "refused"]
        log = (dev_cluster.layout.log_dir / "slurmctld.log").read_text()
        assert f"Killing non-startable batch JobId={job_id}" not in log
    finally:
        dev_cluster.runner().run(["scancel", job_id], check=False)
