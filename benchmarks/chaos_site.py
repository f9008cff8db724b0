"""The chaos soak's machinery: the site (cluster, controller, submissions, Slurm's view) and
the injectors that carry out the fault schedule (``benchmarks/chaos.py`` says what each does).

Everything here acts; what it did is recorded (:class:`Injection`) so that the verdicts in
:mod:`benchmarks.chaos_evidence` can be read against it.
"""

from __future__ import annotations

import contextlib
import ctypes
import heapq
import json
import os
import random
import re
import select
import shutil
import signal
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.chaos_plan import ChaosError, Fault, JobPlan
from sia_slurm.protocol import StatePaths
from sia_slurm.slurm.observe.jsonparse import parse_squeue_json
from sia_slurm.state.tree import set_up
from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec, controller_config
from sia_slurm_dev.access import Account
from sia_slurm_dev.supervisor import Supervisor

REPO = Path(__file__).resolve().parents[1]
SERVICE, USER = "siasvc", "siaalice"  # the accounts of tests/accounts.py
JOB_ENV = "--export=ALL,SIA_METRICS_INTERVAL_S=5,SIA_LINGER_S=120"  # as the demo's jobs
SLURMD_DOWN_S = 45.0  # a killed slurmd is started again this long after (the node is DOWN by then)
DRAIN_S = 60.0  # a drained node is resumed this long after
RETRY_S = 15.0  # a fault that finds no target (no job running yet) tries again this much later
RETRIES = 20


