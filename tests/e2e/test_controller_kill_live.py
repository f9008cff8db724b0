"""Issue 18 item 7: the controller dies on the real cluster, at chosen points of real rounds.

The controller runs as its loop (``sia-slurm controller run``, as systemd runs it), as the
service account, against the dev cluster, with three managed jobs (tests/slurm/protocol_job.py:
they count, checkpoint when asked to stop, and log every event). Its ``slurm.bin_dir`` is a
directory of shims (tests/e2e/slurm_kill_shim.py) that SIGKILL it at planned Slurm commands,
before one runs or after it ran; the test also SIGKILLs it itself at seeded random moments of
an apply. A supervisor starts it again at once, as systemd's ``Restart=always`` would, and the
new process reconciles its journal.

The scenario drives every kind of action an administrator's changes lead to: the jobs start
(Start), their nodes are drained (Move to another GPU type), every node is drained (Stop),
every node comes back (Start of a requeued job, with its relaunch time), and the jobs finish.
Kill rules are armed phase by phase and fire while an action of that phase's kind is pending
in the journal; a kill during a re-apply lands in the re-apply, so the steps of one action are
killed one after the other. In the end every job completed exactly once, in Slurm and by its
own events: runs never overlapped, no counter went back beyond its checkpoint, no launch was
refused or repeated for one decision, every decision the journal calls done was launched, and
the journal has nothing pending.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
import yaml

from sia_slurm.cluster import BatchChoice, Start, Stop
from sia_slurm.config import load_config
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import MetricsReport, ProtocolError, StatePaths, read_document
from sia_slurm.slurm.actuate.calls import UPDATE_MAX_PAUSE_S, is_stale_errno
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.observe.hostlist import expand_hostlist
from sia_slurm.slurm.observe.jsonparse import SlurmJob, parse_squeue_json
from sia_slurm.slurm.runner import SubprocessRunner
from sia_slurm.state.tree import set_up
from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec, controller_config
from tests.accounts import TestAccounts
from tests.e2e.kill_harness import (
    KillPlan,
    KillRule,
    Supervisor,
    job_history_problems,
    read_jsonl,
)
from tests.e2e.test_controller_live import SEED_PROFILE, Site
from tests.release import TEST_RELEASE
from tests.slurm.conftest import LiveSubmitter

# The controller's journal and its replay after a SIGKILL at every step: what it replays are the
# start, move and stop commands every release runs in tests/slurm/test_backend_live.py and the
# other e2e tests, so these run on the host's release only, for CI time (~5 minutes a release).
pytestmark = [pytest.mark.slurm, pytest.mark.one_release]

ROUND_SECONDS = 4.0
JOBS = ("ka", "kb", "kc")
NODES = tuple(f"{t}-{i}" for t in ("a100", "rtx", "t4") for i in (1, 2))
# A phase's kills each cost a controller restart, whose start (Python, numpy, scipy) took 24 and
# 59 s at load 16: 120 s ran out before the third controller had released the jobs.
PHASE_TIMEOUT_S = 300.0
# A restarted controller settles what the killed one left pending within this, counted from its
# first loop line (a re-apply takes 1-3 s; a Slurm command that hangs runs into the runner's
# 60 s timeout). From the kill instead, a loaded machine's 59 s of start-up counted too.
RECOVERY_S = 30.0
LOOP_LINE = "controller loop: a round every"
# A failed run's evidence (tests/e2e/kill_harness.py's logs, the journal, slurmctld's log).
FAILED_EVIDENCE = Path(os.environ.get("SIA_TEST_EVIDENCE", "/tmp/sia-test-evidence"))
# The random points' seed: fixed, printed, and SIA_KILL_SEED tries another.
SEED = int(os.environ.get("SIA_KILL_SEED", "20261124"))

# Slurm command lines of the actuation steps (docs/slurm-actuation.md).
SIGNAL = r"^scancel --batch --signal=USR1 "
REQUEUEHOLD = r"^scontrol requeuehold "
HOLD = r"^scontrol hold "
RESHAPE = r"^scontrol update JobId=\d+ Partition="
RELEASE = r"^scontrol release "
START_TIME = r"^scontrol update JobId=\d+ StartTime="
SQUEUE = r"^squeue "
ANY = r"."
# The random points: any command but the observation's `scontrol [-d] -o show node|reservation`
# and `scontrol show config` (every round has them; the points should fall on actuation more
# often).
ACTUATION = r"^(?!scontrol (-d )?-o show |scontrol show config)"


@dataclass(frozen=True)
class Phase:
    """One administrator's change and the kills armed for it: shim ``rules``, and ``timed``:
    seconds after the phase's first decision of ``kind`` (its first round in the finish phase)
    at which the test SIGKILLs the controller itself (None: no such kill)."""

    kind: str
    rules: list[KillRule] = field(default_factory=list)
    timed: float | None = None


@dataclass
class KillSite:
    """The dev cluster, a controller site whose Slurm commands go through the kill shims, and
    the supervisor that keeps the controller loop alive."""

    site: Site
    plan: KillPlan
    supervisor: Supervisor
    evidence: Path
    timed_kills: list[dict[str, Any]] = field(default_factory=list)
    jobs: tuple[str, ...] = JOBS  # the managed jobs whose histories are checked and kept

    @property
    def paths(self) -> StatePaths:
        return self.site.paths

    def squeue(self) -> dict[str, SlurmJob]:
        """The managed jobs' Slurm jobs by sia id (every state Slurm still remembers)."""
        text = self.site.run(["squeue", "--json", "--all", "--states=all"])
        ids = set(self.site.slurm_ids)
        return {
            job.comment.split(":", 1)[1]: job
            for job in parse_squeue_json(text).jobs
            if job.job_id in ids
        }

    def submit(self, sia_id: str, exit_delay: float) -> str:
        """A managed job as tests/e2e/test_controller_live.py submits one (its cifar10 step
        times, done when the test says), on one GPU at most, taking ``exit_delay`` s to exit."""
        job_args = [
            *("--seed-profile", str(SEED_PROFILE), "--profile-type", "a100=dgx"),
            *("--finish-file", str(self.site.finish_file(sia_id))),
        ]
        if exit_delay:
            job_args += ["--exit-delay", str(exit_delay)]
        job_id = self.site.submitter.submit(sia_id, job_args=job_args, max_gpus=1, restart_cost=0.1)
        self.site.slurm_ids.append(job_id)
        return job_id

    def reporting_since(self, sia_id: str, since: float) -> dict[str, Any] | None:
        """The job's latest start after ``since``, once that run reports metrics."""
        starts = [e for e in self.site.events(sia_id, "start") if e["time"] > since]
        if not starts:
            return None
        try:
            report = read_document(MetricsReport, self.paths.metrics(sia_id))
        except ProtocolError:
            return None
        return starts[-1] if report.time > starts[-1]["time"] else None

    def journal(self) -> list[dict[str, Any]]:
        try:
            return self.site.journal()
        except sqlite3.Error:  # not created yet
            return []

    def pending(self) -> list[dict[str, Any]]:
        return [e for e in self.journal() if e["state"] == "pending"]

    def log_lines(self) -> list[dict[str, Any]]:
        """The controller's JSON log; a line a kill cut short is skipped."""
        lines = []
        if self.site.log_path.exists():
            for text in self.site.log_path.read_text(errors="replace").splitlines():
                try:
                    lines.append(json.loads(text))
                except ValueError:
                    continue
        return lines

    def nodes_state(self, nodes: list[str], state: str) -> None:
        argv = ["scontrol", "update", f"NodeName={','.join(nodes)}", f"State={state}"]
        self.site.run([*argv, "Reason=kill-test"] if state == "DRAIN" else argv)

    def last_controller_settled(self) -> bool:
        """Whether the running controller is none the test killed and has logged a round."""
        current = self.supervisor.current()
        killed = {k["controller"] for k in self.plan.kills()}
        killed |= {k["pid"] for k in self.timed_kills}
        if current is None or current[0] in killed:
            return False
        rounds = [line for line in self.log_lines() if line.get("event") == "round"]
        return any(line["ts"] > current[1] for line in rounds)

    def kill_at(self, phase: str, kind: str, after: float, delay: float) -> None:
        """SIGKILL the controller ``delay`` s after its first log line of ``kind`` (a
        decision's action, or ``round``) later than ``after``."""

        def logged() -> bool:
            return any(
                line["ts"] > after
                and (line.get("action") == kind if kind != "round" else line.get("event") == kind)
                for line in self.log_lines()
            )

        self.wait(logged, f"{phase}: a {kind} logged, to kill the controller in it")
        time.sleep(delay)
        pid, now = self.supervisor.kill_now(), time.time()
        pending = [e["id"] for e in self.pending()] if pid else []
        self.timed_kills.append({"phase": phase, "delay": delay, "pid": pid, "time": now,
                                 "pending": pending})  # fmt: skip

    def tear_down(self) -> None:
        """Stop the controller, cancel the test's Slurm jobs and resume every node."""
        self.supervisor.stop()
        if self.site.slurm_ids:
            self.site.run(["scancel", *self.site.slurm_ids], check=False)
        nodes = ",".join(NODES)
        self.site.run(["scontrol", "update", f"NodeName={nodes}", "State=RESUME"], check=False)

    def wait(self, probe: Callable[[], Any], what: str, timeout_s: float = PHASE_TIMEOUT_S) -> Any:
        """Wait for ``probe``; fail at once if the controller exited other than by a kill."""
        deadline = time.monotonic() + timeout_s
        while True:
            if self.supervisor.failure:
                raise AssertionError(f"{self.supervisor.failure}\n{self.diagnosis()}")
            value = probe()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout_s:g} s: {what}\n{self.diagnosis()}")
            time.sleep(0.2)

    def kills_summary(self) -> list[str]:
        lines = [
            f"shim kill: {k['rule']} at {k['argv'][:70]!r} (pending: "
            f"{sorted({p['kind'] for p in k['pending']})})"
            for k in self.plan.kills()
        ]
        lines += [f"timed kill: {k}" for k in self.timed_kills]
        return lines

    def diagnosis(self) -> str:
        """Keep the evidence (logs, shim calls, job events, slurmctld's log) and summarise."""
        kept = self.keep_evidence(failed=True)
        lines = [f"seed {SEED}; evidence kept in {kept}"]
        lines += [f"unfired rules: {self.plan.unfired()}", *self.kills_summary()]
        lines += [f"exit: pid {e.pid} rc {e.returncode} {e.output[-300:]!r}" for e in
                  self.supervisor.exits[-3:]]  # fmt: skip
        lines += [f"pending: {e['id']} {e['kind']} {e['sia_id']} r{e['round_index']}" for e in
                  self.pending()]  # fmt: skip
        lines += [f"slurm: {line}" for line in self.slurm_view()]
        lines += [f"call: {c['argv'][:100]}" for c in self.plan.calls()[-15:]]
        lines += [f"log: {line.get('message', '')[:200]}" for line in self.log_lines()[-15:]]
        return "\n".join(lines)

    def slurm_view(self) -> list[str]:
        """Each job as Slurm has it now: state, flags, hold, run, nodes, times."""
        try:
            jobs = self.squeue()
        except Exception as exc:  # the diagnosis must not hide the failure it explains
            return [f"squeue failed: {exc}"]
        return [
            f"{sia_id} job {j.job_id} {j.state} {list(j.flags)} held={j.held} "
            f"restarts={j.restart_count} nodes={','.join(j.nodes)} reason={j.reason} "
            f"start={j.start_time:.0f} eligible={j.eligible_time:.0f}"
            for sia_id, j in sorted(jobs.items())
        ]

    def keep_evidence(self, failed: bool = False) -> Path:
        """Copy the controller's log, the shim's calls and kills, the jobs' events, the journal
        and slurmctld's log into the test's evidence directory; a failed run's go to
        :data:`FAILED_EVIDENCE` instead, which pytest does not clean up (it keeps only the last
        three sessions' temporary directories, and a CI run starts three at once)."""
        target = self.evidence
        if failed:
            stamp = time.strftime("%Y%m%dT%H%M%S")
            target = FAILED_EVIDENCE / f"{TEST_RELEASE}-{stamp}-{os.getpid()}"
        target.mkdir(parents=True, exist_ok=True)
        sources = [
            self.site.log_path,
            self.plan.directory / "calls.jsonl",
            self.plan.directory / "kills.jsonl",
            self.plan.directory / "plan.json",
            self.plan.directory / "state.json",
            self.site.cluster.layout.log_dir / "slurmctld.log",
        ]
        sources += [self.paths.job_dir(sia_id) / "events.jsonl" for sia_id in self.jobs]
        for source in sources:
            if source.exists():
                shutil.copyfile(source, target / f"{source.parent.name}-{source.name}")
        exits = [vars(e) for e in self.supervisor.exits]
        (target / "exits.json").write_text(json.dumps(exits, indent=1))
        (target / "timed-kills.json").write_text(json.dumps(self.timed_kills, indent=1))
        (target / "journal.json").write_text(json.dumps(self.journal(), indent=1, default=str))
        return target


