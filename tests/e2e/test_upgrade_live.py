"""Issue 37 item 4: a site upgrades sia-slurm with jobs running, and loses nothing.

The previous release (:func:`previous_release`: the newest ``v*`` tag before this commit) runs
the site first, all of it its own code: ``git archive`` of its tag installed in its own virtual
environment (editable, as 0.1.0 had to be: its profiles lay beside its package), its
``controller_config`` renders the site's ``sia.yaml``, its ``set_up`` makes the state tree, its
controller loop runs as the service account, and its jobs are its ``tests/slurm/protocol_job.py``
run by its interpreter, their ``spec.json`` written by its ``JobSpec``.

Three jobs start; the administrator drains their nodes; when the old controller logs its first
move it gets SIGTERM (``systemctl stop``: it ends its round and exits 0), and a fourth job is
submitted that no controller has seen yet. This tree's controller then starts on the same
config and state: it migrates the database, converts the policy's memory, moves the jobs that
still need it, starts the waiting one, and the jobs finish. Every job completed exactly once, in
Slurm and by its own events (no two runs at once, no step lost beyond its checkpoint, every
launch one a controller decided: tests/e2e/test_controller_kill_live.py's check), the journal
has nothing pending and neither controller logged an error. Last, the previous release is
started on the migrated database: a downgrade, which it must refuse without changing it where
the database's schema is newer than its own (0.1.0: schema 3, today 4), and may run on where it
is not.

The jobs keep the previous release's job side to the end, as they do on a site that upgrades the
controller host first (docs/operations.md, "Upgrading"). The SIGTERM run runs on every Slurm
release, the SIGKILL run on the host's (``one_release``, for CI time).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sia_slurm import __version__
from sia_slurm.protocol import StatePaths
from sia_slurm.state import SCHEMA_VERSION
from sia_slurm_dev import DevCluster
from tests.accounts import TestAccounts
from tests.e2e.kill_harness import KillPlan, Supervisor
from tests.e2e.test_controller_kill_live import (
    JOBS,
    NODES,
    KillSite,
    all_reporting,
    check_exactly_once,
    nodes_of,
)
from tests.e2e.test_controller_live import Site
from tests.slurm.conftest import LiveSubmitter

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[2]
ROUND_SECONDS = 4.0
WAITING = "kd"  # submitted as the old controller stops: only the new one sees it
# The first release, tagged after the fact: a clone made without tags finds it by its commit.
FIRST_RELEASE = ("v0.1.0", "c0fc770ea15205d3e8c875d2a125bfdf712d1286")
# What the previous release says when it refuses a database of a newer schema (0.1.0's words;
# a later release says "newer than this sia-slurm (X) knows").
NEWER_SCHEMA = f"schema version {SCHEMA_VERSION} is newer than this sia-slurm"
SCHEMA_PROGRAM = "from sia_slurm.state import SCHEMA_VERSION; print(SCHEMA_VERSION)"


def git(*args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True
    ).stdout.strip()


def previous_release() -> tuple[str, str]:
    """The release before this tree: the newest ``v*`` tag reachable from HEAD whose commit is
    not HEAD's (a tagged release's own commit upgrades from the release before it); without
    tags, :data:`FIRST_RELEASE`. Returns (tag, commit)."""
    head = git("rev-parse", "HEAD")
    for tag in git("tag", "--list", "v*", "--merged", "HEAD", "--sort=-v:refname").split():
        commit = git("rev-list", "-n", "1", tag)
        if commit != head:
            return tag, commit
    tag, commit = FIRST_RELEASE
    found = subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"])
    if found.returncode != 0:
        pytest.fail(
            f"no release before this commit: no v* tag, and {tag}'s commit {commit[:7]} is not in "
            "this clone (a shallow clone?): the upgrade test needs the previous release's sources"
        )
    return tag, commit


@dataclass(frozen=True)
class Release:
    """A release's sources and the interpreter of its virtual environment."""

    tag: str
    commit: str
    source: Path
    python: Path

    def run(self, program: str, *args: str) -> str:
        """``python -c program args`` in the release's environment (no PYTHONPATH, from /, so
        that nothing of this tree is imported)."""
        done = subprocess.run(
            [str(self.python), "-c", program, *args],
            env=release_env(),
            cwd="/",
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, f"{self.tag}: {done.stderr[-2000:]}"
        return done.stdout


def release_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return {**env, **(extra or {})}


def install_release(directory: Path) -> Release:
    """The previous release's sources (``git archive``) installed editable, with its dev
    cluster package where it has one, in a virtual environment that sees this Python's
    packages (torch, numpy) but none of this tree."""
    tag, commit = previous_release()
    source, venv = directory / "source", directory / "venv"
    source.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(source)], input=archive, check=True)
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    python = venv / "bin" / "python"
    packages = [source, *([source / "dev"] if (source / "dev" / "pyproject.toml").exists() else [])]
    for package in packages:
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
             "--no-index", "-e", str(package)],
            env=release_env(), cwd="/", check=True, capture_output=True, timeout=300,
        )  # fmt: skip
    release = Release(tag, commit, source, python)
    where = release.run("import sia_slurm; print(sia_slurm.__file__)").strip()
    assert Path(where).is_relative_to(source), f"{tag} imports sia_slurm from {where}"
    return release