@dataclass
class Site:
    """The soak's dev cluster, state tree, controller supervisor and what Slurm showed."""

    directory: Path
    cluster: DevCluster
    env: dict[str, str] = field(default_factory=dict)
    supervisor: Supervisor | None = None
    ids: dict[str, str] = field(default_factory=dict)  # job name -> sia id
    # job name -> (Slurm job id sia-sbatch printed, when): a job Slurm forgets is still known
    submitted: dict[str, tuple[str, float]] = field(default_factory=dict)
    slurm: dict[str, dict[str, Any]] = field(default_factory=dict)  # Slurm job id -> last seen
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def paths(self) -> StatePaths:
        return StatePaths(self.state_dir)

    @property
    def out_dir(self) -> Path:
        return self.directory / "out"

    @property
    def config(self) -> Path:
        return self.directory / "sia.yaml"

    def log(self, name: str) -> Path:
        return self.out_dir / f"{name}.out"

    def samples(self, name: str) -> Path:
        return self.out_dir / f"{name}-samples"

    def prepare(self, round_s: float) -> None:
        """Fresh state and output directories, the controller's config and log (``siasvc``'s),
        the state tree as ``sia-slurm setup --user siasvc`` makes it."""
        service, user = Account.lookup(SERVICE), Account.lookup(USER)
        if service is None or user is None:
            raise SystemExit(
                f"chaos: the accounts {SERVICE} and {USER} are missing: create them as the tests "
                "do (python -c 'from tests.accounts import ensure_test_accounts as e; e()')"
            )
        for stale in ("state", "out", "controller.log", "supervisor.log"):
            path = self.directory / stale
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.directory.chmod(0o755)
        self.out_dir.mkdir()
        os.chown(self.out_dir, user.uid, user.gid)
        spec = DevClusterSpec.parse(DEFAULT_SPEC)
        self.config.write_text(controller_config(spec, self.state_dir, round_seconds=round_s))
        self.config.chmod(0o644)
        set_up(self.state_dir, service.uid, service.gid)
        log = self.directory / "controller.log"
        log.touch()
        os.chown(log, service.uid, service.gid)

    def start(self) -> None:
        """The cluster (fresh), then the supervised controller loop as ``siasvc``."""
        self.cluster.down()
        self.cluster.up(DevClusterSpec.parse(DEFAULT_SPEC))
        self.env = {**os.environ, **self.cluster.env, "PYTHONPATH": str(REPO),
                    "SIA_SLURM_CONFIG": str(self.config)}  # fmt: skip
        check = self.run_as(USER, [sys.executable, "-c", "import sia_slurm.job, torch"])
        if check.returncode != 0:
            raise SystemExit(f"chaos: {USER} cannot run {sys.executable}: {check.stderr[-500:]}")
        argv = [
            "setpriv", f"--reuid={SERVICE}", f"--regid={SERVICE}", "--init-groups", "--",
            sys.executable, "-m", "sia_slurm.cli", "controller", "run",
            "--config", str(self.config), "--log-file", str(self.directory / "controller.log"),
        ]  # fmt: skip
        self.supervisor = Supervisor(argv, self.env, self.directory)
        self.supervisor.start()

    def stop(self, keep: bool) -> None:
        self.stopping.set()
        if self.supervisor is not None:
            self.supervisor.stop(timeout_s=120.0)
            text = "\n".join(
                f"pid {e.pid} exit {e.returncode}\n{e.output}" for e in self.supervisor.exits
            )
            (self.directory / "supervisor.log").write_text(text)
        if not keep:
            self.cluster.down()

    def run_as(
        self, user: str, argv: list[str], cwd: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["runuser", "-u", user, "--", *argv], env=self.env, cwd=cwd or "/", text=True,
            capture_output=True, check=False, timeout=120,
        )  # fmt: skip

    def submit(self, plan: JobPlan) -> str:
        argv = [
            sys.executable, "-m", "sia_slurm.job.sbatch", "--config", str(self.config),
            "--parsable",
            "--app", plan.app, "--max-gpus", str(plan.max_gpus), "--job-name", plan.name,
            f"--output={self.log(plan.name)}", JOB_ENV, "--max-failures", str(plan.max_failures),
            "--", sys.executable, *plan.command, "--sample-log", str(self.samples(plan.name)),
        ]  # fmt: skip
        done = self.run_as(USER, argv, cwd=self.out_dir)
        if done.returncode != 0:
            raise ChaosError(f"sia-sbatch {plan.name}: {done.stderr.strip()[-500:]}")
        sia_id = done.stderr.strip().rsplit(" ", 1)[-1]
        self.ids[plan.name] = sia_id
        self.submitted[plan.name] = (done.stdout.strip(), time.time())
        if plan.max_failures:
            # The checkpoint kill watches this directory; the trainer makes it only at its
            # first save, which the kill would then miss. The user makes it first (the job is
            # held until the controller starts it), as a user giving --checkpoint-dir would.
            self.run_as(USER, ["mkdir", "-p", str(self.paths.job_dir(sia_id) / "checkpoints")])
        return sia_id

    def poll_slurm(self) -> None:
        """Remember each managed Slurm job's latest state (slurmctld may be down: skipped)."""
        done = subprocess.run(
            ["squeue", "--json", "--all", "--states=all"], env=self.env, text=True,
            capture_output=True, check=False, timeout=60,
        )  # fmt: skip
        if done.returncode != 0:
            return
        try:
            jobs = parse_squeue_json(done.stdout).jobs
        except ValueError:
            return
        with self.lock:
            for job in jobs:
                if job.comment.startswith("sia-slurm:"):
                    self.slurm[job.job_id] = {
                        "sia_id": job.comment.split(":", 1)[1], "state": job.state,
                        "flags": list(job.flags), "nodes": list(job.nodes),
                        "restarts": job.restart_count, "reason": job.reason,
                    }  # fmt: skip

    def running_nodes(self) -> dict[str, list[str]]:
        """Node -> sia ids of the managed jobs Slurm last showed RUNNING there."""
        nodes: dict[str, list[str]] = {}
        with self.lock:
            for job in self.slurm.values():
                if job["state"] == "RUNNING":
                    for node in job["nodes"]:
                        nodes.setdefault(node, []).append(job["sia_id"])
        return nodes

    def phases(self) -> dict[str, tuple[str, str]]:
        """sia id -> (phase, message) from the controller's database ({} until it exists)."""
        try:
            with sqlite3.connect(f"file:{self.state_dir / 'sia.db'}?mode=ro", uri=True) as conn:
                rows = conn.execute("SELECT sia_id, phase, message FROM jobs").fetchall()
        except sqlite3.Error:
            return {}
        return {sia_id: (phase, message) for sia_id, phase, message in rows}

    def pending_actions(self) -> int:
        try:
            with sqlite3.connect(f"file:{self.state_dir / 'sia.db'}?mode=ro", uri=True) as conn:
                return conn.execute(
                    "SELECT count(*) FROM actions WHERE state='pending'"
                ).fetchone()[0]
        except sqlite3.Error:
            return -1