@pytest.fixture
def kill_site(
    dev_cluster: DevCluster,
    slurm_env: dict[str, str],
    test_accounts: TestAccounts,
    shared_python: str,
    shared_tmp_path: Path,
    tmp_path: Path,
) -> Iterator[KillSite]:
    """A controller site on the dev cluster (as tests/e2e/test_controller_live.py makes one),
    its ``slurm.bin_dir`` the kill shims, and its supervisor (not started yet)."""
    paths = StatePaths(shared_tmp_path / "state")
    service = test_accounts.service
    set_up(paths.state_dir, service.uid, service.gid)
    log_path = paths.state_dir / "controller.jsonl"
    plan = KillPlan(shared_tmp_path / "kill", paths.state_dir / "sia.db", log_path)
    plan.install(service.uid, service.gid)
    config = yaml.safe_load(
        controller_config(
            DevClusterSpec.parse(DEFAULT_SPEC),
            paths.state_dir,
            round_seconds=ROUND_SECONDS,
            policy_params={"lambda_a": 0.01},
            checkpoint_timeout_s=30,
        )
    )
    config["slurm"] = {"bin_dir": str(plan.bin_dir)}
    config_path = shared_tmp_path / "sia.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    submitter = LiveSubmitter(dev_cluster, paths, dev_cluster.runner())
    site = Site(dev_cluster, shared_tmp_path, submitter, config_path, log_path)
    supervisor = Supervisor(site.loop_argv(), site.env(), shared_tmp_path)
    kill_site = KillSite(site, plan, supervisor, tmp_path / "evidence")
    try:
        yield kill_site
    finally:
        kill_site.tear_down()


