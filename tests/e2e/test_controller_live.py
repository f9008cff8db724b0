"""Issue 6 acceptance: the real controller (service + Slurm backend + Sia policy) on real Slurm.

Every round is ``python -m sia_slurm.cli controller run --once`` in a fresh process, as cron
runs it, against the dev cluster (a100, rtx and t4 partitions, 2 nodes x 4 GPUs each), with
tests/slurm/protocol_job.py as the managed job: it counts, checkpoints its counter when asked
to stop, and reports the step times of the cifar10 seed profile, so the goodput model sees
what a real app would show and the policy decides as it would for one. Nothing is steered by
hand except what an administrator would do (drain nodes, kill the controller); the checks
read the jobs' own event files, the controller's JSON log, its SQLite journal and Slurm.

Requeued jobs restart within seconds (the backend clears the requeue's BeginTime delay), so
the module takes about two minutes including the cluster's start.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # so `tests.*` helpers import however pytest was started
    sys.path.insert(0, str(REPO))

from sia_slurm.cluster import BatchChoice, JobPhase, Move, Start  # noqa: E402
from sia_slurm.config import load_config  # noqa: E402
from sia_slurm.controller.idle_waits import WaitCause  # noqa: E402
from sia_slurm.core import Configuration  # noqa: E402
from sia_slurm.policy.base import NodeShare  # noqa: E402
from sia_slurm.protocol import (  # noqa: E402
    Assignment,
    MetricsReport,
    ProtocolError,
    StatePaths,
    read_document,
)
from sia_slurm.slurm.backend import SlurmBackend  # noqa: E402
from sia_slurm.slurm.observe.jsonparse import parse_squeue_json  # noqa: E402
from sia_slurm.slurm.records import parse_records  # noqa: E402
from sia_slurm.state.tree import set_up  # noqa: E402
from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec, controller_config  # noqa: E402
from tests.accounts import SERVICE_ACCOUNT, TestAccounts  # noqa: E402
from tests.slurm.conftest import LiveSubmitter  # noqa: E402

pytestmark = pytest.mark.slurm

SEED_PROFILE = REPO / "profiles" / "cifar10" / "seed.csv"
ROUND_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class RoundLog:
    """What one controller process logged: its round, decisions and actions by job."""

    index: int
    decisions: dict[str, dict[str, Any]]
    actions: dict[str, dict[str, Any]]
    lines: list[dict[str, Any]]


@dataclass
class Site:
    """A controller site on the dev cluster: config, state directory, log, submitter."""

    cluster: DevCluster
    root: Path
    submitter: LiveSubmitter
    config_path: Path
    log_path: Path
    slurm_ids: list[str] = field(default_factory=list)

    @property
    def paths(self) -> StatePaths:
        return self.submitter.paths

    def run(self, argv: list[str], check: bool = True) -> str:
        return self.cluster.runner().run(argv, check=check).stdout

    # ---- jobs ----------------------------------------------------------------------------

    def submit(self, sia_id: str, *, ack_delay: float = 0.0, **spec: Any) -> str:
        """A managed cifar10-like job, held, as sia-sbatch submits it."""
        job_args = [
            "--seed-profile",
            str(SEED_PROFILE),
            "--profile-type",
            "a100=dgx",
            "--finish-file",
            str(self.finish_file(sia_id)),
            "--ack-delay",
            str(ack_delay),
        ]
        # The job's age counts from its Slurm submission (seconds ago here), so it is told that
        # a restart costs 0.1 s: Sia's restart factor max(age - restarts*S, 0) / (age + S) is
        # then ~1, and whether a move pays off does not hinge on how fast this machine is.
        spec.setdefault("restart_cost", 0.1)
        job_id = self.submitter.submit(sia_id, job_args=job_args, **spec)
        self.slurm_ids.append(job_id)
        return job_id

    def submit_unmanaged(self, node: str, gpus: int) -> str:
        partition = node.rsplit("-", 1)[0]
        argv = ["sbatch", "--parsable", "-p", partition, "-w", node, f"--gpus-per-node={gpus}"]
        job_id = self.run([*argv, "-o", "/dev/null", "--wrap", "sleep 600"]).strip()
        self.slurm_ids.append(job_id)
        return job_id

    def finish_file(self, sia_id: str) -> Path:
        return self.root / f"finish-{sia_id}"

    def finish(self, sia_id: str) -> None:
        """Training is done: the job exits 0 at its next step."""
        self.finish_file(sia_id).touch()

    def events(self, sia_id: str, kind: str | None = None) -> list[dict[str, Any]]:
        events = self.submitter.events(sia_id)
        return [e for e in events if kind is None or e["event"] == kind]

    def assignment(self, sia_id: str) -> Assignment | None:
        path = self.paths.assignment(sia_id)
        return read_document(Assignment, path) if path.exists() else None

    def wait_started(self, sia_id: str, round_index: int) -> dict[str, Any]:
        """The job's start for ``round_index``, once it has reported metrics from that run."""

        def started() -> dict[str, Any] | None:
            starts = [e for e in self.events(sia_id, "start") if e["round"] == round_index]
            if not starts:
                return None
            try:
                report = read_document(MetricsReport, self.paths.metrics(sia_id))
            except ProtocolError:
                return None
            fresh = report.round_index >= round_index and report.time > starts[-1]["time"]
            return starts[-1] if fresh else None

        return wait_for(
            started,
            f"{sia_id} started for round {round_index} and reporting",
            diagnose=lambda: self.diagnosis(sia_id),
        )

    def diagnosis(self, sia_id: str | None = None) -> str:
        """What a failed wait shows: the job's last events, Slurm's view, slurmctld's log."""
        lines = [json.dumps(e) for e in self.events(sia_id)[-6:]] if sia_id else []
        lines += [self.run(["scontrol", "-o", "show", "job"], check=False)]
        log = self.cluster.layout.log_dir / "slurmctld.log"
        lines += log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
        return "\n".join(lines)

    # ---- the controller ------------------------------------------------------------------

    def argv(self, *extra: str, python: str | Path = sys.executable) -> list[str]:
        """The controller's command line for one round, as the service account (``setpriv``
        execs the controller itself, so a signal to the process reaches the controller);
        ``python``: another release's interpreter (tests/e2e/test_upgrade_live.py)."""
        user = SERVICE_ACCOUNT
        return [
            *("setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"),
            str(python),
            "-m",
            "sia_slurm.cli",
            "controller",
            "run",
            "--once",
            "--config",
            str(self.config_path),
            "--log-file",
            str(self.log_path),
            *extra,
        ]

    def loop_argv(self, python: str | Path = sys.executable) -> list[str]:
        """The controller's loop, as systemd runs it: :meth:`argv` without ``--once``."""
        return [a for a in self.argv(python=python) if a != "--once"]

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.cluster.env, "PYTHONPATH": str(REPO)}

    def spawn_round(self, *extra: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*extra),
            env=self.env(),
            cwd=self.root,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def round(self, *extra: str) -> RoundLog:
        """One ``controller run --once``; it must exit 0 with every action done."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        done = subprocess.run(
            self.argv(*extra),
            env=self.env(),
            cwd=self.root,
            capture_output=True,
            text=True,
            timeout=ROUND_TIMEOUT_S,
        )
        lines = self.log_lines(offset)
        assert done.returncode == 0, (done.returncode, done.stderr[-2000:], lines[-5:])
        (summary,) = [line for line in lines if line.get("event") == "round"]
        failed = [a for a in lines if a.get("event") == "action" and a["result"] == "failed"]
        assert not failed, failed
        return RoundLog(
            index=summary["round"],
            decisions={d["job"]: d for d in lines if d.get("event") == "decision"},
            actions={
                a["job"]: a
                for a in lines
                if a.get("event") == "action" and a["round"] == summary["round"]
            },
            lines=lines,
        )

    def log_lines(self, offset: int = 0) -> list[dict[str, Any]]:
        with open(self.log_path, encoding="utf-8") as handle:
            handle.seek(offset)
            return [json.loads(line) for line in handle if line.strip()]

    def journal(self) -> list[dict[str, Any]]:
        """The action journal, oldest first."""
        with sqlite3.connect(f"file:{self.paths.state_dir / 'sia.db'}?mode=ro", uri=True) as db:
            db.row_factory = sqlite3.Row
            return [dict(row) for row in db.execute("SELECT * FROM actions ORDER BY id")]

    def job_phases(self) -> dict[str, str]:
        with sqlite3.connect(f"file:{self.paths.state_dir / 'sia.db'}?mode=ro", uri=True) as db:
            return dict(db.execute("SELECT sia_id, phase FROM jobs").fetchall())

    # ---- Slurm ---------------------------------------------------------------------------

    def slurm_job(self, job_id: str) -> dict[str, str]:
        (record,) = parse_records(self.run(["scontrol", "-o", "show", "job", job_id]))
        return record

    def squeue(self) -> dict[str, tuple[Any, ...]]:
        """Every job's state as an administrator would compare it before and after."""
        jobs = parse_squeue_json(self.run(["squeue", "--json"])).jobs
        return {
            job.job_id: (
                job.state,
                job.held,
                job.reason,
                job.partition,
                job.nodes,
                job.node_count,
                job.tasks,
                job.cpus,
                job.gpus_per_node,
                job.requested_gpus_per_node,
                job.required_nodes,
                job.restart_count,
            )
            for job in jobs
            if job.job_id in self.slurm_ids
        }

    def wait_slurm_state(self, job_id: str, state: str) -> dict[str, str]:
        def reached() -> dict[str, str] | None:
            record = self.slurm_job(job_id)
            return record if record["JobState"] == state else None

        return wait_for(reached, f"Slurm job {job_id} {state}", diagnose=self.diagnosis)


