"""Issue 18 item 2 on the real daemons: a run Slurm ends is brought back; a job whose own code
fails ends FAILED once its ``--max-failures`` are spent, visibly.

The controller runs round by round as the service account (``test_controller_live.Site``);
the jobs are tests/slurm/protocol_job.py, which leaves ``exit-<run>.json`` as sia-launch does.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.protocol import RunExit, exit_name, read_document  # noqa: E402
from tests.e2e import test_controller_live as live  # noqa: E402
from tests.e2e.test_controller_live import Site, wait_for  # noqa: E402

site = live.site  # the same fixture: the controller as the service account on the dev cluster

pytestmark = pytest.mark.slurm


def status_of(site: Site, sia_id: str) -> dict[str, object]:
    """``sia-slurm status --json --all``'s entry for the job (as an admin would look)."""
    done = subprocess.run(
        [sys.executable, "-m", "sia_slurm.cli", "status", "--config", str(site.config_path),
         "--json", "--all"],
        env=site.env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    (job,) = [j for j in json.loads(done.stdout)["jobs"] if j["sia_id"] == sia_id]
    return job


def slurm_record(site: Site, sia_id: str) -> dict[str, object]:
    return json.loads(site.paths.slurm_record(sia_id).read_text())


def test_a_run_slurm_killed_is_brought_back_and_completes_once(site: Site) -> None:
    """The batch step dies by SIGKILL (no exit of its own: as a refused launch, a killed
    slurmstepd or a failed node leave it): the job is requeued, restarted and completes."""
    job_id = site.submit("victim")
    first = site.round()
    site.wait_started("victim", first.index)
    site.run(["scancel", "--batch", "--signal=KILL", job_id])
    site.wait_slurm_state(job_id, "FAILED")
    assert not (site.paths.job_dir("victim") / exit_name(job_id, 0)).exists()
    brought_back = site.round()  # requeued, held, and (the cluster being idle) started again
    said = [line for line in brought_back.lines if "brought back" in line.get("message", "")]
    assert said, brought_back.lines
    assert slurm_record(site, "victim")["slurm_failed_runs"] == [f"{job_id}.0"]
    assert brought_back.actions["victim"]["kind"] == "start", brought_back.actions
    started = site.wait_started("victim", brought_back.index)
    assert started["run"] == [job_id, 1]
    site.finish("victim")
    site.wait_slurm_state(job_id, "COMPLETED")
    site.round()
    assert site.job_phases()["victim"] == "done"
    assert len(site.events("victim", "done")) == 1
    assert len(site.events("victim", "start")) == 2


def test_the_jobs_own_failure_is_retried_max_failures_times_then_ends_failed(site: Site) -> None:
    job_id = site.submitter.submit(
        "crash", job_args=["--fail-at", "40"], max_failures=1, restart_cost=0.1
    )
    site.slurm_ids.append(job_id)
    site.round()

    def crashed(times: int) -> bool:
        return len(site.events("crash", "crash")) >= times

    wait_for(lambda: crashed(1), "the first crash", diagnose=site.diagnosis)
    site.wait_slurm_state(job_id, "FAILED")
    exit_record = read_document(RunExit, site.paths.job_dir("crash") / exit_name(job_id, 0))
    assert (exit_record.cause, exit_record.status) == ("failed", 1)
    again = site.round()  # within --max-failures 1: requeued, held and started again
    assert slurm_record(site, "crash")["failed_runs"] == [f"{job_id}.0"]
    assert again.actions["crash"]["kind"] == "start", again.actions
    wait_for(lambda: crashed(2), "the second crash", diagnose=site.diagnosis)
    site.wait_slurm_state(job_id, "FAILED")
    ended = site.round()
    (said,) = [line for line in ended.lines if line.get("event") == "finished"]
    assert (said["job"], said["phase"], said["level"]) == ("crash", "failed", "error")
    assert "its own code failed" in said["result_message"]
    assert site.job_phases()["crash"] == "failed"
    shown = status_of(site, "crash")
    assert "its own code failed" in str(shown["message"])
    assert "failure 2 of --max-failures 1" in str(shown["message"])
    site.round()  # nothing is brought back any more
    assert site.slurm_job(job_id)["JobState"] == "FAILED"
    assert len(site.events("crash", "start")) == 2
