"""Issue 20 acceptance on real Slurm with accounting: an account limited by
``GrpTRES=gres/gpu=4`` is never granted more than 4 GPUs by the controller, whatever its jobs
would like, and the GPUs it may not have go to the other account.

The dev cluster runs slurmdbd on MariaDB (``DevCluster(accounting=...)``); the controller runs
``controller run --once`` as the service account, as cron would, and reads the associations
with sacctmgr. Three growing jobs of account ``biology`` (limit 4) and one of ``physics`` (no
limit) share 8 A100s; after every round the decisions the controller logged and what Slurm runs
are checked against the limit. Host Slurm only (Debian's slurmdbd; see
tests/slurm/test_accounting_live.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.devcluster import DevCluster, DevClusterSpec, controller_config  # noqa: E402
from sia_slurm.devcluster.accounting import AccountingSpec  # noqa: E402
from sia_slurm.protocol import StatePaths  # noqa: E402
from sia_slurm.slurm.jsonparse import parse_squeue_json  # noqa: E402
from sia_slurm.slurm.runner import SubprocessRunner  # noqa: E402
from sia_slurm.state.tree import set_up  # noqa: E402
from tests.accounts import SharedTmp, TestAccounts  # noqa: E402
from tests.e2e.test_controller_live import Site  # noqa: E402
from tests.release import TEST_PORT_BASE, TEST_SLURM  # noqa: E402
from tests.slurm.conftest import LiveSubmitter  # noqa: E402

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        TEST_SLURM != "system", reason="dev-cluster accounting runs on the host's Slurm only"
    ),
]

PORT_OFFSET = 60  # base+60..+64: apart from the session cluster and tests/slurm's accounting one
SPEC = DevClusterSpec.parse("a100:2x4")
ACCOUNTS = """\
accounts:
  physics: {fairshare: 1}
  biology: {fairshare: 1, gpus: 4}
users:
  root: {accounts: [physics, biology]}
"""
LIMIT = 4


@pytest.fixture(scope="module")
def accounting_cluster(shared_tmp: SharedTmp, test_accounts: TestAccounts) -> Iterator[DevCluster]:
    cluster = DevCluster(
        shared_tmp.mktemp("accounting-controller"),
        port_base=TEST_PORT_BASE + PORT_OFFSET,
        slurm_user=test_accounts.service.name,
        accounting=AccountingSpec.parse(ACCOUNTS, "ACCOUNTS"),
    )
    cluster.up(SPEC)
    try:
        yield cluster
    finally:
        cluster.down()


def submitter(cluster: DevCluster, paths: StatePaths, account: str) -> LiveSubmitter:
    """Submits under ``account`` (sbatch reads SBATCH_ACCOUNT), as a user with ``-A`` would."""
    return LiveSubmitter(
        cluster, paths, SubprocessRunner(env={**cluster.env, "SBATCH_ACCOUNT": account})
    )


def test_grptres_account_never_gets_more_than_its_limit(
    accounting_cluster: DevCluster,
    test_accounts: TestAccounts,
    shared_tmp_path: Path,
) -> None:
    paths = StatePaths(shared_tmp_path / "state")
    service = test_accounts.service
    set_up(paths.state_dir, service.uid, service.gid)
    config_path = shared_tmp_path / "sia.yaml"
    config_path.write_text(
        controller_config(
            SPEC,
            paths.state_dir,
            round_seconds=10,
            policy_params={"lambda_a": 0.01},
            checkpoint_timeout_s=30,
        )
    )
    site = Site(
        accounting_cluster,
        shared_tmp_path,
        submitter(accounting_cluster, paths, "physics"),
        config_path,
        paths.state_dir / "controller.jsonl",
    )
    biology = submitter(accounting_cluster, paths, "biology")
    limited = {"bio-1", "bio-2", "bio-3"}
    try:
        site.submit("phys-1", partition="a100")
        for sia_id in sorted(limited):
            site.submitter, original = biology, site.submitter
            try:
                site.submit(sia_id, partition="a100")
            finally:
                site.submitter = original
        accounts = {
            job.job_id: job.account
            for job in parse_squeue_json(site.run(["squeue", "--json"])).jobs
        }
        assert sorted(accounts.values()) == ["biology"] * 3 + ["physics"]
        granted: list[int] = []
        for _ in range(5):
            log = site.round()
            gpus = {
                job: int(d["after"].split("x")[-1]) * int(d["after"].split(":")[1].split("x")[0])
                for job, d in log.decisions.items()
                if d["after"] != "-"
            }
            granted.append(sum(g for job, g in gpus.items() if job in limited))
            assert granted[-1] <= LIMIT, (granted, log.decisions)
            # Slurm agrees: the biology jobs it runs hold at most 4 GPUs, and none of them
            # waits released on the association's limit (the controller never asked for more).
            jobs = parse_squeue_json(site.run(["squeue", "--json"])).jobs
            mine = [j for j in jobs if j.account == "biology"]
            running = sum(sum(j.gpus_per_node) for j in mine if j.state == "RUNNING")
            assert running <= LIMIT, [(j.job_id, j.state, j.gpus_per_node) for j in mine]
            assert not [j for j in mine if j.reason == "AssocGrpGRES"], mine
        # The limit was what held them back: the jobs grew to it, and physics got the rest.
        assert max(granted) == LIMIT, granted
        last = log.decisions["phys-1"]["after"]
        assert last != "-" and int(last.split("x")[-1]) * int(last.split(":")[1].split("x")[0]) >= 4
        # status says where the shares come from and what sacct accounted to each job, over
        # all its Slurm runs (joined by the comment).
        status = subprocess.run(
            [*site.argv()[:5], sys.executable, "-m", "sia_slurm.cli", "status", "--config",
             str(config_path), "--json"],
            env=site.env(), cwd=shared_tmp_path, capture_output=True, text=True, timeout=120,
            check=True,
        )  # fmt: skip
        data = json.loads(status.stdout)
        assert data["shares"].startswith("shares: Slurm's association shares")
        accounted = {j["sia_id"]: j["accounted_gpu_hours"] for j in data["jobs"]}
        assert set(accounted) == limited | {"phys-1"}
        assert all(hours is not None and hours >= 0 for hours in accounted.values()), accounted
    finally:
        if site.slurm_ids:
            site.run(["scancel", *site.slurm_ids], check=False)
