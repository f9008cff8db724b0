"""Slurm accounting in the dev cluster against the real daemons (issue 20): MariaDB and slurmdbd
start under the cluster's directory, the spec's associations and limits reach Slurm, Slurm
enforces GrpTRES=gres/gpu, sacct keeps each run's comment, and `down` stops it all.

On every release: the host's (Debian's slurmdbd) and the Debian roots' (their own slurmdbd,
the host's MariaDB). The accounting cluster is the session's (``accounting_cluster``,
tests/conftest.py).
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from sia_slurm.slurm.observe.sacct import AccountingReader
from sia_slurm.slurm.runner import CommandRunner
from sia_slurm_dev import DevCluster, DevClusterSpec
from sia_slurm_dev.accounts_spec import AccountingSpec
from sia_slurm_dev.process import is_alive
from sia_slurm_dev.slurmdbd import root_client
from tests.accounting_site import ACCOUNTING_CLUSTER, ACCOUNTING_SPEC
from tests.accounts import SharedTmp, TestAccounts
from tests.release import TEST_PORT_BASE, TEST_SLURM

pytestmark = pytest.mark.slurm

DOWN_PORT_OFFSET = 50  # base+50..+54: beside the session's accounting cluster (tests/conftest.py)


def sbatch(cluster: DevCluster, *args: str) -> str:
    out = cluster.runner().run(["sbatch", "--parsable", "-o", "/dev/null", *args]).stdout
    return out.strip().split(";")[0]


def test_associations_and_limits_reach_slurm(accounting_cluster: DevCluster) -> None:
    runner = accounting_cluster.runner()
    assoc = runner.run(
        ["sacctmgr", "-n", "-P", "show", "assoc", "format=Account,User,Share,GrpTRES"]
    ).stdout.splitlines()
    assert "biology||1|gres/gpu=4" in assoc
    assert "physics||2|" in assoc
    assert "biology|root|1|" in assoc and "physics|root|1|" in assoc
    assert f"physics|{accounting_cluster.layout.controller_user}|1|" in assoc  # SlurmUser
    qos = runner.run(["sacctmgr", "-n", "-P", "show", "qos", "format=Name,MaxTRESPU"]).stdout
    assert "short|gres/gpu=6" in qos.splitlines()
    # The controller's reader sees the per-type limit as sacctmgr prints it on this release.
    site = AccountingReader(runner).read(0.0)
    assert site is not None
    assert site.qos["short"].per_job_typed == (("a100", 2),)
    assert site.qos["short"].gpus_per_user == 6 and site.qos["short"].gpus_per_job is None


def test_mariadb_keeps_its_temporary_files_to_itself(accounting_cluster: DevCluster) -> None:
    """Its tmpdir is the cluster's own: a mariadbd starting with the shared /tmp deletes every
    ``#sql*`` file there, another cluster's bootstrap tables included (loaded run 25)."""
    layout = accounting_cluster.accounting_layout(DevClusterSpec.parse(ACCOUNTING_CLUSTER))
    query = [*root_client(layout, "mariadb"), "-N", "-B", "-e", "SELECT @@tmpdir"]
    tmpdir = subprocess.run(query, capture_output=True, text=True, check=True).stdout.strip()
    assert tmpdir == str(layout.mariadb_tmp)
    assert layout.mariadb_tmp.stat().st_mode & 0o777 == 0o755  # not a world-writable /tmp


def wait_for_empty_queue(cluster: DevCluster, timeout_s: float = 60.0) -> None:
    """Until the shared cluster runs no job: an earlier test's cancelled jobs (the controller
    tests', tests/e2e) still count against biology's GrpTRES while they complete."""
    deadline = time.monotonic() + timeout_s
    while cluster.runner().run(["squeue", "-h", "-o", "%i"]).stdout.strip():
        assert time.monotonic() < deadline, cluster.runner().run(["squeue"]).stdout
        time.sleep(0.5)