def rank0_pids(sia_ids: Iterable[str]) -> dict[str, set[int]]:
    """The rank-0 training processes of these jobs on this host (their environment says
    which: ``SIA_SIA_ID`` and torchrun's ``RANK=0``); one pass over /proc for all of them."""
    wanted = {f"SIA_SIA_ID={sia_id}".encode(): sia_id for sia_id in sia_ids}
    found: dict[str, set[int]] = {sia_id: set() for sia_id in wanted.values()}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if b"sia_slurm.job.examples" not in Path(f"/proc/{entry}/cmdline").read_bytes():
                continue
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"RANK=0" not in environ:
            continue
        for item in environ:
            if item in wanted:
                found[wanted[item]].add(int(entry))
    return found


# ----------------------------------------------------------------------------------------------
# The injectors


@dataclass
class Injection:
    """What one fault (or its follow-up: a restart, a resume) did, seconds after the start."""

    kind: str
    index: int
    planned_s: float
    at_s: float
    target: str = ""
    ok: bool = False
    note: str = ""


class Injector:
    """Carries out the schedule in order, one action at a time, in its own thread (so that a
    slurmctld restart is complete before the next fault lands). A fault that finds no target
    yet (no managed job running) tries again :data:`RETRY_S` later, :data:`RETRIES` times."""

    def __init__(
        self,
        site: Site,
        plans: dict[str, JobPlan],
        faults: list[Fault],
        seed: int,
        started: float,
        checkpoint_killer: CheckpointKiller,
    ) -> None:
        self.site, self.plans, self.started = site, plans, started
        self.rng = random.Random(seed + 2)
        self.killer = checkpoint_killer
        self.done: list[Injection] = []
        self.job_kill_targets: set[str] = set()  # sia ids whose own failure was injected
        self._queue: list[tuple[float, int, Fault, int]] = []
        self._seq = 0
        self._busy = False  # an action is under way (popped from the queue, not yet recorded)
        self._nodes: dict[int, str] = {}  # slurmd_kill index -> node, for its restart
        self._drained: dict[int, str] = {}  # drain index -> node, for its resume
        for fault in faults:
            self._push(fault.at_s, fault)
        self.thread = threading.Thread(target=self._run, name="injector", daemon=True)

    def _push(self, at_s: float, fault: Fault, tries: int = 0) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (at_s, self._seq, fault, tries))

    @property
    def idle(self) -> bool:
        """Every fault and follow-up is done (or found no target :data:`RETRIES` times)."""
        return not self._queue and not self._busy

    def _run(self) -> None:
        while self._queue and not self.site.stopping.is_set():
            at_s, _, fault, tries = self._queue[0]
            if time.time() - self.started < at_s:
                self.site.stopping.wait(min(1.0, at_s - (time.time() - self.started)))
                continue
            self._busy = True
            heapq.heappop(self._queue)
            record = Injection(
                fault.kind, fault.index, fault.at_s, round(time.time() - self.started, 1)
            )
            try:
                again = getattr(self, f"_{fault.kind}")(fault, record)
            except Exception as exc:  # a fault that cannot be injected is recorded, not fatal
                record.note = f"{type(exc).__name__}: {exc}"
                again = False
            if again and tries < RETRIES:
                self._push(at_s + RETRY_S, fault, tries + 1)
                self._busy = False
                continue
            if again:
                record.note = record.note or "no target found"
            self.done.append(record)
            self._busy = False
            with open(self.site.directory / "faults.jsonl", "a", encoding="utf-8") as log:
                log.write(json.dumps(asdict(record)) + "\n")
            print(f"  {record.at_s:7.1f} s: {record.kind} #{record.index} {record.target} "
                  f"{'ok' if record.ok else 'NOT INJECTED'} {record.note}", flush=True)  # fmt: skip

    # ---- the faults (True: no target yet, try again) --------------------------------------

    def _controller_kill(self, _fault: Fault, record: Injection) -> bool:
        assert self.site.supervisor is not None
        pid = self.site.supervisor.kill_now()
        record.ok, record.target = pid is not None, f"controller pid {pid}"
        return pid is None

    def _slurmctld_restart(self, _fault: Fault, record: Injection) -> bool:
        killed = self.site.cluster.kill_slurmctld()
        down = self.rng.uniform(2.0, 8.0)
        time.sleep(down)
        started = self.site.cluster.start_slurmctld(timeout_s=180.0)
        record.ok, record.target = True, f"pid {killed.pid} -> {started.pid}"
        record.note = f"down {down:.1f} s"
        return False

    def _busy_node(self) -> str | None:
        nodes = self.site.running_nodes()
        return self.rng.choice(sorted(nodes)) if nodes else None

    def _slurmd_kill(self, fault: Fault, record: Injection) -> bool:
        node = self._busy_node()
        if node is None:
            return True
        with_jobs = fault.index % 2 == 1
        killed = self.site.cluster.kill_slurmd(node, jobs=with_jobs)
        record.ok, record.target = True, node
        record.note = f"with {len(killed)} job processes" if with_jobs else "slurmd alone"
        restart = Fault(fault.at_s + SLURMD_DOWN_S, "slurmd_start", fault.index)
        self._push(time.time() - self.started + SLURMD_DOWN_S, restart)
        self._nodes[fault.index] = node
        return False

    def _slurmd_start(self, fault: Fault, record: Injection) -> bool:
        node = self._nodes[fault.index]
        self.site.cluster.start_slurmd(node, timeout_s=120.0)
        record.ok, record.target = True, node
        return False

    def _drain(self, fault: Fault, record: Injection) -> bool:
        node = self._busy_node()
        if node is None:
            return True
        self.site.cluster.drain(node, "chaos soak")
        record.ok, record.target = True, node
        self._drained[fault.index] = node
        self._push(
            time.time() - self.started + DRAIN_S, Fault(fault.at_s + DRAIN_S, "resume", fault.index)
        )
        return False

    def _resume(self, fault: Fault, record: Injection) -> bool:
        node = self._drained[fault.index]
        record.note = self.site.cluster.resume(node, timeout_s=120.0)
        record.ok, record.target = True, node
        return False

    def _job_kill(self, _fault: Fault, record: Injection) -> bool:
        running = {sia for sias in self.site.running_nodes().values() for sia in sias}
        names = {sia: name for name, sia in self.site.ids.items()}
        eligible = sorted(
            sia for sia in running - self.job_kill_targets
            if sia in names and not self.plans[names[sia]].real
            and self.plans[names[sia]].max_failures == 0
        )  # fmt: skip
        pids = rank0_pids(eligible)
        trained = [sia for sia in eligible if pids[sia]]
        if not trained:
            return True
        target = self.rng.choice(trained)
        for pid in pids[target]:
            os.kill(pid, signal.SIGKILL)
        self.job_kill_targets.add(target)
        record.ok, record.target = (
            True,
            f"{names[target]} ({target}) rank 0 pid {sorted(pids[target])}",
        )
        return False

    def _checkpoint_kill(self, _fault: Fault, record: Injection) -> bool:
        self.killer.arm()
        record.ok, record.target = True, "armed: rank 0 of the next checkpoint write"
        return False