def wait_for(
    probe: Callable[[], Any],
    what: str,
    timeout_s: float = 60.0,
    diagnose: Callable[[], str] = lambda: "",
) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s: {what}\n{diagnose()}")
        time.sleep(0.2)


@pytest.fixture
def site(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    test_accounts: TestAccounts,
    shared_tmp_path: Path,
) -> Iterator[Site]:
    """The controller runs as the service account on a tree made by ``sia-slurm setup``; the
    jobs are root's (the controller is no more privileged for them)."""
    tmp_path = shared_tmp_path  # the service account must reach it
    paths = StatePaths(tmp_path / "state")
    service = test_accounts.service
    set_up(paths.state_dir, service.uid, service.gid)
    config_path = tmp_path / "sia.yaml"
    # lambda_a 0.01 as etc/sia.yaml: keep equivalent allocations instead of swapping them.
    config = controller_config(
        DevClusterSpec.parse(DEFAULT_SPEC),
        paths.state_dir,
        round_seconds=10,
        policy_params={"lambda_a": 0.01},
        checkpoint_timeout_s=30,
    )
    config_path.write_text(config)
    submitter = LiveSubmitter(dev_cluster, paths, dev_cluster.runner())
    log_path = paths.state_dir / "controller.jsonl"  # where the service account may write
    site = Site(dev_cluster, tmp_path, submitter, config_path, log_path)
    nodes = [f"{t}-{i}" for t in ("a100", "rtx", "t4") for i in (1, 2)]
    try:
        yield site
    finally:
        if site.slurm_ids:
            site.run(["scancel", *site.slurm_ids], check=False)
        site.run(["scontrol", "update", f"NodeName={','.join(nodes)}", "State=RESUME"], check=False)


