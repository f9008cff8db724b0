"""Issue 18 items 6 and 4: Slurm's daemons die under the controller, on the real dev cluster.

The controller runs as its loop (``sia-slurm controller run``, as systemd runs it) as the
service account, with tests/slurm/protocol_job.py as the managed jobs (they count, checkpoint
when asked to stop, and log every event). The dev cluster's fault operations
(:meth:`DevCluster.kill_slurmctld`, ``start_slurmctld``, ``kill_slurmd``, ``start_slurmd``) do
to Slurm what a crash does:

* slurmctld SIGKILLed while the jobs run, away for a few rounds (they fail and say so) and
  started again (without ``-c``, from its saved state), then killed and started again at once:
  the jobs run on untouched and the controller goes on.
* slurmctld killed right after a round moved jobs (0.2 s, 1.5 s and 3 s after the moves'
  release: before and after Slurm relaunches them, when what slurmctld acknowledged may not be
  saved yet), also for a job granted two nodes x 4 GPUs (item 4's shape): whatever state Slurm
  comes back in, the controller repairs it.
* a node dies under a running job (its slurmd and the job's processes SIGKILLed), or its slurmd
  alone (the job's processes live on): Slurm sets the node DOWN, the job is started on another
  node from its checkpoint, and once the node's slurmd is back the node is capacity again (the
  job is moved onto it when every other node is drained); a run whose slurmd alone died and
  that no stop request reached stops by itself once the job runs elsewhere.

In every scenario each job completes exactly once, none FAILED, and its own history shows
every run starting from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.config import load_config  # noqa: E402
from sia_slurm.protocol import JobSpec, StatePaths, exit_name, write_document  # noqa: E402
from sia_slurm.slurm.backend import SlurmBackend  # noqa: E402
from sia_slurm.slurm.observe.jsonparse import parse_squeue_json  # noqa: E402
from sia_slurm.slurm.records import parse_records  # noqa: E402
from sia_slurm.slurm.runner import CommandError  # noqa: E402
from sia_slurm.state.tree import set_up  # noqa: E402
from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec, controller_config  # noqa: E402
from sia_slurm_dev.slurm_conf import PREEMPTING_PARTITION  # noqa: E402
from tests.accounts import SERVICE_ACCOUNT, TestAccounts  # noqa: E402
from tests.e2e.test_controller_live import Site  # noqa: E402
from tests.slurm.conftest import LiveSubmitter  # noqa: E402

pytestmark = pytest.mark.slurm

ROUND_SECONDS = 4.0
NODES = tuple(f"{t}-{i}" for t in ("a100", "rtx", "t4") for i in (1, 2))
WAIT_S = 120.0  # one step of a scenario (a move, a requeue after a node failure...)
# A job whose latest event (of protocol_job.py) is one of these is not running as assigned: it
# is stopping or has ended (a run killed with its node ends silently: its report goes stale).
NOT_RUNNING = ("stop-seen", "acked", "idle-exit", "done", "terminated", "refused", "crash")
SAVES = ("acked", "done", "terminated")  # written right after a checkpoint
# How long after a round's moves were released slurmctld is killed: before Slurm relaunches
# them (it may not after BeginTime - cred_expire + 1, about 2 s), and once it has.
MOVE_KILL_DELAYS = (0.2, 1.5, 3.0)


class ControllerLoop:
    """``sia-slurm controller run`` (the loop) as the service account, in the background."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self.process: subprocess.Popen[bytes] | None = None

    def argv(self) -> list[str]:
        user = SERVICE_ACCOUNT
        return [
            *("setpriv", f"--reuid={user}", f"--regid={user}", "--init-groups", "--"),
            sys.executable,
            *("-m", "sia_slurm.cli", "controller", "run"),
            *("--config", str(self.site.config_path), "--log-file", str(self.site.log_path)),
        ]

    @property
    def output(self) -> str:
        """What the loop printed besides its log (nothing, unless it crashed)."""
        path = self.site.root / "controller.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def start(self) -> None:
        with open(self.site.root / "controller.out", "ab") as out:
            self.process = subprocess.Popen(
                self.argv(), env=self.site.env(), cwd=self.site.root, stdout=out, stderr=out
            )

    def check_alive(self) -> None:
        """The loop must survive every fault: it logs a failed round and goes on (unless the
        test stopped it)."""
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(
                f"the controller loop exited {self.process.returncode}:\n{self.output[-3000:]}"
            )

    def stop(self) -> int | None:
        """SIGTERM: the loop finishes its round and exits 0."""
        process, self.process = self.process, None
        if process is None:
            return None
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        return process.returncode

    def lines(self) -> list[dict[str, Any]]:
        """The controller's JSON log; a line cut short (being written) is skipped."""
        path = self.site.log_path
        if not path.exists():
            return []
        records = []
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records

    def failures(self, since: float) -> list[dict[str, Any]]:
        """The loop's "round failed" lines logged after ``since``."""
        return [
            line
            for line in self.lines()
            if _log_time(line) > since and line.get("message", "").startswith("round failed")
        ]

    def rounds(self, since: float = 0.0) -> list[dict[str, Any]]:
        """The ``round`` summaries logged after ``since`` (wall clock)."""
        return [
            line
            for line in self.lines()
            if line.get("event") == "round" and _log_time(line) > since
        ]