# ------------------------------------------------------------------------------------------------
# The scenario


@dataclass(frozen=True)
class Scenario:
    """The phases of one test (``stop`` None: no stop and no restart phase) and how long the
    jobs take to exit once Slurm's requeue sent SIGTERM."""

    start: Phase
    move: Phase
    move_back: Phase | None = None
    stop: Phase | None = None
    restart: Phase | None = None
    finish: Phase = field(default_factory=lambda: Phase("round"))
    exit_delay: float = 0.0


def run_scenario(ks: KillSite, scenario: Scenario) -> None:
    """Start, move, stop, start again and finish the jobs, killing the controller as each
    phase says; then check that every job completed exactly once."""
    site = ks.site
    for sia_id in JOBS:
        ks.submit(sia_id, scenario.exit_delay)
    since = begin(ks, scenario.start, "start", ks.supervisor.start)
    started = ks.wait(lambda: all_reporting(ks, since), "every job started and reporting")

    # The administrator drains the jobs' nodes: each job moves to another GPU type.
    drained, moved = move_off(ks, scenario.move, "move", started)
    if scenario.move_back is not None:
        # The first nodes come back and the jobs' new ones are drained: each job moves again.
        drained, moved = move_off(ks, scenario.move_back, "move back", moved, back=drained)

    if scenario.stop is not None:
        # Every node drained: every job is stopped (requeued and held).
        rest = [node for node in NODES if node not in drained]
        # The stop phase's kills are at a running job's checkpoint signal and requeue: a job
        # that reported from its new nodes must still be running there (run 17 of
        # docs/reliability.md stopped jobs with no signal the shim counted).
        running = {sia_id for sia_id, job in ks.squeue().items() if job.state == "RUNNING"}
        assert running == set(JOBS), f"not all running before the stop\n{ks.diagnosis()}"
        begin(ks, scenario.stop, "stop", lambda: ks.nodes_state(rest, "DRAIN"))
        ks.wait(lambda: all_stopped(ks), "every job stopped (pending, held)")

        # The nodes come back: every job starts again.
        restart = scenario.restart or Phase("start")
        since = begin(ks, restart, "restart", lambda: ks.nodes_state(list(NODES), "RESUME"))
        ks.wait(lambda: all_reporting(ks, since), "every job started again and reporting")

    finish = scenario.finish
    begin(ks, finish, "finish", lambda: [site.finish(sia_id) for sia_id in JOBS])
    ks.wait(
        lambda: (
            {j.state for j in ks.squeue().values()} == {"COMPLETED"}
            and set(site.job_phases().values()) == {"done"}
            and not ks.plan.unfired()
        ),
        "every job COMPLETED in Slurm and done for the controller",
    )
    # Every kill is done; the controller now running (not one killed and not yet reaped) has
    # run a round, so a SIGTERM finds its handler installed.
    ks.wait(ks.last_controller_settled, "the last controller's first round")
    last = ks.supervisor.stop()
    ks.keep_evidence()
    print("\n".join([f"seed {SEED}; evidence in {ks.evidence}", *ks.kills_summary()]))
    assert last is not None and last.returncode == 0, ks.diagnosis()
    check_exactly_once(ks)