def states_once_judged(
    runner: CommandRunner, running: str, waiting: tuple[str, ...], timeout_s: float = 90
) -> dict[str, tuple[str, str]]:
    """Each job's (state, reason) in squeue once ``running`` runs and Slurm has judged every
    ``waiting`` job, none of which may start meanwhile. 26.05 lists waiting jobs first with
    reason None; 22.05 gave one reason Priority at its submission once, in a loaded run (a job
    not first in its partition's queue when it comes: _top_priority, job_mgr.c) and judges its
    limits at the main scheduler's next pass (every second here)."""
    undecided = {"None", "Priority"}
    jobs = ",".join((running, *waiting))
    deadline = time.monotonic() + timeout_s
    states: dict[str, tuple[str, str]] = {}
    while time.monotonic() < deadline:
        out = runner.run(["squeue", "-h", "-o", "%i %T %r", "-j", jobs]).stdout
        states = {line.split()[0]: (line.split()[1], line.split()[2]) for line in out.splitlines()}
        assert all(states.get(j, ("PENDING",))[0] == "PENDING" for j in waiting), states
        reasons = {states.get(j, ("", "None"))[1] for j in waiting}
        if states.get(running, ("",))[0] == "RUNNING" and not reasons & undecided:
            break
        time.sleep(0.5)
    return states


def test_slurm_enforces_grptres_and_sacct_keeps_comments(accounting_cluster: DevCluster) -> None:
    runner = accounting_cluster.runner()
    wait_for_empty_queue(accounting_cluster)
    first = sbatch(
        accounting_cluster, "-A", "biology", "-p", "a100", "--gpus-per-node=4",
        "--comment=sia-slurm:acct-1", "--wrap", "sleep 300",
    )  # fmt: skip
    second = sbatch(
        accounting_cluster, "-A", "biology", "-p", "t4", "--gpus-per-node=1",
        "--comment=sia-slurm:acct-2", "--wrap", "sleep 1",
    )  # fmt: skip
    # QOS short allows 2 A100s per job (gres/gpu:a100, a TRES of its own): 3 wait. Slurm
    # checks it only on typed requests; the controller asks untyped GPUs in the type's
    # partition, so there its program keeps the limit (docs/deviations.md).
    typed = sbatch(
        accounting_cluster, "-A", "physics", "-q", "short", "-p", "a100",
        "--gpus-per-node=a100:3",
        "--wrap", "sleep 1",
    )  # fmt: skip
    try:
        states = states_once_judged(runner, first, (second, typed))
        # 4 GPUs of biology's 4 are held: the 5th waits on the association's limit.
        assert states[first][0] == "RUNNING", states
        assert states[second] == ("PENDING", "AssocGrpGRES"), states
        assert states[typed] == ("PENDING", "QOSMaxGRESPerJob"), states
    finally:  # the first job runs until cancelled: never left to the next test
        runner.run(["scancel", first, second, typed], check=False)
    deadline = time.monotonic() + 30
    rows: list[str] = []
    while time.monotonic() < deadline:
        rows = runner.run(
            ["sacct", "-X", "-n", "-P", "-o", "JobID,Account,Comment,State", "-j", first]
        ).stdout.splitlines()
        if any("CANCELLED" in row for row in rows):
            break
        time.sleep(0.5)
    assert rows and rows[0].startswith(f"{first}|biology|sia-slurm:acct-1|"), rows


def test_down_stops_mariadb_and_slurmdbd(
    shared_tmp: SharedTmp, test_accounts: TestAccounts
) -> None:
    cluster = DevCluster(
        shared_tmp.mktemp("accounting-down"),
        port_base=TEST_PORT_BASE + DOWN_PORT_OFFSET,
        slurm_user=test_accounts.service.name,
        slurm=TEST_SLURM,
        accounting=AccountingSpec.parse(ACCOUNTING_SPEC, "ACCOUNTING_SPEC"),
    )
    cluster.up(DevClusterSpec.parse("a100:1x2"))  # the spec limits A100s per job
    try:
        recorded = cluster._recorded()
        assert recorded is not None
        roles = {r.role: r for r in recorded.daemons}
        assert {"mariadbd", "slurmdbd"} <= set(roles)
        assert Path(cluster.layout.root / "db" / "mysql").is_dir()  # data under the cluster
    finally:
        cluster.down()
    assert not any(is_alive(r) for r in roles.values())
