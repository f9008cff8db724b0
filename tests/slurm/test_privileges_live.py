"""What the controller's service account and ordinary users may do to jobs, on the real daemons.

slurmctld runs as ``siasvc`` (SlurmUser), as the controller does in production; ``siaalice``
owns the jobs and ``siabob`` is another user. Each test pins facts recorded, with Slurm's exact
messages, in docs/slurm-actuation.md ("Privileges: the service account and users"), so a Slurm
upgrade that changes one fails here. Waits poll Slurm until a state is reached, with a deadline.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.slurm import commands
from sia_slurm.slurm.actuate.calls import refused_for_now, send_until_taken, update_pause_s
from sia_slurm.slurm.observe.jsonparse import job_state, number
from sia_slurm.slurm.records import parse_records
from sia_slurm_dev import DevCluster
from tests.accounts import ALICE, BOB, SERVICE_ACCOUNT, TestAccounts, run_as
from tests.release import TEST_RELEASE, TRES_GPU

pytestmark = pytest.mark.slurm

# The job traps SIGUSR1 (the controller's checkpoint signal) and notes it; short sleeps let
# bash run the trap promptly.
# It notes when the trap is set: Slurm says RUNNING before the script has run a line (seen on
# 24.11 under load: a signal sent then found no trap, and the mark never came).
JOB_SCRIPT = """#!/bin/bash
trap 'echo usr1 >> "$SLURM_SUBMIT_DIR/usr1-$SLURM_JOB_ID"' USR1
touch "$SLURM_SUBMIT_DIR/ready-$SLURM_JOB_ID-${SLURM_RESTART_COUNT:-0}"
while true; do sleep 0.2; done
"""
# scancel exits with Slurm's error number modulo 256: ESLURM_ACCESS_DENIED is 2002.
SCANCEL_ACCESS_DENIED = 2002 % 256


# 26.05 lost the space after "slurm_suspend error:".
SUSPEND_ERROR = "slurm_suspend error:" if TEST_RELEASE == "26.05" else "slurm_suspend error: "


def access_denied(job_id: str) -> str:
    """scontrol hold/release's refusal; its second line names the wrong call (sic)."""
    return f"Access/permission denied for job {job_id}\n{SUSPEND_ERROR}Access/permission denied"


def invalid_user(job_id: str) -> str:
    return f"Invalid user id for job {job_id}\n{SUSPEND_ERROR}Invalid user id"