def check_counter_continues(site: Site, sia_id: str) -> None:
    """Each restart resumes the counter exactly where the preceding checkpoint left it."""
    events = site.events(sia_id)
    assert not [e for e in events if e["event"] in ("refused", "terminated")], events
    last_saved = 0
    for event in events:
        if event["event"] == "start":
            assert event["counter"] == last_saved, (sia_id, event, events)
        elif event["event"] in ("acked", "done"):
            assert event["counter"] >= last_saved
            last_saved = event["counter"]


def partition_nodes(partition: str) -> list[str]:
    return [f"{partition}-1", f"{partition}-2"]


# ------------------------------------------------------------------------------------------------


def test_a_job_starts_grows_changes_type_and_finishes_once(site: Site) -> None:
    """Pending -> released with an assignment; 1 -> 4 GPUs by Sia's growth cap (4x); its nodes
    drained, it moves to another type; an unmanaged job and drained nodes are left alone;
    dry-run rounds change nothing; the job completes once, its counter never lost."""
    bystander = site.submit_unmanaged("rtx-1", 2)
    site.wait_slurm_state(bystander, "RUNNING")
    slurm_id = site.submit("grow", max_gpus=4)

    # Dry run: the decision is logged and journaled as skipped; Slurm and the files unchanged.
    before = site.squeue()
    dry = site.round("--dry-run")
    assert dry.decisions["grow"]["action"] == "start" and dry.decisions["grow"]["dry_run"]
    assert dry.actions["grow"]["result"] == "dry-run"
    assert site.squeue() == before
    assert before[slurm_id][:2] == ("PENDING", True)
    assert site.assignment("grow") is None
    assert [e["state"] for e in site.journal()] == ["skipped"]

    # Released with an assignment on 1 GPU, then grown to 4 (the 4x cap), one round at a time.
    shapes = []
    for kind in ("start", "move"):
        played = site.round()
        assert played.actions["grow"]["kind"] == kind, played.actions
        start = site.wait_started("grow", played.index)
        assignment = site.assignment("grow")
        assert assignment is not None and assignment.round_index == played.index
        assert start["slurm_job_id"] == assignment.slurm_job_id == slurm_id
        shapes.append((start["partition"], start["nodes"], start["gpus_on_node"]))
    first_type = shapes[0][0]
    assert shapes == [(first_type, 1, 1), (first_type, 1, 4)]

    # The administrator drains every node of that type.
    drained = partition_nodes(first_type)
    site.run(["scontrol", "update", f"NodeName={','.join(drained)}", "State=DRAIN", "Reason=e2e"])
    before, assignment = site.squeue(), site.assignment("grow")
    dry = site.round("--dry-run")
    assert dry.decisions["grow"]["action"] == "move", dry.decisions
    assert site.squeue() == before and site.assignment("grow") == assignment
    assert not site.paths.stop_request("grow").exists()

    played = site.round()
    assert played.actions["grow"]["kind"] == "move"
    start = site.wait_started("grow", played.index)
    assert start["partition"] != first_type and start["nodes"] * start["gpus_on_node"] == 4
    # Not on a drained node, nor where the unmanaged job leaves too few GPUs.
    assert start["node_list"] not in (*drained, "rtx-1"), start
    assert start["node_list"] == played.actions["grow"]["nodes"].split(":")[0]

    settled = site.round()  # nothing left to move: keep (or adapt the batch in place)
    assert settled.actions.get("grow", {}).get("kind", "rebatch") == "rebatch", settled.actions

    site.finish("grow")
    site.wait_slurm_state(slurm_id, "COMPLETED")
    site.round()
    assert site.job_phases()["grow"] == "done"

    events = site.events("grow")
    assert len(site.events("grow", "done")) == 1
    assert [e["round"] for e in site.events("grow", "start")] == sorted(
        {e["round"] for e in site.events("grow", "start")}
    )
    check_counter_continues(site, "grow")
    assert site.events("grow", "done")[0]["counter"] > events[0]["counter"]
    # Every real action was done, in Slurm and in the journal; the dry runs only journaled.
    states = [(e["kind"], e["state"]) for e in site.journal()]
    assert ("move", "skipped") in states and ("start", "skipped") in states
    assert all(state in ("done", "skipped") for _, state in states), states
    record = site.slurm_job(slurm_id)
    assert (record["JobState"], record["Restarts"]) == ("COMPLETED", "2")
    # The unmanaged job kept its GPUs the whole time.
    record = site.slurm_job(bystander)
    assert (record["JobState"], record["NodeList"], record["Restarts"]) == (
        "RUNNING",
        "rtx-1",
        "0",
    )


