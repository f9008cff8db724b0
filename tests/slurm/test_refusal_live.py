"""A run its launcher refused is requeued and held at the controller's next round, then runs
again as granted (issue 18, item 6), on the real dev cluster.

Seen in the chaos soak: after a slurmd restart, Slurm started a granted run with
``SLURM_GPUS_ON_NODE=0`` while ``scontrol show job`` showed its GPUs, so only the launcher saw
the mismatch. Slurm cannot easily be made to do that on purpose; the launcher's own detection
is covered by ``tests/job/test_launch.py``. Here the refusal is written, as the job's
user, by the launcher's own writer (:func:`sia_slurm.job.grant.record_refusal`), with the
launcher's own message for a batch step that saw 0 GPUs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from sia_slurm.cluster import JobPhase, Start
from sia_slurm.job.grant import LaunchError, SlurmAllocation, check_allocation, record_refusal
from sia_slurm.job_settings import JobSiteSettings
from sia_slurm.protocol import Assignment, read_document
from sia_slurm_dev import DevCluster
from tests.slurm.test_backend_enforcement import job_of
from tests.slurm.test_backend_live import backend_for, placed, slurm_job, wait_for_phase

pytestmark = pytest.mark.slurm


def test_a_refused_run_is_requeued_at_the_next_round_and_runs_again_as_granted(
    dev_cluster: DevCluster, live_submitter: Any
) -> None:
    paths = live_submitter.paths
    backend = backend_for(dev_cluster, paths)
    job_id = live_submitter.submit("refused", partition="a100", gpus=1)
    try:
        (result,) = backend.apply([placed(Start, "refused", 1, "a100", ["a100-1"], 1)])
        assert result.ok, result.message
        wait_for_phase(backend, "refused", JobPhase.RUNNING, 60)
        # The launcher of this run (job id, restart 0, a100-1) saw SLURM_GPUS_ON_NODE=0.
        assignment = read_document(Assignment, paths.assignment("refused"))
        seen = SlurmAllocation(job_id, "a100", 1, 0, "a100-1", 0)
        with pytest.raises(LaunchError) as refusal:
            check_allocation(assignment, seen, JobSiteSettings.of(backend.config), ["a100-1"])
        assert record_refusal(paths, assignment, seen, ["a100-1"], str(refusal.value))
        # One round: observed as not running as granted, then requeued and held.
        job = job_of(backend.snapshot(), "refused")
        assert job.phase is JobPhase.PENDING and job.config is None
        assert "its launcher refused to train" in job.message
        assert "SLURM_GPUS_ON_NODE=0" in job.message
        assert backend.apply([]) == []
        record = slurm_job(dev_cluster, job_id)
        assert record["Restarts"] == "1", record
        assert record["JobState"] in ("COMPLETING", "PENDING", "REQUEUED"), record
        # Rounds go on until Slurm has its GPU back; then one starts it again, as granted.
        deadline = time.monotonic() + 30
        while (state := slurm_job(dev_cluster, job_id))["JobState"] != "PENDING":
            assert time.monotonic() < deadline, state
            time.sleep(0.3)
        assert state["Priority"] == "0"  # held: nothing starts it but the controller
        assert job_of(backend.snapshot(), "refused").phase is JobPhase.PENDING
        backend.apply([])
        again = placed(Start, "refused", 2, "a100", ["a100-1"], 1)
        (result,) = backend.apply([again])
        assert result.ok, result.message
        job = wait_for_phase(backend, "refused", JobPhase.RUNNING, 60)
        assert job.slurm_job_id == job_id and job.restarts == 1
        runs = [e for e in live_submitter.events("refused") if e["event"] == "start"]
        assert [e["slurm_restart_count"] for e in runs] == [0, 1]
        record = backend.observe_jobs().managed["refused"].record
        assert (record.failed_runs, record.slurm_failed_runs) == ((), ())
    finally:
        dev_cluster.runner().run(["scancel", job_id], check=False)