IN_CREATE = 0x100
_EVENT = struct.Struct("iIII")
DATA_TMP = re.compile(r"^\.ckpt-(\d{10})\.pt\.(?!sha256\.)\w+\.tmp$")  # mkstemp of the data file


class CheckpointKiller:
    """SIGKILLs rank 0 of a candidate job (``--max-failures 1``) the moment it creates the
    temporary file of a checkpoint's data, which it fsyncs and renames before it writes the
    digest that makes the checkpoint complete (``sia_slurm/job/elastic/checkpoint.py``). The kill
    counts when, a second later, that checkpoint has no digest; otherwise it came too late
    and the next write is tried. Uses Linux inotify (through libc), so that the kill lands
    within the write, which a poll could not catch."""

    def __init__(self, site: Site, candidates: dict[str, str]) -> None:
        self.site, self.candidates = site, candidates  # sia id -> job name
        self.armed = threading.Event()
        self.started = 0.0
        self.result: dict[str, Any] | None = None
        self.missed: list[dict[str, Any]] = []
        self.thread = threading.Thread(target=self._run, name="checkpoint-killer", daemon=True)

    def arm(self) -> None:
        self.armed.set()

    def _run(self) -> None:
        while not self.armed.wait(1.0):
            if self.site.stopping.is_set():
                return
        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            self.result = {"error": f"inotify_init1: errno {ctypes.get_errno()}"}
            return
        watches: dict[int, str] = {}
        pids: dict[str, set[int]] = {}
        refreshed = 0.0
        try:
            while self.result is None and not self.site.stopping.is_set():
                if time.monotonic() - refreshed > 1.0:
                    refreshed = time.monotonic()
                    pids = rank0_pids(self.candidates)
                    for sia_id in self.candidates:
                        directory = self._directory(sia_id)
                        if sia_id not in watches.values() and directory.is_dir():
                            wd = libc.inotify_add_watch(fd, bytes(directory), IN_CREATE)
                            if wd >= 0:
                                watches[wd] = sia_id
                if not select.select([fd], [], [], 0.2)[0]:
                    continue
                data = os.read(fd, 65536)
                for wd, name in _events(data):
                    found = DATA_TMP.match(name)
                    sia_id = watches.get(wd)
                    if found and sia_id and pids.get(sia_id):
                        self._kill(sia_id, int(found[1]), pids[sia_id])
                        break
        finally:
            os.close(fd)

    def _directory(self, sia_id: str) -> Path:
        return self.site.paths.job_dir(sia_id) / "checkpoints"

    def _kill(self, sia_id: str, step: int, pids: set[int]) -> None:
        when = time.time()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(1.0)
        data = self._directory(sia_id) / f"ckpt-{step:010d}.pt"
        digest = data.with_name(data.name + ".sha256")
        record = {
            "sia_id": sia_id, "name": self.candidates[sia_id], "step": step, "time": when,
            "pids": sorted(pids), "data_file": data.exists(), "digest": digest.exists(),
        }  # fmt: skip
        if digest.exists():
            self.missed.append(record)
            print(f"  checkpoint kill of {record['name']} came too late (step {step}); "
                  "waiting for the next write", flush=True)  # fmt: skip
            return
        self.result = record
        print(f"  checkpoint kill: {record['name']} rank 0 killed while writing step {step} "
              f"(data file {'renamed' if data.exists() else 'not yet renamed'}, no digest)",
              flush=True)  # fmt: skip


def _events(data: bytes) -> list[tuple[int, str]]:
    """(watch descriptor, name) of each ``struct inotify_event`` in ``data``."""
    events, offset = [], 0
    while offset + _EVENT.size <= len(data):
        wd, _mask, _cookie, length = _EVENT.unpack_from(data, offset)
        raw = data[offset + _EVENT.size : offset + _EVENT.size + length]
        events.append((wd, raw.split(b"\0", 1)[0].decode(errors="replace")))
        offset += _EVENT.size + length
    return events