def test_sigkill_while_waiting_for_a_checkpoint_then_restart_completes_every_job_once(
    site: Site,
) -> None:
    """kill -9 while the round waits for a slow job's checkpoint ack; the next controller
    process re-applies the journaled moves; every job then completes exactly once."""
    ids = {
        "calm": site.submit("calm", max_gpus=2),
        "slow": site.submit("slow", max_gpus=2, ack_delay=6.0),
    }
    first = site.round()
    assert {first.actions[j]["kind"] for j in ids} == {"start"}
    for sia_id in ids:
        site.wait_started(sia_id, first.index)

    # The next round grows both to 2 GPUs: both must checkpoint; "slow" takes 6 s.
    grow_round = first.index + 1
    controller = site.spawn_round()
    try:

        def acked(sia_id: str) -> bool:
            return any(site.paths.job_dir(sia_id).glob(f"ack-{grow_round}.*"))

        def inside_apply() -> bool:
            return acked("calm") and bool(site.events("slow", "stop-seen")) and not acked("slow")

        # 120 s: the spawned controller's own start-up (Python, numpy, scipy) took 24-59 s at
        # load 16; the window itself is the slow job's 6 s of checkpointing, whenever it comes
        wait_for(inside_apply, "the round to wait for the slow job's checkpoint", 120.0)
    finally:
        os.kill(controller.pid, signal.SIGKILL)
        controller.wait()
    assert controller.returncode == -signal.SIGKILL

    pending = [(e["sia_id"], e["kind"]) for e in site.journal() if e["state"] == "pending"]
    assert sorted(pending) == [("calm", "move"), ("slow", "move")]
    assert {site.slurm_job(j)["JobState"] for j in ids.values()} == {"RUNNING"}

    # A new process: reconcile re-applies both moves, then decides its own round.
    recovered = site.round()
    reapplied = [
        line
        for line in recovered.lines
        if line.get("event") == "action" and line["round"] == grow_round
    ]
    assert sorted((a["job"], a["result"]) for a in reapplied) == [
        ("calm", "done"),
        ("slow", "done"),
    ]
    assert all("re-applied" in a["result_message"] for a in reapplied)
    for sia_id in ids:
        start = site.wait_started(sia_id, grow_round)
        assert start["gpus_on_node"] * start["nodes"] == 2
    settled = site.round()  # both at their cap: nothing to move
    assert all(a["kind"] == "rebatch" for a in settled.actions.values()), settled.actions
    # Issue 38's measure, live: with both jobs active, none waited beside free GPUs (by cause).
    prom = (site.paths.state_dir / "metrics" / "sia.prom").read_text().splitlines()
    waits = [line for line in prom if line.startswith("sia_jobs_waiting_beside_free_gpus{")]
    assert len(waits) == len(WaitCause) and all(line.endswith(" 0") for line in waits), waits

    for sia_id in ids:
        site.finish(sia_id)
    for job_id in ids.values():
        record = site.wait_slurm_state(job_id, "COMPLETED")
        assert record["Restarts"] == "1"
    site.round()
    assert site.job_phases() == {"calm": "done", "slow": "done"}
    for sia_id in ids:
        assert len(site.events(sia_id, "done")) == 1
        assert [e["round"] for e in site.events(sia_id, "start")] == [first.index, grow_round]
        assert [e["round"] for e in site.events(sia_id, "acked")] == [grow_round]
        check_counter_continues(site, sia_id)
    journal = site.journal()
    assert not [e for e in journal if e["state"] == "pending"]
    prom = (site.paths.state_dir / "metrics" / "sia.prom").read_text().splitlines()
    assert "sia_actions_pending 0" in prom
    assert not any(site.paths.stop_request(sia_id).exists() for sia_id in ids)
    moves = [e for e in journal if e["round_index"] == grow_round]
    assert [e["state"] for e in moves] == ["done", "done"]
    assert all(e["message"].startswith("re-applied") for e in moves), moves


