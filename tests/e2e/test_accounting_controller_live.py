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
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.protocol import StatePaths  # noqa: E402
from sia_slurm.slurm.observe.jsonparse import parse_squeue_json  # noqa: E402
from sia_slurm.slurm.runner import SubprocessRunner  # noqa: E402
from sia_slurm.state.tree import set_up  # noqa: E402
from sia_slurm_dev import DevCluster, DevClusterSpec, controller_config  # noqa: E402
from tests.accounts import TestAccounts  # noqa: E402
from tests.e2e.test_controller_live import Site, wait_for  # noqa: E402
from tests.slurm.conftest import LiveSubmitter  # noqa: E402

pytestmark = pytest.mark.slurm

SPEC = DevClusterSpec.parse("a100:2x4")  # the partitions the controller manages
LIMIT = 4  # biology's GrpTRES in tests/accounting_site.py
GROWTH_TIMEOUT_S = 300.0  # ~4 rounds idle; a move restarts a job, slower under load


def submitter(cluster: DevCluster, paths: StatePaths, account: str) -> LiveSubmitter:
    """Submits under ``account`` (sbatch reads SBATCH_ACCOUNT), as a user with ``-A`` would."""
    return LiveSubmitter(
        cluster, paths, SubprocessRunner(env={**cluster.env, "SBATCH_ACCOUNT": account})
    )


def make_site(cluster: DevCluster, accounts: TestAccounts, root: Path) -> tuple[Site, Path]:
    """A controller site on the accounting cluster, jobs submitted under ``physics``."""
    paths = StatePaths(root / "state")
    service = accounts.service
    set_up(paths.state_dir, service.uid, service.gid)
    config_path = root / "sia.yaml"
    config_path.write_text(
        controller_config(
            SPEC,
            paths.state_dir,
            round_seconds=10,
            policy_params={"lambda_a": 0.01},
            checkpoint_timeout_s=30,
        )
    )
    log_path = paths.state_dir / "controller.jsonl"
    return Site(cluster, root, submitter(cluster, paths, "physics"), config_path, log_path), paths


