"""A small cluster for the service tests that honestly implements ``ClusterBackend``.

Its state lives in a JSON file (or in memory), so it survives a controller process that
crashes, as Slurm does. Jobs change phase only when actions are applied or when the test
advances the clock: ``Start`` launches a pending job (STARTING, RUNNING after a restart delay),
``Move`` relaunches a job elsewhere, ``Stop`` returns it to PENDING, ``Rebatch`` changes its
batch. Every action is idempotent as the real backend's must be: re-applying a done action
changes nothing, and a half-done ``Move`` (stopped, not restarted) is completed. GPUs are never
over-committed (an action that would is refused). Faults for crash tests: ``crash_after``
(``os._exit`` after that many actions were applied and saved), ``raise_after`` (an exception
instead), ``poison`` (an exception at any action of those jobs), ``slow_snapshot_s`` (a
snapshot that takes up to that long, to hold the controller lock; with a file-backed state the
test sees each snapshot begin and lets it end: :meth:`FakeCluster.snapshots_begun`,
:meth:`FakeCluster.let_snapshots_end`, so no test guesses how long a process takes).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sia_slurm.cluster import (
    Action,
    ActionResult,
    BatchChoice,
    ClusterSnapshot,
    JobPhase,
    JobSnapshot,
    Move,
    Rebatch,
    Start,
    Stop,
)
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare, NodeView
from sia_slurm.protocol import JobSpec, MetricsReport, from_json, to_json
from sia_slurm.safefiles import write_json_atomic

CRASH_EXIT = 86


class Crash(BaseException):
    """An in-process stand-in for ``os._exit``: no ``except Exception`` handler catches it, so
    nothing after the crash point runs, as when the process dies."""


SPEED = {"a100": 1600.0, "t4": 400.0}  # samples/s per GPU at a large local batch
NODES = (
    NodeView("a100-1", "a100", 4, 4),
    NodeView("a100-2", "a100", 4, 4),
    NodeView("t4-1", "t4", 4, 4),
    NodeView("t4-2", "t4", 4, 4),
)


def step_time(config: Configuration, local_bsz: int) -> tuple[float, float]:
    """(step, sync) seconds of one micro-batch: compute plus a sync that grows across nodes."""
    compute = 0.01 + local_bsz / SPEED[config.gpu_type]
    sync = 0.0 if config.gpus == 1 else 0.004 * config.gpus * (2.0 if config.nodes > 1 else 1.0)
    return compute + sync, sync


@dataclass
class FakeJob:
    spec: JobSpec
    work: float  # samples to process
    phase: str = JobPhase.PENDING.value
    config: Configuration | None = None
    placement: tuple[NodeShare, ...] = ()
    batch: BatchChoice | None = None
    restarts: int = 0
    launches: int = 0
    completions: int = 0
    done_work: float = 0.0
    ready_at: float = 0.0  # STARTING -> RUNNING at this time
    finish_time: float | None = None
    slurm_job_id: str = ""
    user: str = ""  # whose job, as Slurm would say
    account: str = ""


@dataclass
class FakeCluster:
    """See the module docstring. ``path`` None keeps the state in memory only."""

    path: Path | None = None
    nodes: tuple[NodeView, ...] = NODES
    restart_delay: float = 20.0
    crash_after: int | None = None
    crash_in_process: bool = False  # raise Crash instead of os._exit
    raise_after: int | None = None
    poison: frozenset[str] = frozenset()  # sia ids whose actions make apply raise
    slow_snapshot_s: float = 0.0
    time: float = 0.0
    jobs: dict[str, FakeJob] = field(default_factory=dict)
    applied: list[tuple[str, str]] = field(default_factory=list)  # (kind, sia_id) that changed
    apply_calls: int = 0
    next_id: int = 1000

    # -- the test's side --------------------------------------------------------------------

    def submit(self, spec: JobSpec, work: float = 2e5, user: str = "", account: str = "") -> None:
        self._load()
        self.jobs[spec.sia_id] = FakeJob(
            spec, work, slurm_job_id=str(self.next_id), user=user, account=account
        )
        self.next_id += 1
        self._save()

    def advance(self, seconds: float) -> None:
        """Let the world run: restores finish, running jobs make progress and may finish."""
        self._load()
        end = self.time + seconds
        for job in self.jobs.values():
            if job.phase == JobPhase.STARTING.value and job.ready_at <= end:
                job.phase = JobPhase.RUNNING.value
            if job.phase != JobPhase.RUNNING.value:
                continue
            assert job.config is not None and job.batch is not None
            run_from = max(self.time, job.ready_at)
            step, _ = step_time(job.config, job.batch.local_bsz)
            rate = job.batch.batch_size / (step * (job.batch.accum_steps + 1))
            job.done_work += max(end - run_from, 0.0) * rate
            if job.done_work >= job.work:
                job.phase = JobPhase.DONE.value
                job.finish_time = end
                job.completions += 1
                job.config, job.placement, job.batch = None, (), None
        self.time = end
        self._save()

    # -- ClusterBackend ---------------------------------------------------------------------

    def snapshots_begun(self) -> int:
        """How many slow snapshots have begun, in any process (file-backed state only)."""
        path = self._sibling("snapshots")
        return len(path.read_text().splitlines()) if path.exists() else 0

    def let_snapshots_end(self, count: int) -> None:
        """Let the first ``count`` slow snapshots end now (those begun and those to come)."""
        write_json_atomic(self._sibling("proceed"), {"count": count})

    def _slow_snapshot(self) -> None:
        """Take up to ``slow_snapshot_s``; with a file-backed state, record that this snapshot
        (number n, counted over all processes) began, and end it as soon as the test lets the
        first n end."""
        deadline = time.monotonic() + self.slow_snapshot_s
        if self.path is None:
            time.sleep(self.slow_snapshot_s)
            return
        with self._sibling("snapshots").open("a") as begun:
            begun.write(f"{os.getpid()}\n")
        number = self.snapshots_begun()
        while time.monotonic() < deadline and self._snapshots_let_end() < number:
            time.sleep(0.01)

    def _snapshots_let_end(self) -> int:
        path = self._sibling("proceed")
        return int(json.loads(path.read_text())["count"]) if path.exists() else 0

    def _sibling(self, suffix: str) -> Path:
        assert self.path is not None
        return self.path.with_name(f"{self.path.name}.{suffix}")

    def snapshot(self) -> ClusterSnapshot:
        self._load()
        if self.slow_snapshot_s:
            self._slow_snapshot()
        jobs, reports = [], []
        for job in self.jobs.values():
            phase = JobPhase(job.phase)
            holds = phase.holds_gpus
            jobs.append(
                JobSnapshot(
                    job.spec,
                    phase,
                    config=job.config if holds else None,
                    placement=job.placement if holds else (),
                    batch=job.batch if holds else None,
                    restarts=job.restarts,
                    finish_time=job.finish_time,
                    slurm_job_id=job.slurm_job_id,
                    user=job.user,
                    account=job.account,
                )
            )
            if phase is JobPhase.RUNNING:
                reports.append(self._report(job))
        return ClusterSnapshot(self.time, self.nodes, tuple(jobs), tuple(reports))

    def _report(self, job: FakeJob) -> MetricsReport:
        assert job.config is not None and job.batch is not None
        step, sync = step_time(job.config, job.batch.local_bsz)
        return MetricsReport(
            job.spec.sia_id, self.time, job.config.gpu_type, job.config.nodes, job.config.gpus,
            job.batch.local_bsz, job.batch.accum_steps, step, sync, 1.0, 4.0,
            steps=int(job.done_work / job.batch.batch_size),  # at the pace its step time says
        )  # fmt: skip

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        self._load()
        self.apply_calls += 1
        results = []
        for count, action in enumerate(actions):
            if self.crash_after is not None and count >= self.crash_after:
                self._crash()
            if self.raise_after is not None and count >= self.raise_after:
                raise RuntimeError(f"injected failure after {count} action(s)")
            if action.sia_id in self.poison:
                raise RuntimeError(f"injected failure at {action.sia_id}")
            ok, message = self._apply_one(action)
            results.append(ActionResult(action, ok, message))
            self._save()
        if self.crash_after is not None:
            self._crash()  # after applying everything, before the journal marks it
        return results

    def _crash(self) -> None:
        if self.crash_in_process:
            raise Crash(f"crash after {self.apply_calls} apply call(s)")
        os._exit(CRASH_EXIT)

    def _apply_one(self, action: Action) -> tuple[bool, str]:
        job = self.jobs.get(action.sia_id)
        if job is None or JobPhase(job.phase).finished:
            return False, "no such live job"
        holds = JobPhase(job.phase).holds_gpus
        if isinstance(action, Stop):
            if not holds:
                return True, "already stopped"
            job.phase, job.config, job.placement, job.batch = JobPhase.PENDING.value, None, (), None
            self.applied.append(("stop", job.spec.sia_id))
            return True, "stopped"
        if isinstance(action, Rebatch):
            if not holds:
                return False, "not running"
            job.batch = action.batch
            return True, "rebatched"
        assert isinstance(action, Start | Move)
        if holds and job.config == action.config and _same(job.placement, action.placement):
            job.batch = action.batch
            return True, "already there"
        if holds and isinstance(action, Start):
            return False, "holds other GPUs; a start applies to a pending job"
        if not self._fits(action.placement, ignore=job.spec.sia_id):
            return False, "not enough free GPUs on the nodes"
        if job.launches:
            job.restarts += 1
        job.launches += 1
        job.phase = JobPhase.STARTING.value
        job.ready_at = self.time + self.restart_delay
        job.config, job.placement, job.batch = action.config, action.placement, action.batch
        self.applied.append((type(action).__name__.lower(), job.spec.sia_id))
        return True, "launched"

    def _fits(self, placement: tuple[NodeShare, ...], ignore: str) -> bool:
        used = {node.name: 0 for node in self.nodes}
        for job in self.jobs.values():
            if job.spec.sia_id != ignore and JobPhase(job.phase).holds_gpus:
                for share in job.placement:
                    used[share.node] += share.gpus
        usable = {node.name: node.usable_gpus for node in self.nodes}
        for share in placement:
            if share.node not in usable:
                return False
            used[share.node] += share.gpus
        return all(used[name] <= usable[name] for name in used)

    # -- persistence --------------------------------------------------------------------------

    def _save(self) -> None:
        if self.path is None:
            return
        write_json_atomic(
            self.path,
            {
                "time": self.time,
                "next_id": self.next_id,
                "applied": self.applied,
                "apply_calls": self.apply_calls,
                "jobs": {sia_id: _job_json(job) for sia_id, job in self.jobs.items()},
            },
        )

    def _load(self) -> None:
        if self.path is None or not self.path.exists():
            return
        data = json.loads(self.path.read_text())
        self.time = data["time"]
        self.next_id = data["next_id"]
        self.applied = [tuple(item) for item in data["applied"]]  # type: ignore[misc]
        self.apply_calls = data["apply_calls"]
        self.jobs = {sia_id: _job_from_json(item) for sia_id, item in data["jobs"].items()}


def _same(a: tuple[NodeShare, ...], b: tuple[NodeShare, ...]) -> bool:
    return sorted((s.node, s.gpus) for s in a) == sorted((s.node, s.gpus) for s in b)


def _job_json(job: FakeJob) -> dict[str, Any]:
    config = job.config
    return {
        "spec": to_json(job.spec),
        "work": job.work,
        "phase": job.phase,
        "config": None if config is None else [config.gpu_type, config.nodes, config.gpus],
        "placement": [[s.node, s.gpus] for s in job.placement],
        "batch": None
        if job.batch is None
        else [job.batch.batch_size, job.batch.local_bsz, job.batch.accum_steps],
        "restarts": job.restarts,
        "launches": job.launches,
        "completions": job.completions,
        "done_work": job.done_work,
        "ready_at": job.ready_at,
        "finish_time": job.finish_time,
        "slurm_job_id": job.slurm_job_id,
        "user": job.user,
        "account": job.account,
    }


def _job_from_json(item: dict[str, Any]) -> FakeJob:
    return FakeJob(
        spec=from_json(JobSpec, item["spec"], "fake cluster"),
        work=item["work"],
        phase=item["phase"],
        config=None if item["config"] is None else Configuration(*item["config"]),
        placement=tuple(NodeShare(node, gpus) for node, gpus in item["placement"]),
        batch=None if item["batch"] is None else BatchChoice(*item["batch"]),
        restarts=item["restarts"],
        launches=item["launches"],
        completions=item["completions"],
        done_work=item["done_work"],
        ready_at=item["ready_at"],
        finish_time=item["finish_time"],
        slurm_job_id=item["slurm_job_id"],
        user=item.get("user", ""),
        account=item.get("account", ""),
    )


CONFIG_TEMPLATE = """\
round_seconds: {round_seconds}
state_dir: {state_dir}
dry_run: {dry_run}
gpu_types:
  a100: {{profile: dgx}}
  t4: {{profile: t4}}
partitions:
  a100: {{gpu_type: a100, gpus_per_node: 4}}
  t4: {{gpu_type: t4, gpus_per_node: 4}}
policy:
  name: {policy}
"""


def write_config(
    directory: Path,
    *,
    policy: str = "sia",
    dry_run: bool = False,
    round_seconds: float = 60,
    state_dir: str = "state",
) -> Path:
    """A controller config for the fake cluster's two GPU types; state under ``directory``."""
    path = directory / "sia.yaml"
    path.write_text(
        CONFIG_TEMPLATE.format(
            round_seconds=round_seconds,
            state_dir=state_dir,
            dry_run=str(dry_run).lower(),
            policy=policy,
        )
    )
    return path