def move_off(
    ks: KillSite,
    phase: Phase,
    name: str,
    runs: dict[str, dict[str, Any]],
    back: Sequence[str] = (),
) -> tuple[list[str], dict[str, dict[str, Any]]]:
    """Resume ``back`` and drain every node of the GPU types ``runs`` are on, as phase
    ``name``; wait until every job reports from other nodes. Returns the drained nodes and the
    jobs' new runs."""
    types = {node.rsplit("-", 1)[0] for run in runs.values() for node in nodes_of(run)}
    drained = [node for node in NODES if node.rsplit("-", 1)[0] in types]

    def trigger() -> None:
        if back:
            ks.nodes_state(list(back), "RESUME")
        ks.nodes_state(drained, "DRAIN")

    since = begin(ks, phase, name, trigger)
    moved = ks.wait(lambda: all_reporting(ks, since), f"every job reporting after the {name}")
    for sia_id, run in moved.items():
        assert not set(nodes_of(run)) & set(drained), (sia_id, run, drained)
    return drained, moved


def begin(ks: KillSite, phase: Phase, name: str, trigger: Callable[[], Any]) -> float:
    """Settle the previous phase, arm this one's rules, pull the trigger and do its timed
    kill; returns the time of the trigger."""
    ks.wait(lambda: not ks.plan.unfired() and not ks.pending(), f"before {name}: kills fired")
    ks.plan.arm(phase.rules)
    since = time.time()
    trigger()
    if phase.timed is not None:
        ks.kill_at(name, phase.kind, since, phase.timed)
    return since


