"""Daemons that die and come back, nodes taken out and given back: the fault operations of a
dev cluster (``DevCluster`` inherits them from :class:`DaemonFaults`), and what ``cluster.json``
records (:class:`Recorded`).

Kept apart from :mod:`sia_slurm_dev.lifecycle` (bringing a cluster up and down) so each
reads on its own; the mixin uses the cluster's own steps (its record, runner and daemon
starters), declared below for the reader and the type checker.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.slurm.observe.inventory import parse_nodes
from sia_slurm.slurm.records import parse_records
from sia_slurm.slurm.runner import CommandError, SubprocessRunner
from sia_slurm_dev.chroot import SYSTEM, SlurmPrograms
from sia_slurm_dev.process import (
    DaemonRecord,
    descendants,
    is_alive,
    kill_processes,
    node_job_processes,
    process_parents,
)
from sia_slurm_dev.slurm_conf import ClusterLayout
from sia_slurm_dev.spec import DevClusterSpec


class DevClusterError(RuntimeError):
    """The dev cluster could not be started, checked or stopped; the message says why."""


@dataclass(frozen=True)
class Recorded:
    """What ``cluster.json`` says runs: the spec, slurmctld's user, the daemons and the
    Slurm release (``system`` or a root's)."""

    spec: str
    slurm_user: str
    daemons: list[DaemonRecord]
    slurm: str = SYSTEM


class DaemonFaults:
    """kill/start slurmctld and slurmd, drain and resume nodes (mixed into ``DevCluster``)."""

    layout: ClusterLayout
    _log: Callable[[str], None]

    # Provided by DevCluster.
    def runner(self, timeout_s: float = 30.0) -> SubprocessRunner: ...
    def _recorded(self) -> Recorded | None: ...
    def _slurm_account(self, name: str | None = None) -> object: ...
    def _hand_to_slurm_user(self, account: object) -> None: ...
    def _programs(self, release: str) -> SlurmPrograms: ...
    def _start_slurmctld(self, programs: SlurmPrograms, *, clear_state: bool) -> DaemonRecord: ...
    def _start_slurmd(self, programs: SlurmPrograms, node: str) -> DaemonRecord: ...
    def _wait_for_controller(self, controller: DaemonRecord, timeout_s: float) -> None: ...
    def _save(
        self,
        spec: DevClusterSpec,
        records: list[DaemonRecord],
        slurm_user: str | None = None,
        slurm: str | None = None,
    ) -> None: ...

    def kill_slurmctld(self) -> DaemonRecord:
        """SIGKILL slurmctld (and its slurmscriptd), as a crash: nothing it had not saved yet
        survives, and it saves a few seconds after a change (SAVE_MAX_WAIT, 5 s) or, for a
        start by its backfill scheduler, whenever something else asks (:meth:`save_state`),
        so an update it acknowledged just before may be gone when it comes back. Jobs keep
        running: their steps belong to the slurmd. Returns the record of what was killed."""
        record = self._live_daemon("slurmctld")

        def tree() -> set[int]:
            # slurmscriptd is slurmctld's fork; a restarted slurmctld starts its own.
            return descendants(process_parents(), [record.pid]) if is_alive(record) else set()

        kill_processes(tree)
        self._log(f"slurmctld (pid {record.pid}) killed with SIGKILL")
        return record

    def start_slurmctld(self, timeout_s: float = 90.0, *, wait_nodes: bool = True) -> DaemonRecord:
        """Start slurmctld again as ``up`` does, but without ``-c``: it recovers jobs, nodes
        and reservations from StateSaveLocation. Returns once it answers ``scontrol ping``
        and (``wait_nodes``) every node whose slurmd runs has registered: until then an idle
        node reads UNKNOWN (seen for ~4 s), and Slurm refuses to resume it."""
        recorded, record = self._stopped_daemon("slurmctld")
        account = self._slurm_account(recorded.slurm_user)
        if account is not None:
            self._hand_to_slurm_user(account)
        started = self._start_slurmctld(self._programs(recorded.slurm), clear_state=False)
        self._replace_record(recorded, record, started)
        self._wait_for_controller(started, timeout_s)
        self._log(f"slurmctld started again (pid {started.pid}), state recovered")
        if wait_nodes:
            for daemon in recorded.daemons:
                kind, _, node = daemon.role.partition(":")
                if kind == "slurmd" and is_alive(daemon):
                    self.wait_for_node(node, _registered, "registered", timeout_s)
        return started

    def restart_slurmctld(self, timeout_s: float = 90.0) -> DaemonRecord:
        """:meth:`kill_slurmctld`, then :meth:`start_slurmctld` at once."""
        self.kill_slurmctld()
        return self.start_slurmctld(timeout_s)

    def kill_slurmd(self, node: str, *, jobs: bool = False) -> set[int]:
        """SIGKILL ``node``'s slurmd. Its jobs' processes (slurmstepd and what it started) live
        on, as when slurmd alone crashes; with ``jobs`` they are killed too, as when the node
        itself dies. Slurm sets the node DOWN SlurmdTimeout later and requeues its
        ``--requeue`` jobs. Returns the job processes killed."""
        record = self._live_daemon(f"slurmd:{node}")
        kill_processes(lambda: {record.pid} if is_alive(record) else set())
        killed = set()
        if jobs:
            spool = self.layout.spool_dir(node)
            killed = kill_processes(lambda: node_job_processes(spool))
        what = f" and {len(killed)} job process(es)" if jobs else ""
        self._log(f"slurmd of {node} (pid {record.pid}){what} killed with SIGKILL")
        return killed

    def start_slurmd(self, node: str, timeout_s: float = 60.0) -> DaemonRecord:
        """Start ``node``'s slurmd again; returns once slurmctld hears from it (the node is no
        longer DOWN or NOT_RESPONDING: ReturnToService=2 makes it capacity again). Jobs
        Slurm requeued elsewhere meanwhile and still running there are killed by Slurm."""
        recorded, record = self._stopped_daemon(f"slurmd:{node}")
        started = self._start_slurmd(self._programs(recorded.slurm), node)
        self._replace_record(recorded, record, started)
        self._log(f"slurmd of {node} started again (pid {started.pid})")
        self.wait_for_node(node, _responding, "responding", timeout_s)
        return started

    def start_killed(self, timeout_s: float = 90.0) -> list[str]:
        """Start again every daemon a fault left stopped (slurmctld first); their roles."""
        recorded = self._recorded_or_fail()
        stopped = [r.role for r in recorded.daemons if not is_alive(r)]
        if "munged" in stopped:
            raise DevClusterError(
                f"munged is not running in {self.layout.root}: take the cluster down and up again"
            )
        for role in stopped:
            node = parse_daemon(role, self.node_names())
            if node is None:
                self.start_slurmctld(timeout_s)
            else:
                self.start_slurmd(node, timeout_s)
        return stopped

    def save_state(self, job_id: str, timeout_s: float = 30.0) -> float:
        """Make slurmctld write its state now, and return once it has (the file's time).

        slurmctld writes StateSaveLocation a few seconds after an RPC that changes a job
        (SAVE_MAX_WAIT, 5 s), but a job its backfill scheduler starts asks for no save: that
        start can stay unwritten until something else asks (verified on 22.05: killed 10 s
        after a backfill start, slurmctld came back with the job PENDING and killed its batch
        step when the node registered). A crash test that means "the running jobs are known to
        Slurm" asks for a save first: an update of job ``job_id`` that sets its Comment to what
        it is asks for one. The state written after the update holds everything Slurm did
        before it."""
        self._recorded_or_fail()
        runner = self.runner()
        records = parse_records(runner.run(["scontrol", "-o", "show", "job", job_id]).stdout)
        if not records:
            raise DevClusterError(f"save_state: Slurm has no job {job_id}")
        comment = records[0].get("Comment", "")
        asked = time.time()  # before the update: a state written from now on is newer
        runner.run(["scontrol", "update", f"JobId={job_id}", f"Comment={comment}"])
        state = self.layout.state_dir / "job_state"
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(FileNotFoundError):
                written = state.stat().st_mtime
                if written >= asked:
                    return written
            if time.monotonic() > deadline:
                raise DevClusterError(f"slurmctld did not write {state} within {timeout_s:g} s")
            time.sleep(0.2)

    def drain(self, node: str, reason: str = "dev-cluster drain") -> None:
        """``scontrol update NodeName=node State=DRAIN``: no new jobs there; running ones go on."""
        self._recorded_or_fail()
        argv = ["scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}"]
        self.runner().run(argv)

    def fail_next_prolog(self) -> Path:
        """Make the next job launch's prolog fail, on whichever node it runs: Slurm drains
        that node ("Prolog error") and requeues the job held (``launch_failed_requeued_held``)
        when it may be requeued, as a node with a broken prolog does. Returns the file whose
        presence asks for it (the prolog renames it to ``*.taken.<job id>`` as it fails)."""
        self._recorded_or_fail()
        self.layout.prolog_failure.touch()
        return self.layout.prolog_failure

    def resume(self, node: str, timeout_s: float = 30.0) -> str:
        """``scontrol update NodeName=node State=RESUME``: a drained or DOWN node is used again.
        Slurm pings a resumed node first (NOT_RESPONDING for a moment); returns its state once
        it answers and is no longer drained. A node already schedulable is left as it is (Slurm
        refuses to resume it: "Invalid node state specified"); so is one whose drain a
        slurmctld crash lost before it was saved."""
        if _schedulable(self.node_state(node)):
            return self.node_state(node)
        self.runner().run(["scontrol", "update", f"NodeName={node}", "State=RESUME"])
        return self.wait_for_node(node, _schedulable, "schedulable", timeout_s)

    def node_names(self) -> list[str]:
        """The nodes of the cluster recorded in ``root`` (none when there is none)."""
        recorded = self._recorded()
        return DevClusterSpec.parse(recorded.spec).node_names() if recorded else []

    def node_state(self, node: str) -> str:
        """Slurm's state of ``node`` (``IDLE``, ``MIXED+DRAIN``, ``DOWN+NOT_RESPONDING``...)."""
        self._recorded_or_fail()
        (info,) = parse_nodes(self.runner().run(["scontrol", "-o", "show", "node", node]).stdout)
        return info.state

    def wait_for_node(
        self, node: str, wanted: Callable[[str], bool], what: str, timeout_s: float = 60.0
    ) -> str:
        """Wait until ``wanted(state)`` holds for ``node``'s state; return that state."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                state = self.node_state(node)
            except CommandError as exc:
                state = f"(scontrol failed: {exc})"
            else:
                if wanted(state):
                    return state
            if time.monotonic() > deadline:
                raise DevClusterError(
                    f"node {node} not {what} within {timeout_s:g} s (state {state}); see "
                    f"{self.layout.log_dir}"
                )
            time.sleep(0.2)

    def _live_daemon(self, role: str) -> DaemonRecord:
        recorded = self._recorded_or_fail()
        record = _find_role(recorded, role)
        if not is_alive(record):
            raise DevClusterError(f"{role} is not running in {self.layout.root} (pid {record.pid})")
        return record

    def _stopped_daemon(self, role: str) -> tuple[Recorded, DaemonRecord]:
        recorded = self._recorded_or_fail()
        record = _find_role(recorded, role)
        if is_alive(record):
            raise DevClusterError(
                f"{role} still runs in {self.layout.root} (pid {record.pid}); kill it first"
            )
        return recorded, record

    def _replace_record(self, recorded: Recorded, old: DaemonRecord, new: DaemonRecord) -> None:
        daemons = [new if r == old else r for r in recorded.daemons]
        spec = DevClusterSpec.parse(recorded.spec)
        self._save(spec, daemons, recorded.slurm_user, recorded.slurm)

    def _recorded_or_fail(self) -> Recorded:
        recorded = self._recorded()
        if recorded is None:
            raise DevClusterError(
                f"no dev cluster in {self.layout.root}: start one with `sia-slurm dev-cluster up`"
            )
        return recorded


def _find_role(recorded: Recorded, role: str) -> DaemonRecord:
    record = next((r for r in recorded.daemons if r.role == role), None)
    if record is None:
        known = ", ".join(r.role for r in recorded.daemons)
        raise DevClusterError(f"no daemon {role!r} in this dev cluster; it has {known}")
    return record


def _responding(state: str) -> bool:
    """Whether slurmctld hears from the node: not DOWN, not NOT_RESPONDING (``*``)."""
    flags = state.upper().replace("*", "+NOT_RESPONDING").split("+")
    return not {"DOWN", "NOT_RESPONDING"} & set(flags)


def _registered(state: str) -> bool:
    """Whether a restarted slurmctld has heard from the node (an idle node is UNKNOWN until)."""
    return "UNKNOWN" not in state.split("+")


def _schedulable(state: str) -> bool:
    """Responding and neither drained nor DOWN: Slurm may start jobs there."""
    return _responding(state) and not {"DRAIN", "DRAINED", "DRAINING"} & set(state.split("+"))


def parse_daemon(text: str, nodes: list[str]) -> str | None:
    """``slurmctld`` (None) or ``slurmd:NODE`` (NODE), as ``status`` names the daemons."""
    if text == "slurmctld":
        return None
    kind, _, node = text.partition(":")
    if kind == "slurmd" and node in nodes:
        return node
    choices = ", ".join(["slurmctld", *(f"slurmd:{n}" for n in nodes)])
    raise DevClusterError(f"no daemon {text!r} in this dev cluster; choose one of {choices}")