def _log_time(line: dict[str, Any]) -> float:
    return float(line.get("ts", 0.0))


class Faults:
    """One test's controller site, its loop and the cluster's fault operations."""

    def __init__(self, site: Site, loop: ControllerLoop) -> None:
        self.site = site
        self.loop = loop
        self.cluster: DevCluster = site.cluster

    def wait(self, probe: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            self.loop.check_alive()
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g} s: {what}\n{self.diagnosis()}")
            time.sleep(0.2)

    def diagnosis(self) -> str:
        lines = [f"--- {sia_id}: " + json.dumps(self.site.events(sia_id)[-8:]) for sia_id in
                 self.sia_ids()]  # fmt: skip
        lines += [self.site.run(["scontrol", "-o", "show", "job"], check=False)]
        lines += [self.site.run(["sinfo", "-N", "-h", "-o", "%N %T"], check=False)]
        lines += [json.dumps(line) for line in self.loop.lines()[-30:]]
        log = self.cluster.layout.slurmctld_log
        lines += log.read_text(errors="replace").splitlines()[-30:] if log.exists() else []
        return "\n".join(lines)

    def sia_ids(self) -> list[str]:
        return sorted(p.name for p in self.site.paths.jobs_dir.iterdir() if p.is_dir())

    # ---- the jobs --------------------------------------------------------------------------

    def runs(self, sia_id: str) -> list[dict[str, Any]]:
        return self.site.events(sia_id, "start")

    def reporting(self, sia_id: str, after: float = 0.0) -> dict[str, Any] | None:
        """The job's latest run, if it started after ``after`` and runs as assigned (it has
        written a metrics report since it started and not ended, and Slurm runs that very run
        on those nodes). Slurm's word is needed: a slurmctld killed right after a launch comes
        back from older state, with the job pending, while the run it launched goes on until
        its nodes register (then Slurm kills it: "Registered PENDING JobId=J"); its start
        event and report alone made a pending job look running (the 26.05 loaded run of
        2026-11-26: the test then drained that run's nodes, and waited for a move of a job
        the controller was starting)."""
        events = self.site.events(sia_id)
        starts = [e for e in events if e["event"] == "start" and e["time"] > after]
        if not starts or events[-1]["event"] in NOT_RUNNING:
            return None
        try:
            report = json.loads(self.site.paths.metrics(sia_id).read_text())
        except (OSError, ValueError):
            return None
        run = [report.get("slurm_job_id"), report.get("slurm_restart_count")]
        latest = starts[-1]
        if run != latest["run"] or report["time"] <= latest["time"]:
            return None
        try:
            job = self.site.slurm_job(latest["run"][0])
        except CommandError:  # slurmctld away (it is killed and started in these tests)
            return None
        slurm_run = (job.get("JobState"), job.get("Restarts"), job.get("NodeList"))
        if slurm_run != ("RUNNING", str(latest["run"][1]), latest["node_list"]):
            return None
        return latest

    def settled(self, since: float) -> bool:
        """A round after ``since`` decided nothing and every job runs as assigned."""
        quiet = [r for r in self.loop.rounds(since) if r["actions"] == 0 and not r["error"]]
        return bool(quiet) and all(self.reporting(j) for j in self.live_ids())

    def moves(self, since: float, jobs: set[str]) -> float:
        """When the loop logged the moves of every one of ``jobs`` done (all released), if it
        did after ``since``; else 0."""
        lines = [
            line
            for line in self.loop.lines()
            if line.get("event") == "action" and line.get("kind") == "move"
            and line.get("result") == "done" and _log_time(line) > since
        ]  # fmt: skip
        if {line["job"] for line in lines} >= jobs:
            return max(_log_time(line) for line in lines)
        return 0.0

    def why_restarted(self, since: float) -> str:
        """What a test that saw a running job restarted needs to tell who restarted it: the
        controller's actions and warnings after ``since``, and slurmctld's lines about
        requeues, node timeouts and kills."""
        ours = [
            line.get("message", "")
            for line in self.loop.lines()
            if _log_time(line) > since
            and (line.get("event") == "action" or line.get("level") in ("warning", "error"))
        ]
        words = ("equeu", "not responding", "DOWN", "NodeFail", "kill", "Kill", "preempt")
        log = self.cluster.layout.slurmctld_log.read_text(errors="replace").splitlines()
        slurm = [line for line in log if any(word in line for word in words)]
        return "\n".join(["controller:", *ours[-40:], "slurmctld:", *slurm[-40:]])

    def gpus(self, sia_id: str) -> int:
        """GPUs of the job's latest run (0 before it starts)."""
        runs = self.runs(sia_id)
        return runs[-1]["nodes"] * runs[-1]["gpus_on_node"] if runs else 0

    def live_ids(self) -> list[str]:
        return [j for j in self.sia_ids() if not self.site.events(j, "done")]

    def where(self, sia_id: str) -> list[str]:
        """The nodes the job's latest run started on."""
        (node_list,) = [self.runs(sia_id)[-1]["node_list"]]
        return self.site.run(["scontrol", "show", "hostnames", node_list]).split()

    def finish_all(self) -> None:
        for sia_id in self.live_ids():
            self.site.finish(sia_id)
        for job_id in self.site.slurm_ids:
            self.wait(lambda job_id=job_id: self._ended(job_id), f"Slurm job {job_id} to end")

    def _ended(self, job_id: str) -> bool:
        return self.site.slurm_job(job_id)["JobState"] in ("COMPLETED", "FAILED", "CANCELLED")

    def check_completed_once(self) -> None:
        """Slurm says COMPLETED, the journal says done, and each job's own history is sound."""
        states = {j: self.site.slurm_job(j)["JobState"] for j in self.site.slurm_ids}
        assert set(states.values()) == {"COMPLETED"}, states
        self.wait(
            lambda: set(self.site.job_phases().values()) == {"done"},
            "the controller to record every job done",
        )
        failed = [line for line in self.loop.lines() if line.get("phase") == "failed"]
        assert not failed, failed
        for sia_id in self.sia_ids():
            problems = history_problems(self.site.events(sia_id))
            assert not problems, (sia_id, problems, self.site.events(sia_id))