def nodes_of(start: dict[str, Any]) -> list[str]:
    return list(expand_hostlist(start["node_list"]))


def all_reporting(ks: KillSite, since: float) -> dict[str, dict[str, Any]] | None:
    starts = {sia_id: ks.reporting_since(sia_id, since) for sia_id in ks.jobs}
    return starts if all(starts.values()) else None  # type: ignore[return-value]


def all_stopped(ks: KillSite) -> bool:
    jobs = ks.squeue()
    return len(jobs) == len(JOBS) and all(
        j.state == "PENDING" and j.held and j.restart_count > 0 for j in jobs.values()
    )


# slurmctld's log line for an update it refused with the stale errno of a job update without
# slurmdbd (sia_slurm/slurm/actuate/calls.py, is_stale_errno): its time and the refusal.
REFUSAL = re.compile(r"^\[(\S+)\] _slurm_rpc_update_job: JobId=\d+ uid=\d+: (.*)$")
RETRY_GAP_S = UPDATE_MAX_PAUSE_S + 2.0


def stale_errno_refusals(log: Path) -> list[float]:
    """When slurmctld refused a job update with the stale errno (Unix times, in order)."""
    times = []
    for line in log.read_text(encoding="utf-8", errors="replace").splitlines():
        match = REFUSAL.match(line)
        if match and is_stale_errno(match[2]):
            times.append(datetime.fromisoformat(match[1]).timestamp())
    return times