class Slurm:
    """The dev cluster as each actor sees it: commands as a user, and the job as root reads it."""

    def __init__(self, cluster: DevCluster, workdir: Path) -> None:
        self.cluster = cluster
        self.workdir = workdir

    def as_user(
        self, user: str, *argv: str, cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return run_as(user, argv, env=self.cluster.env, cwd=cwd or self.workdir)

    def show(self, job_id: str) -> dict[str, str]:
        """``scontrol -o show job`` (its Reason tells admin holds from requeue holds)."""
        out = self.cluster.runner().run(["scontrol", "-o", "show", "job", job_id]).stdout
        (record,) = parse_records(out)
        return record

    def squeue(self, job_id: str) -> dict[str, Any]:
        """The job in ``squeue --json``, which the controller reads (22.05 ignores -j), with
        ``job_state`` (a list from 24.11), ``priority`` and ``start_time`` (``{"set",
        "number"}`` objects from 24.11) read as 22.05 prints them, by the controller's parser."""
        jobs = json.loads(self.cluster.runner().run(["squeue", "--json"]).stdout)["jobs"]
        job = next(job for job in jobs if str(job["job_id"]) == job_id)
        base, _ = job_state(job["job_state"])
        return {
            **job,
            "job_state": base,
            "priority": number(job["priority"]),
            "start_time": number(job["start_time"]),
        }

    def update(self, user: str, *argv: str) -> subprocess.CompletedProcess[str]:
        """``scontrol update`` as ``user``, sent again while 24.11/26.05 refuse a Partition=
        change with a stale errno, EAGAIN or EINTR (no accounting storage here), exactly as the
        controller sends its own (sia_slurm/slurm/actuate/calls.py: copies at once, backing off; one
        update sent again alone every 0.1 s, then by the backoff alone, gave up at load 16).
        22.05 takes it at once, and must."""
        update = ["scontrol", "update", *argv]

        def refused(result: subprocess.CompletedProcess[str]) -> bool:
            return TEST_RELEASE != "22.05" and refused_for_now(update, result.stderr)

        return send_until_taken(
            lambda: self.as_user(user, *update),
            refused,
            lambda attempt: time.sleep(update_pause_s(attempt)),
            taken=lambda result: result.returncode == 0,
        )

    def wait(
        self, job_id: str, done: Callable[[dict[str, str]], bool], timeout_s: float = 60
    ) -> dict[str, str]:
        deadline = time.monotonic() + timeout_s
        while True:
            record = self.show(job_id)
            if done(record):
                return record
            if time.monotonic() > deadline:
                raise AssertionError(f"job {job_id} did not get there in {timeout_s} s: {record}")
            time.sleep(0.2)

    def wait_state(self, job_id: str, state: str, timeout_s: float = 60) -> dict[str, str]:
        return self.wait(job_id, lambda r: r["JobState"] == state, timeout_s)

    def submit(self, user: str, *options: str) -> str:
        """``sbatch`` as ``user`` from the work directory, the trapping script by default."""
        result = self.as_user(user, "sbatch", "--parsable", *options, cwd=self.workdir)
        assert result.returncode == 0, result.stderr
        return result.stdout.strip().split(";")[0]


def ok(result: subprocess.CompletedProcess[str]) -> bool:
    return result.returncode == 0 and not result.stderr


def refused(result: subprocess.CompletedProcess[str], message: str, code: int = 1) -> bool:
    return result.returncode == code and result.stderr.strip() == message


@pytest.fixture
def slurm(
    dev_cluster: DevCluster, test_accounts: TestAccounts, shared_tmp_path: Path
) -> Iterator[Slurm]:
    """A work directory owned by siaalice (her jobs' scripts and output), in a directory every
    account can traverse; every job left is cancelled afterwards."""
    workdir = shared_tmp_path / "alice"
    workdir.mkdir()
    (workdir / "job.sh").write_text(JOB_SCRIPT)
    os.chown(workdir, test_accounts.alice.uid, test_accounts.alice.gid)
    os.chown(workdir / "job.sh", test_accounts.alice.uid, test_accounts.alice.gid)
    slurm = Slurm(dev_cluster, workdir)
    before = set(dev_cluster.runner().run(["squeue", "-h", "-o", "%A"]).stdout.split())
    try:
        yield slurm
    finally:
        after = set(dev_cluster.runner().run(["squeue", "-h", "-o", "%A"]).stdout.split())
        if after - before:
            dev_cluster.runner().run(["scancel", *sorted(after - before)], check=False)


def held_job(slurm: Slurm, *options: str) -> str:
    """A job siaalice submitted held, as sia-sbatch does (one t4 GPU unless told)."""
    return slurm.submit(ALICE, "--hold", "-p", "t4", "--gpus-per-node=1", *options, "job.sh")


def test_slurmctld_runs_as_the_service_account_and_owns_what_it_writes(
    dev_cluster: DevCluster, test_accounts: TestAccounts
) -> None:
    (controller,) = [
        d
        for d in json.loads(dev_cluster.layout.state_file.read_text())["daemons"]
        if d["role"] == "slurmctld"
    ]
    assert os.stat(f"/proc/{controller['pid']}").st_uid == test_accounts.service.uid
    layout = dev_cluster.layout
    for path in (layout.state_dir, layout.slurmctld_log, layout.slurmctld_pid):
        assert path.stat().st_uid == test_accounts.service.uid, path
    assert all(p.stat().st_uid == test_accounts.service.uid for p in layout.state_dir.iterdir())
    conf = {k: v for r in parse_records(layout.slurm_conf.read_text()) for k, v in r.items()}
    assert (conf["SlurmUser"], conf["SlurmdUser"]) == (SERVICE_ACCOUNT, "root")


def test_users_jobs_run_the_projects_python(
    slurm: Slurm, shared_python: str, test_accounts: TestAccounts
) -> None:
    """Jobs run sys.executable as their owner: /root's o+x is all it takes."""
    code = "import sia_slurm, torch, os; print(os.getuid(), torch.__version__.split('+')[0])"
    job = slurm.submit(
        ALICE, "-p", "t4", "-o", "py-%j.out", "--wrap", f'{shared_python} -c "{code}"'
    )
    record = slurm.wait(job, lambda r: r["JobState"] in ("COMPLETED", "FAILED"))
    output = (slurm.workdir / f"py-{job}.out").read_text()
    assert record["JobState"] == "COMPLETED", output
    assert output.split()[0] == str(test_accounts.alice.uid)


def test_a_user_hold_at_submission(slurm: Slurm, test_accounts: TestAccounts) -> None:
    job = held_job(slurm)
    view = slurm.squeue(job)
    assert (view["job_state"], view["state_reason"], view["priority"]) == (
        "PENDING",
        "JobHeldUser",
        0,
    )
    assert view["user_id"] == test_accounts.alice.uid


def test_the_service_accounts_hold_is_one_the_user_cannot_release(slurm: Slurm) -> None:
    job = held_job(slurm)
    assert ok(slurm.as_user(SERVICE_ACCOUNT, "scontrol", "hold", job))
    assert slurm.squeue(job)["state_reason"] == "JobHeldAdmin"
    assert slurm.show(job)["Reason"] == "JobHeldAdmin"

    assert refused(slurm.as_user(ALICE, "scontrol", "release", job), access_denied(job))
    # uhold "succeeds" but cannot turn the admin hold into her own.
    assert ok(slurm.as_user(ALICE, "scontrol", "uhold", job))
    assert slurm.show(job)["Reason"] == "JobHeldAdmin"

    # She may still reshape and comment her pending job while the controller holds it.
    assert ok(slurm.update(ALICE, f"JobId={job}", "Partition=rtx"))
    assert ok(slurm.as_user(ALICE, "scontrol", "update", f"JobId={job}", "NumNodes=2-2"))
    update = ("scontrol", "update", f"JobId={job}", "TresPerNode=gres:gpu:2")
    assert ok(slurm.as_user(ALICE, *update))
    assert ok(slurm.as_user(ALICE, "scontrol", "update", f"JobId={job}", "Comment=alice-pending"))
    record = slurm.show(job)
    # (-o output runs Partition into the next, space-separated "AllocNode:Sid=..." field)
    assert (record["Partition"].split()[0], record["NumNodes"], record["TresPerNode"]) == (
        "rtx",
        "2-2",
        f"{TRES_GPU}:2",
    )
    assert (record["Comment"], record["Reason"]) == ("alice-pending", "JobHeldAdmin")


def test_the_service_account_reshapes_releases_signals_and_requeues_her_job(
    slurm: Slurm, shared_tmp_path: Path, test_accounts: TestAccounts
) -> None:
    job = held_job(slurm)
    reshape = (
        f"JobId={job}",
        "Partition=rtx",
        "TresPerNode=gres:gpu:2",
        "NumNodes=2-2",
        "NumTasks=2",
        "ReqNodeList=rtx-1,rtx-2",
    )
    assert ok(slurm.update(SERVICE_ACCOUNT, *reshape))
    assert ok(slurm.as_user(SERVICE_ACCOUNT, "scontrol", "release", job))
    record = slurm.wait_state(job, "RUNNING")
    assert (record["NodeList"], record["TresPerNode"]) == ("rtx-[1-2]", f"{TRES_GPU}:2")

    ready = slurm.workdir / f"ready-{job}-0"
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert time.monotonic() < deadline, "the job's script never set its trap"
        time.sleep(0.2)
    signal = ("scancel", "--batch", "--signal=USR1", job)
    assert ok(slurm.as_user(SERVICE_ACCOUNT, *signal))
    mark = slurm.workdir / f"usr1-{job}"
    deadline = time.monotonic() + 30
    while not mark.exists():
        assert time.monotonic() < deadline, "the job never saw SIGUSR1"
        time.sleep(0.2)

    # The batch script: SlurmUser may fetch it; scontrol writes the file itself, as siasvc.
    svc_dir = shared_tmp_path / "svc"
    svc_dir.mkdir()
    os.chown(svc_dir, test_accounts.service.uid, test_accounts.service.gid)
    target = svc_dir / "script"
    written = slurm.as_user(SERVICE_ACCOUNT, "scontrol", "write", "batch_script", job, str(target))
    assert written.returncode == 0 and written.stdout.strip() == (
        f"batch script for job {job} written to {target}"
    )
    assert target.read_text() == JOB_SCRIPT and target.stat().st_uid == test_accounts.service.uid
    # Into her directory it cannot write, and scontrol still exits 0.
    theirs = slurm.workdir / "script"
    blocked = slurm.as_user(SERVICE_ACCOUNT, "scontrol", "write", "batch_script", job, str(theirs))
    assert blocked.returncode == 0 and not theirs.exists()
    assert blocked.stderr.strip() == f"failed to open file `{theirs}`: Permission denied"

    assert ok(slurm.as_user(SERVICE_ACCOUNT, "scontrol", "requeuehold", job))
    record = slurm.wait_state(job, "PENDING")
    assert (record["Reason"], record["Restarts"]) == ("job_requeued_in_held_state", "1")
    # ... which is a *user* hold: squeue says so and she may release it.
    assert slurm.squeue(job)["state_reason"] == "JobHeldUser"
    assert ok(slurm.as_user(ALICE, "scontrol", "release", job))
    assert slurm.squeue(job)["priority"] > 0
    # A hold after the requeue makes it the service account's again.
    assert ok(slurm.as_user(SERVICE_ACCOUNT, "scontrol", "hold", job))
    assert slurm.squeue(job)["state_reason"] == "JobHeldAdmin"
    assert refused(slurm.as_user(ALICE, "scontrol", "release", job), access_denied(job))


def test_a_user_on_her_own_running_job(slurm: Slurm) -> None:
    job = slurm.submit(ALICE, "-p", "t4", "-N", "2", "--gpus-per-node=1", "job.sh")
    record = slurm.wait_state(job, "RUNNING")
    assert record["NodeList"] == "t4-[1-2]"
    update = ("scontrol", "update", f"JobId={job}")
    assert ok(slurm.as_user(ALICE, *update, "Comment=alice-running"))
    assert slurm.show(job)["Comment"] == "alice-running"
    not_pending = f"Job is no longer pending execution for job {job}"
    assert refused(slurm.as_user(ALICE, *update, "Partition=rtx"), not_pending)
    assert refused(slurm.as_user(ALICE, *update, "TresPerNode=gres:gpu:2"), not_pending)
    assert refused(
        slurm.as_user(BOB, "scontrol", "requeue", job), f"Access/permission denied for job {job}"
    )

    # She may shrink it in place: Slurm frees the second node while the job runs on.
    assert ok(slurm.as_user(ALICE, *update, "NumNodes=1"))
    record = slurm.show(job)
    assert (record["JobState"], record["NumNodes"], record["NodeList"]) == ("RUNNING", "1", "t4-1")
    # Afterwards (no accounting storage here) nobody may update the running job on 22.05:
    # slurmctld retries for ~5 s, then gives up. 24.11 and 26.05 take the update.
    busy = (
        f"Job update not available right now, the DB index is being set, try again in a bit "
        f"for job {job}"
    )
    comment = slurm.as_user(SERVICE_ACCOUNT, *update, "Comment=svc")
    assert refused(comment, busy) if TEST_RELEASE == "22.05" else ok(comment)

    # Her own requeue: PENDING again, not held, one more restart.
    assert ok(slurm.as_user(ALICE, "scontrol", "requeue", job))
    # Slurm gives the requeued job its Reason at its next look at the queue: right after the
    # requeue it reads None (seen on 26.05 at load, 0.3 s after "Requeuing JobId=...").
    record = slurm.wait(job, lambda r: r["JobState"] == "PENDING" and r["Reason"] != "None")
    assert (record["Reason"], record["Restarts"]) == ("BeginTime", "1")
    view = slurm.squeue(job)
    assert view["priority"] > 0 and view["restart_cnt"] == 1
    # The requeue made the job updatable again; the service account cuts its BeginTime to
    # what the revoked credential needs (StartTime=now could relaunch it in the second of the
    # kill, which slurmd refuses: docs/slurm-actuation.md, "The credential race").
    assert ok(slurm.as_user(SERVICE_ACCOUNT, *update, "Comment=svc-after-requeue"))
    cred_expire = slurm.cluster.layout.cred_expire_s
    floor = commands.relaunch_floor(float(view["start_time"]), cred_expire)
    (start,) = commands.start_at(job, floor)[3:]
    assert ok(slurm.as_user(SERVICE_ACCOUNT, *update, start))
    record = slurm.wait_state(job, "RUNNING", timeout_s=20)  # well before cred_expire (30 s)
    assert (record["Comment"], record["Restarts"]) == ("svc-after-requeue", "1")


def test_another_user_is_refused_everything(slurm: Slurm) -> None:
    job = held_job(slurm)
    for verb in ("hold", "uhold", "release"):
        assert refused(slurm.as_user(BOB, "scontrol", verb, job), invalid_user(job)), verb
    for field in ("Partition=rtx", "Comment=bob"):
        result = slurm.as_user(BOB, "scontrol", "update", f"JobId={job}", field)
        assert refused(result, f"Invalid user id for job {job}"), field
    kill_refused = f"scancel: error: Kill job error on job id {job}: Access/permission denied"
    for argv in (("scancel", job), ("scancel", "--batch", "--signal=USR1", job)):
        assert refused(slurm.as_user(BOB, *argv), kill_refused, SCANCEL_ACCESS_DENIED), argv
    script = slurm.as_user(BOB, "scontrol", "write", "batch_script", job, "-")
    assert script.returncode == 0  # sic: the refusal is only in the message
    assert script.stderr.strip() == "job script retrieval failed: Invalid user id"
    assert slurm.show(job)["JobState"] == "PENDING"


def test_only_root_submits_as_another_user(slurm: Slurm, test_accounts: TestAccounts) -> None:
    argv: Sequence[str] = ("sbatch", "--parsable", "--hold", f"--uid={ALICE}", "-p", "t4")
    wrap = ("-o", "/dev/null", "--wrap", "true")
    denied = slurm.as_user(SERVICE_ACCOUNT, *argv, *wrap)
    assert refused(denied, "sbatch: error: --uid only permitted by root user", 255)

    out = slurm.cluster.runner().run([*argv, *wrap], check=False)
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    assert slurm.squeue(job)["user_id"] == test_accounts.alice.uid
    # The service account cancels any user's job.
    assert ok(slurm.as_user(SERVICE_ACCOUNT, "scancel", job))
    slurm.wait_state(job, "CANCELLED")