def leaked_gpus(show_node: str) -> dict[str, int]:
    """Nodes that Slurm says use GPUs although it has no job on them (``scontrol -d -o show
    node``: ``GresUsed=gpu:a100:2(IDX:0-1)`` with ``CPUAlloc=0``), with the GPU count."""
    leaked = {}
    for record in parse_records(show_node):
        counts = re.finditer(r"gpu(?::[^:(,]+)?:(\d+)", record.get("GresUsed", ""))
        used = sum(int(match[1]) for match in counts)
        if used and record.get("CPUAlloc") == "0":
            leaked[record["NodeName"]] = used
    return leaked


def holding_gpus(site: Site) -> list[str]:
    jobs = parse_squeue_json(site.run(["squeue", "--json"], check=False) or '{"jobs": []}').jobs
    return [job.job_id for job in jobs if job.holds_gpus]


def faults_wait(probe: Callable[[], Any], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not probe():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s: {what}")
        time.sleep(0.2)


def history_problems(events: list[dict[str, Any]]) -> list[str]:
    """What a job's own events show that must not happen, even when Slurm's daemons die.

    A run killed with its node leaves no end event, and a run Slurm relaunches after a
    slurmctld restart may be refused (its allocation is not its assignment: the controller's
    to repair). Never allowed: a run that starts from anything but the last checkpoint, a
    checkpoint that goes back, the job's own code failing, or a second finish.
    """
    problems = []
    saved = 0
    for event in events:
        kind = event["event"]
        if kind == "start" and event["counter"] != saved:
            problems.append(f"start at counter {event['counter']}, last checkpoint {saved}")
        if kind in SAVES:
            if event["counter"] < saved:
                problems.append(f"{kind} at counter {event['counter']} < checkpoint {saved}")
            saved = event["counter"]
        if kind == "crash":
            problems.append(f"the job's code failed: {event}")
    done = [e for e in events if e["event"] == "done"]
    if len(done) != 1 or events[-1]["event"] != "done":
        last = events[-1] if events else None
        problems.append(f"finished {len(done)} time(s); last event {last}")
    return problems


def controller_site(
    cluster: DevCluster, spec: DevClusterSpec, test_accounts: TestAccounts, directory: Path
) -> Site:
    """The faults tests' controller site on ``cluster``: its state tree made for the service
    account, rounds of ROUND_SECONDS, a 30 s checkpoint timeout."""
    paths = StatePaths(directory / "state")
    service = test_accounts.service
    set_up(paths.state_dir, service.uid, service.gid)
    config_path = directory / "sia.yaml"
    config_path.write_text(
        controller_config(
            spec,
            paths.state_dir,
            round_seconds=ROUND_SECONDS,
            policy_params={"lambda_a": 0.01},
            checkpoint_timeout_s=30,
        )
    )
    submitter = LiveSubmitter(cluster, paths, cluster.runner())
    return Site(cluster, directory, submitter, config_path, paths.state_dir / "c.jsonl")


@pytest.fixture
def faults(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    test_accounts: TestAccounts,
    shared_tmp_path: Path,
) -> Iterator[Faults]:
    """A controller site with its loop running; afterwards every daemon a fault killed is
    started again and every node resumed, so the session's cluster is whole for what follows."""
    site = controller_site(
        dev_cluster, DevClusterSpec.parse(DEFAULT_SPEC), test_accounts, shared_tmp_path
    )
    loop = ControllerLoop(site)
    try:
        yield Faults(site, loop)
    finally:
        loop.stop()
        keep = os.environ.get("SIA_FAULTS_KEEP")
        if keep:
            shutil.copytree(shared_tmp_path, Path(keep) / shared_tmp_path.name, dirs_exist_ok=True)
            log = dev_cluster.layout.slurmctld_log
            shutil.copy(log, Path(keep) / shared_tmp_path.name / "slurmctld.log")
        dev_cluster.start_killed()
        if site.slurm_ids:
            site.run(["scancel", *site.slurm_ids], check=False)
        for node in NODES:
            if "DRAIN" in dev_cluster.node_state(node) or "DOWN" in dev_cluster.node_state(node):
                dev_cluster.resume(node)
        faults_wait(lambda: not holding_gpus(site), "the test's jobs to give their GPUs back")
        leaked = leaked_gpus(site.run(["scontrol", "-d", "-o", "show", "node"]))
        if leaked:
            # Slurm 22.05 can leave a node's GPUs counted as used by no job after a slurmd
            # that died alone came back beside its job's new run ("Registered JobId=J
            # StepId=J.batch on wrong node", then a requeue from the node the job moved to:
            # seen in test_a_node_dies_under_a_running_job[slurmd-dies], GresUsed=gpu:a100:2
            # on an IDLE node, and a 2 x 4-GPU job then pends on two idle nodes). slurmctld
            # rebuilds its GPU accounting from the jobs when it starts.
            # The controller leaves them out: Slurm would start nothing on them.
            backend = SlurmBackend(load_config(site.config_path), dev_cluster.runner())
            usable = {n.name: (n.total_gpus, n.usable_gpus) for n in backend.snapshot().nodes}
            for node, gpus in leaked.items():
                assert usable[node][1] == usable[node][0] - gpus, (node, gpus, usable[node])
            print(f"Slurm leaked GPUs {leaked}; restarting slurmctld")
            dev_cluster.restart_slurmctld()
            assert not leaked_gpus(site.run(["scontrol", "-d", "-o", "show", "node"]))


# ------------------------------------------------------------------------------------------------


def test_slurmctld_killed_while_jobs_run_and_right_after_a_move(faults: Faults) -> None:
    site, loop, cluster = faults.site, faults.loop, faults.cluster
    ka = site.submit("ka", max_gpus=2)
    site.submit("kb", max_gpus=2)
    loop.start()

    # The jobs start and grow to their cap (2 GPUs, a round at a time); then nothing moves.
    def at_cap() -> bool:
        return all(faults.gpus(j) == 2 for j in ("ka", "kb")) and faults.settled(time.time() - 1)

    faults.wait(at_cap, "both jobs running at their cap, then a quiet round")
    runs = {j: len(faults.runs(j)) for j in ("ka", "kb")}

    # 1. slurmctld dies while the jobs run, stays away for some rounds and comes back: the
    # rounds without it fail and say so, the next ones go on; the jobs run on, untouched.
    # (Once Slurm has written them down: a job its backfill scheduler started may be unsaved
    # for minutes, and a crash then loses the start; DevCluster.save_state.)
    cluster.save_state(ka)
    killed = time.time()
    cluster.kill_slurmctld()
    faults.wait(lambda: loop.failures(killed), "a round to fail without slurmctld")
    time.sleep(2 * ROUND_SECONDS)
    cluster.start_slurmctld()
    back = time.time()
    faults.wait(lambda: faults.settled(back), "a quiet round after slurmctld is back")
    now_runs = {j: len(faults.runs(j)) for j in runs}
    assert now_runs == runs, f"a running job was restarted:\n{faults.why_restarted(killed)}"
    print("outage 1:", loop.failures(killed)[-1])

    # ... and again, started again at once (commands wait for it; nothing need fail).
    cluster.save_state(ka)
    cluster.restart_slurmctld()
    back = time.time()
    faults.wait(lambda: faults.settled(back), "a quiet round after the quick restart")
    now_runs = {j: len(faults.runs(j)) for j in runs}
    assert now_runs == runs, f"a running job was restarted:\n{faults.why_restarted(back)}"

    # 2. Their nodes are drained: the next round moves both; slurmctld dies right after the
    # moves' release (before the relaunch, as Slurm relaunches, once running), and again.
    for delay in MOVE_KILL_DELAYS:
        drained = sorted({node for j in runs for node in faults.where(j)})
        for node in drained:
            cluster.drain(node, "faults")
        since = time.time()
        moved = faults.wait(
            lambda since=since: faults.moves(since, set(runs)), "a round moving both jobs"
        )
        time.sleep(max(0.0, moved + delay - time.time()))
        cluster.kill_slurmctld()
        print(f"killed {time.time() - moved:.2f} s after the moves' release")
        cluster.start_slurmctld()
        for node in drained:
            cluster.resume(node)
        after = time.time()
        faults.wait(
            lambda after=after: faults.settled(after), "both jobs running again, quiet", 240
        )

    faults.finish_all()
    faults.check_completed_once()


def test_slurmctld_killed_right_after_a_job_is_granted_two_nodes(faults: Faults) -> None:
    """Issue 18 item 4's shape: a job granted two nodes x 4 GPUs of a type by a move, and
    slurmctld killed right after the move's release (before Slurm relaunches it, and after)."""
    site, loop, cluster = faults.site, faults.loop, faults.cluster
    job_id = site.submit("big", min_gpus=8, max_gpus=8)  # 8 GPUs: two nodes, always
    loop.start()
    faults.wait(
        lambda: faults.gpus("big") == 8 and faults.settled(time.time() - 1),
        "the job running on 2 nodes x 4 GPUs, then a quiet round",
    )
    for delay in MOVE_KILL_DELAYS:
        drained = faults.where("big")
        for node in drained:
            cluster.drain(node, "faults")
        since = time.time()
        moved = faults.wait(
            lambda since=since: faults.moves(since, {"big"}), "a round moving the job"
        )
        time.sleep(max(0.0, moved + delay - time.time()))
        cluster.kill_slurmctld()
        print(f"killed {time.time() - moved:.2f} s after the move's release")
        cluster.start_slurmctld()
        print("after the restart:", slurm_fields(site, job_id))
        for node in drained:
            cluster.resume(node)
        after = time.time()
        faults.wait(
            lambda after=after: faults.gpus("big") == 8 and faults.settled(after),
            "the job running on 2 nodes again, a quiet round",
            240,
        )
    faults.finish_all()
    faults.check_completed_once()


def slurm_fields(site: Site, job_id: str) -> dict[str, str]:
    """The fields of a Slurm job that carry the controller's decision."""
    record = site.slurm_job(job_id)
    keys = ("JobState", "Reason", "Restarts", "Partition", "NumNodes", "NumTasks", "NumCPUs",
            "TresPerNode", "ReqNodeList", "NodeList", "StartTime")  # fmt: skip
    return {key: record.get(key, "") for key in keys}


@pytest.mark.parametrize("with_jobs", [True, False], ids=["node-dies", "slurmd-dies"])
def test_a_node_dies_under_a_running_job(faults: Faults, with_jobs: bool) -> None:
    """Its slurmd (and, when the node dies, the job's processes) SIGKILLed: Slurm sets the node
    DOWN and requeues the job; the controller starts it elsewhere from its checkpoint; the
    node, its slurmd started again, is capacity again: the job is moved onto it when every
    other node is drained."""
    site, loop, cluster = faults.site, faults.loop, faults.cluster
    site.submit("nf", max_gpus=2)
    loop.start()
    faults.wait(
        lambda: faults.gpus("nf") == 2 and faults.settled(time.time() - 1),
        "the job at its cap (it has checkpointed once on the way), then a quiet round",
    )
    (victim,) = faults.where("nf")
    before = len(faults.runs("nf"))
    killed = time.time()
    cluster.kill_slurmd(victim, jobs=with_jobs)
    cluster.wait_for_node(victim, lambda state: "DOWN" in state, "DOWN", 90)
    print(f"{victim} DOWN after {time.time() - killed:.1f} s")
    resumed = faults.wait(lambda: faults.reporting("nf", after=killed), "the job resumed", 180)
    assert resumed["node_list"] != victim and len(faults.runs("nf")) > before

    cluster.start_slurmd(victim)
    for node in NODES:
        if node != victim:
            cluster.drain(node, "faults")
    back = time.time()
    faults.wait(
        lambda: faults.where("nf") == [victim] and faults.settled(back),
        f"the job moved onto {victim}, the only node left",
        180,
    )
    for node in NODES:
        cluster.resume(node)
    faults.finish_all()
    faults.check_completed_once()


def test_a_run_left_behind_by_a_dead_slurmd_stops_when_the_job_runs_elsewhere(
    faults: Faults,
) -> None:
    """slurmd alone dies while no round falls between its node's NOT_RESPONDING and DOWN (60 s
    rounds do that): the run's processes live on under slurmstepd, Slurm requeues the job,
    and the controller starts it elsewhere without a stop request ever reaching the old run.
    The old run reads the new assignment, written for another Slurm run, and exits at once
    without a checkpoint (``superseded``), instead of adopting it as a rebatch and training
    on beside the new run."""
    site, loop, cluster = faults.site, faults.loop, faults.cluster
    site.submit("orphan", max_gpus=1)
    loop.start()
    faults.wait(lambda: faults.settled(time.time() - 1), "the job running, a quiet round")
    (victim,) = faults.where("orphan")
    left_behind = faults.runs("orphan")[-1]["run"]
    loop.stop()
    cluster.kill_slurmd(victim)
    cluster.wait_for_node(victim, lambda state: "DOWN" in state, "DOWN", 90)
    faults.wait(
        lambda: site.slurm_job(site.slurm_ids[0])["JobState"] == "PENDING",
        "Slurm to requeue the job",
    )
    restarted = time.time()
    loop.start()
    resumed = faults.wait(
        lambda: faults.reporting("orphan", after=restarted), "the job resumed elsewhere"
    )
    assert resumed["run"] != left_behind and resumed["node_list"] != victim
    exit_file = site.paths.job_dir("orphan") / exit_name(*left_behind)

    def left_behind_exit() -> dict[str, Any] | None:
        return json.loads(exit_file.read_text()) if exit_file.exists() else None

    record = faults.wait(left_behind_exit, f"the run {left_behind} left behind to exit")
    assert (record["cause"], record["status"]) == ("superseded", 76), record
    events = site.events("orphan")
    # The old run adopted nothing; the new run may be rebatched by the next rounds (seen on
    # 26.05 in a loaded run: round 3 changed its batch 0.2 s after it started).
    adopted = [e for e in events if e["event"] == "rebatch" and e["run"] == left_behind]
    assert not [e for e in adopted if e["time"] > restarted], events
    assert [e["run"] for e in events if e["event"] == "superseded"] == [resumed["run"]]
    cluster.start_slurmd(victim)
    faults.finish_all()
    faults.check_completed_once()


def test_a_launch_whose_prolog_fails_is_brought_back_elsewhere(faults: Faults) -> None:
    """Issue 18 item 2: Slurm's own failure before the job's code ran. The first launch's
    prolog fails: Slurm drains that node ("Prolog error") and requeues the job held
    (``launch_failed_requeued_held``). The controller starts it again on another node; it is
    no failure of the job's (the job ends COMPLETED, never FAILED), and it completes once."""
    site, loop, cluster = faults.site, faults.loop, faults.cluster
    marker = cluster.fail_next_prolog()
    site.submit("pf", max_gpus=1)
    loop.start()
    running = faults.wait(lambda: faults.reporting("pf"), "the job running after a failed launch")
    (taken,) = marker.parent.glob(f"{marker.name}.taken.*")  # exactly one launch failed
    assert taken.name.endswith(f".{site.slurm_ids[0]}")
    drained = [node for node in NODES if "DRAIN" in cluster.node_state(node)]
    assert len(drained) == 1, drained
    assert drained[0] not in faults.where("pf")
    assert running["run"] == [site.slurm_ids[0], 1]  # the job's second run: Slurm requeued it
    assert len(faults.runs("pf")) == 1  # the failed launch never started the job's code
    faults.finish_all()
    faults.check_completed_once()


def test_a_submission_slurm_never_kept_is_said_not_lost_silently(faults: Faults) -> None:
    """slurmctld SIGKILLed a second after it accepted a submission (the chaos soak saw it then
    forget the job that ``sia-sbatch`` had reported submitted, under load; on an idle cluster
    it usually keeps it): if Slurm kept the job, it runs and completes once. A submission
    Slurm never kept (emulated for certain: a spec without a Slurm job, as such a loss or a
    ``sia-sbatch`` killed between its spec and ``sbatch`` leaves it) is said by the controller
    (log and ``status``) within a few rounds. Never silently lost."""
    site, loop, cluster = faults.site, faults.loop, faults.cluster
    loop.start()
    slurm_id = site.submit("maybe", max_gpus=1)
    time.sleep(1.0)  # the chaos soak's case; slurmctld saves within SAVE_MAX_WAIT (5 s)
    cluster.kill_slurmctld()
    cluster.start_slurmctld()
    jobs = parse_squeue_json(site.run(["squeue", "--json"])).jobs
    kept = [job for job in jobs if job.comment == "sia-slurm:maybe"]
    print(f"Slurm {'kept' if kept else 'forgot'} job {slurm_id} across the restart")
    if not kept:
        site.slurm_ids.remove(slurm_id)  # Slurm may give the id to another job
    site.paths.job_dir("never").mkdir(mode=0o755)
    write_document(site.paths.spec("never"), JobSpec(sia_id="never", app="cifar10"))

    def said(sia_id: str) -> bool:
        # Never seen by the controller: a lost submission. Seen, then forgotten: gone.
        marks = (f"lost submission: job {sia_id}:", f"[job={sia_id}] gone:")
        return any(m in line.get("message", "") for line in loop.lines() for m in marks)

    lost = ["never"] if kept else ["maybe", "never"]
    faults.wait(lambda: all(said(j) for j in lost), f"the controller to say {lost} were lost", 90)
    status = subprocess.run(
        [sys.executable, "-m", "sia_slurm.cli", "status", "--config", str(site.config_path),
         "--json"],
        env=site.env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    listed = json.loads(status.stdout)["lost_submissions"]
    jobs_listed = [line.split(":")[1].split()[-1] for line in listed]
    assert "never" in jobs_listed and not (kept and "maybe" in jobs_listed), listed
    shutil.rmtree(site.paths.job_dir("never"))  # its user gave up on it
    if kept:
        faults.wait(lambda: faults.reporting("maybe"), "the job Slurm kept to run")
        faults.finish_all()
        faults.check_completed_once()


def test_a_job_preempted_by_a_higher_tier_is_brought_back(faults: Faults) -> None:
    """Issue 18 item 2: preemption. A job of the hidden higher-tier partition needs every GPU
    of the node a managed job runs on; Slurm requeues the managed job (PreemptMode=REQUEUE)
    and starts the urgent one. That is no failure of the job: the controller holds the
    requeued job and starts it again on a free node from its checkpoint, and it completes
    once."""
    site, loop = faults.site, faults.loop
    site.submit("pre", max_gpus=2)
    loop.start()
    faults.wait(
        lambda: faults.gpus("pre") == 2 and faults.settled(time.time() - 1),
        "the job at its cap, then a quiet round",
    )
    (victim,) = faults.where("pre")
    before = len(faults.runs("pre"))
    groups = DevClusterSpec.parse(DEFAULT_SPEC).groups
    gpus = next(g for g in groups if victim in g.node_names()).gpus_per_node
    argv = ["sbatch", "--parsable", "-p", PREEMPTING_PARTITION, "-w", victim,
            f"--gpus-per-node={gpus}", "-o", "/dev/null", "--wrap", "sleep 20"]  # fmt: skip
    preempted = time.time()
    urgent = site.run(argv).strip()
    site.slurm_ids.append(urgent)
    faults.wait(lambda: site.slurm_job(urgent)["JobState"] == "RUNNING", "the urgent job to run")
    log = faults.cluster.layout.slurmctld_log
    faults.wait(
        lambda: f"preempted JobId={site.slurm_ids[0]} " in log.read_text(errors="replace"),
        "Slurm to preempt the managed job (slurmctld.log)",
    )
    resumed = faults.wait(lambda: faults.reporting("pre", after=preempted), "the job back", 180)
    assert victim not in site.run(["scontrol", "show", "hostnames", resumed["node_list"]])
    assert len(faults.runs("pre")) > before
    record = json.loads(site.paths.slurm_record("pre").read_text())
    assert not record.get("failed_runs"), record  # never counted as the job's own failure
    faults.finish_all()
    faults.check_completed_once()