def refusal_span(refusals: Sequence[float], start: float, end: float) -> float:
    """Seconds between ``start`` and ``end`` that the controller spent sending a refused update
    again (Slurm's time, not the recovery's): the gaps between stale-errno refusals that are at
    most one of its pauses (and a command) apart."""
    inside = [t for t in refusals if start <= t <= end]
    return sum(b - a for a, b in pairwise(inside) if b - a <= RETRY_GAP_S)


def check_exactly_once(ks: KillSite) -> None:
    """Every job completed once in Slurm and by its own events; every kill was one the test
    planned, and every action it interrupted was re-applied; the journal is settled."""
    site = ks.site
    kills = ks.plan.kills()
    problems = []
    if ks.plan.unfired():
        problems.append(f"rules never fired: {ks.plan.unfired()}")
    killed = {e.pid for e in ks.supervisor.exits if e.returncode == -signal.SIGKILL}
    planned = {k["controller"] for k in kills} | {k["pid"] for k in ks.timed_kills}
    if killed != planned - {None} or len(kills) != len({k["controller"] for k in kills}):
        problems.append(f"controllers killed {sorted(killed)}, kills planned {sorted(planned)}")
    journal = ks.journal()
    problems += [f"left pending: {e}" for e in journal if e["state"] == "pending"]
    # The pending actions at each kill (the shim's, read as it killed; the test's, read after).
    interruptions = [(k["time"], [p["id"] for p in k["pending"]]) for k in kills]
    interruptions += [(k["time"], k["pending"]) for k in ks.timed_kills if k["pid"]]
    last_kill = {i: when for when, ids in sorted(interruptions) for i in ids}
    refusals = stale_errno_refusals(site.cluster.layout.slurmctld_log)
    loop_starts = sorted(
        line["ts"]
        for line in read_jsonl(site.log_path)
        if str(line.get("message", "")).startswith(LOOP_LINE)
    )
    for entry in journal:
        if entry["id"] not in last_kill:
            continue
        what = f"interrupted action {entry['id']} ({entry['kind']} {entry['sia_id']})"
        if entry["state"] == "failed" and is_stale_errno(entry["message"]):
            continue  # Slurm's stale errno outlasted the tries: a later round decides anew
        if entry["state"] != "done" or "re-applied" not in entry["message"]:
            problems.append(f"{what} ended {entry['state']}: {entry['message']}")
            continue
        killed = last_kill[entry["id"]]
        since = next((t for t in loop_starts if t >= killed), killed)
        refusing = refusal_span(refusals, since, entry["finished"])
        if entry["finished"] - since - refusing > RECOVERY_S:
            late = entry["finished"] - since
            problems.append(
                f"{what} settled {late:.0f} s after its restarted controller began "
                f"({entry['finished'] - killed:.0f} s after the last kill; {refusing:.0f} s "
                "of it Slurm refusing updates)"
            )
    jobs = ks.squeue()
    for sia_id in ks.jobs:
        events = site.events(sia_id)
        problems += [f"{sia_id}: {p}" for p in job_history_problems(events)]
        job = jobs[sia_id]
        starts = [e for e in events if e["event"] == "start"]
        if job.state != "COMPLETED" or job.restart_count != len(starts) - 1:
            problems.append(
                f"{sia_id}: Slurm job {job.job_id} {job.state} after {job.restart_count} "
                f"restart(s); the job logged {len(starts)} launch(es)"
            )
        launched = sorted(e["round"] for e in starts)
        decided = sorted(
            e["round_index"]
            for e in journal
            if e["sia_id"] == sia_id and e["kind"] in ("start", "move") and e["state"] == "done"
        )
        if launched != decided:
            problems.append(f"{sia_id}: launched for rounds {launched}, done decisions {decided}")
        if ks.paths.stop_request(sia_id).exists():
            problems.append(f"{sia_id}: stop.json left behind")
    if len(jobs) != len(ks.jobs):
        problems.append(f"Slurm jobs of the managed jobs: {sorted(jobs)}")
    errors = [line for line in ks.log_lines() if line.get("level") == "error"]
    problems += [f"controller error: {line['message']}" for line in errors]
    assert not problems, "\n".join(problems) + "\n" + ks.diagnosis()