CONFIG_PROGRAM = """
import sys
from pathlib import Path
try:
    from sia_slurm_dev import DEFAULT_SPEC, DevClusterSpec, controller_config
except ImportError:  # 0.1.0: the dev cluster lived in the runtime package
    from sia_slurm.devcluster import DEFAULT_SPEC, DevClusterSpec, controller_config
print(controller_config(DevClusterSpec.parse(DEFAULT_SPEC), Path(sys.argv[1]),
      round_seconds=float(sys.argv[2]), policy_params={"lambda_a": 0.01},
      checkpoint_timeout_s=30, bin_dir=sys.argv[3]), end="")
"""

SET_UP_PROGRAM = """
import sys
from pathlib import Path
from sia_slurm.state.tree import set_up
set_up(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
"""


@dataclass
class UpgradeSite:
    """The kill tests' site, run first by the previous release's controller and jobs."""

    ks: KillSite
    release: Release

    def schema_version(self) -> int:
        with sqlite3.connect(f"file:{self.ks.paths.state_dir / 'sia.db'}?mode=ro", uri=True) as db:
            return int(db.execute("PRAGMA user_version").fetchone()[0])

    def rounds(self) -> int:
        with sqlite3.connect(f"file:{self.ks.paths.state_dir / 'sia.db'}?mode=ro", uri=True) as db:
            return int(db.execute("SELECT COUNT(*) FROM rounds").fetchone()[0])


@pytest.fixture
def upgrade_site(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    test_accounts: TestAccounts,
    shared_python: str,
    shared_tmp_path: Path,
    tmp_path: Path,
) -> Iterator[UpgradeSite]:
    release = install_release(shared_tmp_path / "previous")
    paths = StatePaths(shared_tmp_path / "state")
    service = test_accounts.service
    release.run(SET_UP_PROGRAM, str(paths.state_dir), str(service.uid), str(service.gid))
    log_path = paths.state_dir / "controller.jsonl"
    plan = KillPlan(shared_tmp_path / "kill", paths.state_dir / "sia.db", log_path)
    plan.install(service.uid, service.gid)  # no rules: the shims only log the Slurm calls
    text = release.run(CONFIG_PROGRAM, str(paths.state_dir), str(ROUND_SECONDS), str(plan.bin_dir))
    config_path = shared_tmp_path / "sia.yaml"
    config_path.write_text(text)
    assert yaml.safe_load(text)["slurm"]["bin_dir"] == str(plan.bin_dir)
    old_job = release.source / "tests" / "slurm" / "protocol_job.py"
    submitter = LiveSubmitter(
        dev_cluster, paths, dev_cluster.runner(), python=str(release.python), protocol_job=old_job
    )
    site = Site(dev_cluster, shared_tmp_path, submitter, config_path, log_path)
    old_env = release_env(dev_cluster.env)  # no PYTHONPATH: nothing of this tree
    supervisor = Supervisor(site.loop_argv(release.python), old_env, shared_tmp_path)
    us = UpgradeSite(KillSite(site, plan, supervisor, tmp_path), release)
    try:
        yield us
    finally:
        us.ks.tear_down()  # the supervisor then running: the new release's


def first_move_logged(ks: KillSite, since: float) -> dict[str, Any] | None:
    return next(
        (line for line in ks.log_lines() if line["ts"] > since and line.get("action") == "move"),
        None,
    )