# 3.3 minutes of waiting, for CI time; it passes on 24.11 and 26.05 too
@pytest.mark.one_release
def test_a_three_minute_job_moved_runs_three_minutes_in_all(
    accounting_cluster: DevCluster,
    test_accounts: TestAccounts,
    shared_tmp_path: Path,
) -> None:
    """``--time=3``: the job grows 1 -> 2 GPUs, a move (requeue and restart), after ~55 s of
    running; Slurm restarts its clock at the requeue, so without the controller's TimeLimit the
    second run alone could use 3 minutes. It ends TIMEOUT with its runs' time (sacct) adding up
    to 3 minutes, give or take Slurm's time-limit check period. (It grew twice, 1 -> 2 -> 4,
    until a loaded machine, load 16, took 105 s from the start to the first move and the time
    ran out before the second: one move shows the limit carried over all the same.)"""
    site, paths = make_site(accounting_cluster, test_accounts, shared_tmp_path)
    site.submitter = LiveSubmitter(
        accounting_cluster,
        paths,
        SubprocessRunner(env={**accounting_cluster.env, "SBATCH_TIMELIMIT": "3"}),
    )
    slurm_id = ""
    try:
        slurm_id = site.submit("tl-1", partition="a100", max_gpus=4)
        assert site.slurm_job(slurm_id)["TimeLimit"] == "00:03:00"
        for step, kind in enumerate(("start", "move")):
            played = site.round()
            assert played.actions["tl-1"]["kind"] == kind, played.actions
            site.wait_started("tl-1", played.index)
            if kind == "move":
                # The time left was set on the run: 3 minutes less the earlier runs.
                limit = site.slurm_job(slurm_id)["TimeLimit"]
                record_file = site.paths.slurm_record("tl-1")
                assert limit < "00:03:00", (
                    limit,
                    record_file.read_text() if record_file.exists() else None,
                    played.actions["tl-1"],
                )
            if step < 1:
                time.sleep(55)  # ~1 minute of run time, with the start's own seconds

        def ended() -> dict[str, str] | None:
            record = site.slurm_job(slurm_id)
            done = record["JobState"] in ("TIMEOUT", "COMPLETED", "FAILED", "CANCELLED")
            return record if done else None

        record = wait_for(
            ended, "the job ends", timeout_s=240, diagnose=lambda: site.diagnosis("tl-1")
        )
        assert record["JobState"] == "TIMEOUT", record
        rows = site.run(
            ["sacct", "-X", "-n", "-P", "-D", "-j", slurm_id, "-o", "JobID,ElapsedRaw,State"]
        ).splitlines()
        runs = [int(row.split("|")[1]) for row in rows]
        assert len(runs) == 2, rows  # two runs: the start and the move
        # 180 s in all: each later run's limit is the time left in whole minutes (Slurm's
        # unit, rounded to the nearest: up to 30 s off), and Slurm checks limits every 30 s,
        # then waits KillWait (10 s). A first run of 89 s (load 20) left 91 s, set as 2 minutes,
        # and the second run ended after 146 s: 235 s in all.
        assert 180 - 30 <= sum(runs) <= 180 + 30 + 30 + 10, rows
    finally:
        if slurm_id:
            site.run(["scancel", slurm_id], check=False)


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
            if job.job_id in site.slurm_ids  # not an earlier test's, still listed
        }
        assert sorted(accounts.values()) == ["biology"] * 3 + ["physics"]
        # Rounds back to back until the jobs have grown to the limit and physics to the rest
        # (1 -> 2 -> 4 GPUs, each step after the job ran on the last: more rounds under load).
        granted: list[int] = []
        physics, decisions = 0, {}
        deadline = time.monotonic() + GROWTH_TIMEOUT_S
        while not (granted and max(granted) == LIMIT and physics >= 4):
            assert time.monotonic() < deadline, (granted, physics, decisions)
            log = site.round()
            decisions = log.decisions
            gpus = {
                job: int(d["after"].split("x")[-1]) * int(d["after"].split(":")[1].split("x")[0])
                for job, d in log.decisions.items()
                if d["after"] != "-"
            }
            granted.append(sum(g for job, g in gpus.items() if job in limited))
            physics = gpus.get("phys-1", 0)
            assert granted[-1] <= LIMIT, (granted, log.decisions)
            # Slurm agrees: the biology jobs it runs hold at most 4 GPUs, and none of them
            # waits released on the association's limit (the controller never asked for more).
            jobs = parse_squeue_json(site.run(["squeue", "--json"])).jobs
            mine = [j for j in jobs if j.account == "biology" and j.job_id in site.slurm_ids]
            running = sum(sum(j.gpus_per_node) for j in mine if j.state == "RUNNING")
            assert running <= LIMIT, [(j.job_id, j.state, j.gpus_per_node) for j in mine]
            assert not [j for j in mine if j.reason == "AssocGrpGRES"], mine
        # status says where the shares come from and what sacct accounted to each job, over
        # all its Slurm runs (joined by the comment); so does the dashboard.
        asked_at = time.monotonic()
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
        # The dashboard's data (what site/app.js reads) carries the same charge per job. The
        # jobs still run, so sacct's charge grows between the two reads, by at most the
        # cluster's 8 GPUs for the time between them (plus a second of rounding per run).
        dashboard = paths.state_dir / "dashboard"  # the service account's to write
        subprocess.run(
            [*site.argv()[:5], sys.executable, "-m", "sia_slurm.cli", "report", "--config",
             str(config_path), "--out", str(dashboard)],
            env=site.env(), cwd=shared_tmp_path, capture_output=True, text=True, timeout=120,
            check=True,
        )  # fmt: skip
        between_s = time.monotonic() - asked_at
        shown = json.loads((dashboard / "report.json").read_text())
        charged = {j["id"]: j["accounted_gpu_hours"] for j in shown["jobs"]}
        assert set(charged) == set(accounted), (charged, accounted)
        assert all(charged[job] >= accounted[job] for job in accounted), (charged, accounted)
        assert sum(charged.values()) > 0, charged  # the jobs have run (they grew)
        grown = sum(charged.values()) - sum(accounted.values())
        assert grown <= 8 * (between_s + 2) / 3600, (charged, accounted, between_s)
    finally:
        if site.slurm_ids:
            site.run(["scancel", *site.slurm_ids], check=False)