# ------------------------------------------------------------------------------------------------


START, MOVE, STOP = ("start",), ("move",), ("stop",)


def test_sigkill_at_every_step_of_start_move_and_stop(kill_site: KillSite) -> None:
    """Deterministic kill points, 21: each step of a Start, a Move, a Stop and the start of a
    requeued job, one after the other (a kill during a re-apply lands in the re-apply). The
    kills between a move's assignment, its StartTime and the release are the relaunch floor's
    replays (docs/slurm-actuation.md): each job must still start at its floor. They get a
    move of their own: a StartTime is sent only while Slurm's requeue delay (cred_expire + 1 s,
    31 s here) runs, and the first move's eight kills before it, each a controller restart,
    outlasted that at load (the replay then released the jobs with no StartTime to kill at)."""
    run_scenario(kill_site, Scenario(
        start=Phase("start", [
            KillRule("start: after the controller's hold", HOLD, "after", START),
            KillRule("start: after the first update", RESHAPE, "after", START),
            KillRule("start: after the assignments, before release", RELEASE, "before", START),
            KillRule("start: after release", RELEASE, "after", START),
        ]),
        move=Phase("move", [
            KillRule("move: journal committed, before apply", ANY, "before", MOVE,
                     after_decision=True),
            KillRule("move: after stop.json, before the signal", SIGNAL, "before", MOVE),
            KillRule("move: after the checkpoint signal", SIGNAL, "after", MOVE),
            KillRule("move: after the acks, before requeuehold", REQUEUEHOLD, "before", MOVE),
            KillRule("move: after requeuehold", REQUEUEHOLD, "after", MOVE),
            KillRule("move: after the hold", HOLD, "after", MOVE),
            KillRule("move: after the second update", RESHAPE, "after", MOVE, nth=2),
            KillRule("move: after the read-back, before the assignments", SQUEUE, "after", MOVE,
                     follows=RESHAPE),
        ]),
        move_back=Phase("move", [
            KillRule("move: after an assignment, before its StartTime", START_TIME, "before",
                     MOVE),
            KillRule("move: after the StartTimes, before release", RELEASE, "before", MOVE),
            KillRule("move: after release, before the journal marks it", RELEASE, "after", MOVE),
        ]),
        stop=Phase("stop", [
            KillRule("stop: journal committed, before apply", ANY, "before", STOP,
                     after_decision=True),
            KillRule("stop: after stop.json, before the signal", SIGNAL, "before", STOP),
            KillRule("stop: after the acks, before requeuehold", REQUEUEHOLD, "before", STOP),
            KillRule("stop: after the hold, before the journal marks it", HOLD, "after", STOP),
        ]),
        restart=Phase("start", [
            KillRule("restart: after the update", RESHAPE, "after", START),
            KillRule("restart: after release, before the journal marks it", RELEASE, "after",
                     START),
        ]),
    ))  # fmt: skip