@pytest.mark.parametrize(
    "signum",
    [
        pytest.param(signal.SIGTERM, id="sigterm"),
        # The journal's replay across releases: the Slurm commands it replays run on every
        # release in the SIGTERM run and the kill tests, so this one runs on the host's only.
        pytest.param(signal.SIGKILL, id="sigkill", marks=pytest.mark.one_release),
    ],
)
def test_upgrade_with_jobs_running_moving_and_waiting(
    upgrade_site: UpgradeSite, signum: signal.Signals
) -> None:
    """SIGTERM: ``systemctl stop``, the old controller ends its round. SIGKILL: the stop timed
    out (or the host went down) in the middle of the round: the new controller finishes the
    actions the old one journaled, each within the kill tests' recovery time."""
    us, ks = upgrade_site, upgrade_site.ks
    site, release = ks.site, us.release
    print(f"upgrading from {release.tag} ({release.commit[:7]}) to {__version__} (this tree)")

    # The previous release runs the site: three jobs start.
    ks.jobs = JOBS
    for sia_id in JOBS:
        ks.submit(sia_id, exit_delay=0.0)
    since = time.time()
    ks.supervisor.start()
    started = ks.wait(lambda: all_reporting(ks, since), f"{release.tag}: every job reporting")

    # The administrator drains the jobs' nodes; at the old controller's first move, it is
    # stopped as systemd stops it, and a job arrives that only the new controller will see.
    types = {node.rsplit("-", 1)[0] for run in started.values() for node in nodes_of(run)}
    drained = [node for node in NODES if node.rsplit("-", 1)[0] in types]
    drain = time.time()
    ks.nodes_state(drained, "DRAIN")
    ks.wait(lambda: first_move_logged(ks, drain), f"{release.tag}: a move decided")
    ks.submit(WAITING, exit_delay=0.0)
    stopped = time.time()
    old = ks.supervisor.stop(signum=signum)
    pending = [entry["id"] for entry in ks.pending()]
    expected = -signal.SIGKILL if signum == signal.SIGKILL else 0  # SIGTERM: its round ended
    assert old is not None and old.returncode == expected, (old, ks.diagnosis())
    if signum == signal.SIGKILL:  # check_exactly_once: each action it left is re-applied
        ks.timed_kills.append(
            {"phase": "upgrade", "delay": 0.0, "pid": old.pid, "time": stopped, "pending": pending}
        )
    old_schema = int(release.run(SCHEMA_PROGRAM))
    assert us.schema_version() == old_schema <= SCHEMA_VERSION, (old_schema, us.schema_version())
    print(f"{release.tag} stopped ({signum.name}) with actions {pending or 'none'} pending")

    # This tree's controller, on the same config and state.
    previous = ks.supervisor
    ks.supervisor = Supervisor(site.loop_argv(), site.env(), site.root)
    ks.supervisor.exits += previous.exits  # the old controller's end, for check_exactly_once
    ks.jobs = (*JOBS, WAITING)
    ks.supervisor.start()
    moved = ks.wait(lambda: all_reporting(ks, stopped), "every job reporting after the upgrade")
    for sia_id in JOBS:
        assert not set(nodes_of(moved[sia_id])) & set(drained), (sia_id, moved[sia_id], drained)
    assert us.schema_version() == SCHEMA_VERSION
    restored = [
        line["message"]
        for line in ks.log_lines()
        if line["ts"] > stopped and "restoring the controller" in str(line.get("message", ""))
    ]
    assert not restored, f"left out of the controller's memory: {restored}"

    # The nodes come back and the jobs finish.
    ks.nodes_state(drained, "RESUME")
    for sia_id in ks.jobs:
        site.finish(sia_id)
    ks.wait(
        lambda: (
            {j.state for j in ks.squeue().values()} == {"COMPLETED"}
            and set(site.job_phases().values()) == {"done"}
        ),
        "every job COMPLETED in Slurm and done for the controller",
    )
    ks.wait(ks.last_controller_settled, "the new controller's first round")
    new = ks.supervisor.stop()
    ks.keep_evidence()
    assert new is not None and new.returncode == 0, ks.diagnosis()
    check_exactly_once(ks)

    # A downgrade: a previous release of an older schema refuses the migrated database and
    # leaves it as it is; one of the same schema (no format changed since) runs on it.
    rounds = us.rounds()
    downgrade = subprocess.run(
        site.argv(python=release.python),
        env=release_env(site.cluster.env),
        cwd=site.root,
        capture_output=True,
        text=True,
        timeout=180,
    )
    output = downgrade.stdout + downgrade.stderr
    assert "Traceback" not in output, output[-3000:]
    if old_schema < SCHEMA_VERSION:
        assert downgrade.returncode != 0 and NEWER_SCHEMA in output, output[-3000:]
        assert (us.schema_version(), us.rounds()) == (SCHEMA_VERSION, rounds)
    else:
        assert downgrade.returncode == 0, output[-3000:]
        assert (us.schema_version(), us.rounds()) == (SCHEMA_VERSION, rounds + 1)
    print(json.dumps({"downgrade": output.strip().splitlines()[-1:]}))