def test_moves_into_gpus_another_move_frees_in_the_same_round(site: Site) -> None:
    """Two jobs swap nodes in one apply: each move targets the GPUs the other frees. The
    backend stops both before it places either, so Slurm just runs them swapped."""
    backend = SlurmBackend(load_config(site.config_path), site.cluster.runner())
    ids = {"left": site.submit("left"), "right": site.submit("right")}
    batch = BatchChoice(128, 32, 0)
    config = Configuration("t4", 1, 4)

    def on(node: str) -> tuple[NodeShare, ...]:
        return (NodeShare(node, 4),)

    results = backend.apply(
        [Start("left", 1, config, on("t4-1"), batch), Start("right", 1, config, on("t4-2"), batch)]
    )
    assert all(r.ok for r in results), results
    for sia_id in ids:
        site.wait_started(sia_id, 1)
    results = backend.apply(
        [Move("left", 2, config, on("t4-2"), batch), Move("right", 2, config, on("t4-1"), batch)]
    )
    assert all(r.ok for r in results), results
    for sia_id, node in (("left", "t4-2"), ("right", "t4-1")):
        start = site.wait_started(sia_id, 2)
        assert (start["node_list"], start["gpus_on_node"]) == (node, 4)
        check_counter_continues(site, sia_id)
    phases = {job.sia_id: job.phase for job in backend.snapshot().jobs}
    assert phases == {"left": JobPhase.RUNNING, "right": JobPhase.RUNNING}