def test_sigkill_at_random_points_of_real_rounds(kill_site: KillSite) -> None:
    """Seeded random kill points, 13: in each phase, two at the n-th Slurm command (before or
    after it) while its action is pending, and in the start, stop and finish phases one by the
    test itself at a random moment of the apply (between commands too: while files are written,
    while the journal commits). The seed is printed; SIA_KILL_SEED tries another."""
    rng = random.Random(SEED)

    def rules(phase: str, kinds: tuple[str, ...], most: int) -> list[KillRule]:
        """Two kills at the n-th command (n <= ``most``, fewer than any apply of the phase's
        actions issues from a restart) while an action of ``kinds`` is pending."""
        picked = []
        for i in (1, 2):
            nth, when = rng.randint(1, most), rng.choice(("before", "after"))
            name = f"{phase} random {i}: {when} command {nth}"
            picked.append(KillRule(name, ACTUATION if kinds else ANY, when, kinds, nth))
        return picked

    run_scenario(kill_site, Scenario(
        start=Phase("start", rules("start", START, 6), timed=rng.uniform(0.0, 1.5)),
        move=Phase("move", rules("move", MOVE, 6)),
        stop=Phase("stop", rules("stop", STOP, 3), timed=rng.uniform(0.0, 1.5)),
        restart=Phase("start", rules("restart", START, 5)),
        finish=Phase("round", rules("finish", (), 5), timed=rng.uniform(0.0, 3.0)),
    ))  # fmt: skip


def test_sigkill_after_requeuehold_while_the_jobs_still_exit(kill_site: KillSite) -> None:
    """Jobs that take 3 s to exit after Slurm's SIGTERM (sia-launch tearing torchrun down):
    killed right after ``requeuehold``, the restarted controller finds them still COMPLETING.
    The re-apply waits for them to be PENDING; signalling them again would make scancel retry
    for ~95 s ("Job can not be altered now") and a second requeue is refused."""
    run_scenario(kill_site, Scenario(
        start=Phase("start"),
        move=Phase("move", [KillRule("move: after requeuehold", REQUEUEHOLD, "after", MOVE)]),
        exit_delay=3.0,
    ))  # fmt: skip
    signals = [c for c in kill_site.plan.calls() if re.match(SIGNAL, c["argv"])]
    assert len(signals) == 1, signals  # the move's one signal, none in its re-apply


def test_start_of_a_job_stopped_longer_than_the_requeue_delay(kill_site: KillSite) -> None:
    """No kill: a job stopped, then started again once its requeue delay (cred_expire + 1 s)
    has passed, as any job preempted for a while is. Slurm then reports ``start_time`` 0 for
    it: the start sends no StartTime (a floor computed from 0 was 1969), and succeeds."""
    site = kill_site.site
    kill_site.submit("late", 0.0)
    runner = SubprocessRunner(site.cluster.env, kill_site.plan.bin_dir)  # the shim logs calls
    backend = SlurmBackend(load_config(site.config_path), runner)
    config, batch = Configuration("t4", 1, 1), BatchChoice(128, 128, 0)
    placement = (NodeShare("t4-1", 1),)

    def apply(action: Start | Stop) -> list[str]:
        backend.snapshot()
        return [r.message for r in backend.apply([action]) if not r.ok]

    assert apply(Start("late", 1, config, placement, batch)) == []
    kill_site.wait(lambda: kill_site.reporting_since("late", 0.0), "late started")
    assert apply(Stop("late", 2)) == []
    kill_site.wait(  # the dev cluster's cred_expire is 30 s
        lambda: kill_site.squeue()["late"].start_time == 0, "Slurm to let the requeue delay pass"
    )
    stopped = time.time()
    assert apply(Start("late", 3, config, placement, batch)) == []
    kill_site.wait(lambda: kill_site.reporting_since("late", stopped), "late started again")
    start_times = [c["argv"] for c in kill_site.plan.calls() if "StartTime=" in c["argv"]]
    assert start_times == [], start_times
    site.finish("late")
    kill_site.wait(lambda: kill_site.squeue()["late"].state == "COMPLETED", "late to finish")
