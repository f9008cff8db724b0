"""``SlurmBackend``: the cluster interface on a real Slurm, through its command-line tools.

``snapshot()`` issues three commands whatever the cluster size (``scontrol -o show node``,
``scontrol -o show reservation``, ``squeue --json``) and reads the job files under
``state_dir``; ``apply(actions)`` carries out the controller's actions with ``scontrol``,
``scancel`` and ``sbatch`` (:mod:`sia_slurm.slurm.actuate`). Everything Slurm-specific that
was verified on the real daemons is in ``docs/slurm-actuation.md``.

A failed observation raises :class:`~sia_slurm.slurm.runner.CommandError` (the round cannot
be decided without it); a bad job file never does: it is skipped and reported in
``ClusterSnapshot.rejected``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.cluster import (
    Action,
    ActionResult,
    BatchChoice,
    ClusterSnapshot,
    JobPhase,
    JobSnapshot,
)
from sia_slurm.config import SiaConfig
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare, NodeView
from sia_slurm.protocol import Assignment, JobSpec, ProtocolError, StatePaths, StopRequest
from sia_slurm.slurm import commands
from sia_slurm.slurm.actuate import Actuator
from sia_slurm.slurm.clock import Clock, WallClock
from sia_slurm.slurm.inventory import NodeInfo, parse_nodes
from sia_slurm.slurm.jobfiles import DocumentCache, MetricsSpool, SlurmRecord
from sia_slurm.slurm.jsonparse import SlurmJob, parse_reservations, parse_squeue_json
from sia_slurm.slurm.managed import (
    ManagedJob,
    allocation_of,
    group_managed,
    job_phase,
    resolve,
)
from sia_slurm.slurm.runner import CommandRunner, SubprocessRunner

logger = logging.getLogger(__name__)


# A released job Slurm has not started after this many rounds is pending again.
RELEASE_GRACE_ROUNDS = 3


@dataclass(frozen=True)
class JobsView:
    """All Slurm jobs of one ``squeue``, split into managed (by sia id) and the rest."""

    jobs: tuple[SlurmJob, ...]
    managed: Mapping[str, ManagedJob]
    problems: tuple[str, ...] = ()

    @property
    def strays(self) -> list[SlurmJob]:
        return [stray for job in self.managed.values() for stray in job.strays]


class SlurmBackend:
    """:class:`~sia_slurm.cluster.ClusterBackend` for Slurm (22.05 and later)."""

    def __init__(
        self,
        config: SiaConfig,
        runner: CommandRunner,
        clock: Clock | None = None,
        *,
        resubmit_shrinks: bool = False,
    ) -> None:
        """``resubmit_shrinks``: shrink a job's node count by resubmitting it rather than by
        ``scontrol update`` (which works on 22.05 with ``NumCPUs``; the resubmission is the
        fallback for a job Slurm left in BadConstraints)."""
        self.config = config
        self.runner = runner
        self.clock = clock or WallClock()
        self.paths = StatePaths(config.state_dir)
        self.partition_types = {p.name: p.gpu_type for p in config.partitions}
        self.documents = DocumentCache()
        gpu_types = tuple(dict.fromkeys(p.gpu_type for p in config.partitions))
        self.spool = MetricsSpool(self.paths, gpu_types)
        self._reported: set[str] = set()  # job-file problems already reported once
        self.actuator = Actuator(
            config=config,
            runner=runner,
            clock=self.clock,
            paths=self.paths,
            documents=self.documents,
            observe=self.observe_jobs,
            resubmit_shrinks=resubmit_shrinks,
        )

    # ------------------------------------------------------------------------------------------
    # Observe

    def observe_jobs(self) -> JobsView:
        """One ``squeue --json``: every job Slurm knows, managed ones resolved per sia id."""
        result = parse_squeue_json(self.runner.run(list(commands.SQUEUE_JSON)).stdout)
        return build_view(self, result.jobs, list(result.problems))

    def snapshot(self) -> ClusterSnapshot:
        now = self.clock.now()
        nodes = parse_nodes(self.runner.run(list(commands.SHOW_NODES)).stdout)
        reservations = parse_reservations(self.runner.run(list(commands.SHOW_RESERVATIONS)).stdout)
        view = self.observe_jobs()
        rejected: list[str] = []
        specs = self._specs(view.managed, rejected)
        scan = self.spool.scan(specs)
        rejected += scan.rejected
        jobs: list[JobSnapshot] = []
        current_ids: set[str] = set()
        for sia_id, spec in specs.items():
            managed = view.managed[sia_id]
            snapshot = self._job_snapshot(managed, spec, scan.latest.get(sia_id), rejected)
            if snapshot is not None:
                jobs.append(snapshot)
                current_ids.add(managed.current.job_id)
        reserved = {node for r in reservations if r.active for node in r.nodes}
        unmanaged = [job for job in view.jobs if job.job_id not in current_ids]
        return ClusterSnapshot(
            time=now,
            nodes=self._node_views(nodes, reserved, unmanaged),
            jobs=tuple(jobs),
            reports=tuple(scan.reports),
            rejected=tuple(self._once(rejected)),
        )

    def _specs(self, managed: Mapping[str, ManagedJob], rejected: list[str]) -> dict[str, JobSpec]:
        specs = {}
        for sia_id, job in managed.items():
            path = self.paths.spec(sia_id)
            if job.current.finished and not path.exists():
                continue  # an old job whose files were cleaned up: nothing to say
            try:
                spec = self.documents.read(JobSpec, path)
            except ProtocolError as exc:
                rejected.append(f"job {sia_id}: not scheduled: {exc}")
                continue
            if spec is None:
                rejected.append(f"job {sia_id}: not scheduled: {path} does not exist")
            elif spec.sia_id != sia_id:
                rejected.append(f"job {sia_id}: not scheduled: {path}: sia_id is {spec.sia_id!r}")
            else:
                specs[sia_id] = spec
        return specs

    def _released_to(self, job: SlurmJob, assignment: Assignment | None, phase: JobPhase) -> bool:
        """Whether a pending job was just released onto its assignment's nodes.

        Slurm starts a released job a few seconds later; until then it reads PENDING. Reporting
        it as STARTING (on its assigned nodes) keeps the controller from deciding it afresh
        every round. An assignment older than ``RELEASE_GRACE_ROUNDS`` rounds no longer counts:
        a job Slurm has not started by then is pending again, and the controller re-decides.
        """
        if phase is not JobPhase.PENDING or job.state != "PENDING" or job.held:
            return False
        if assignment is None or len(assignment.node_list) != assignment.nodes:
            return False
        if self.paths.stop_request(assignment.sia_id).exists():
            return False
        try:
            written = self.paths.assignment(assignment.sia_id).stat().st_mtime
        except OSError:
            return False
        age = time.time() - written
        return age < RELEASE_GRACE_ROUNDS * self.config.round_seconds

    def _job_snapshot(
        self,
        managed: ManagedJob,
        spec: JobSpec,
        latest_report: float | None,
        rejected: list[str],
    ) -> JobSnapshot | None:
        job = managed.current
        sia_id = managed.sia_id
        try:
            assignment = self.documents.read(Assignment, self.paths.assignment(sia_id))
        except ProtocolError as exc:
            rejected.append(f"job {sia_id}: assignment ignored: {exc}")
            assignment = None
        stop_path = self.paths.stop_request(sia_id)
        try:
            stop = self.documents.read(StopRequest, stop_path)
        except ProtocolError as exc:
            rejected.append(f"job {sia_id}: stop request ignored: {exc}")
            stop = None
        phase, message = job_phase(
            job,
            has_assignment=assignment is not None,
            stop_requested=stop_path.exists(),
            # The ack answers the stop request's round (not the assignment's, which is older).
            acked=stop is not None and self.paths.ack(sia_id, stop.round_index).exists(),
            latest_report=latest_report,
        )
        batch = _batch_of(assignment) if assignment is not None else None
        config, placement = None, ()
        if self._released_to(job, assignment, phase):
            assert assignment is not None
            per_node = assignment.gpus_per_node
            config = Configuration(assignment.gpu_type, assignment.nodes, assignment.gpus)
            placement = tuple(NodeShare(node, per_node) for node in assignment.node_list)
            phase, message = JobPhase.STARTING, "released with its assignment; Slurm starting it"
        elif phase.holds_gpus:
            allocation = allocation_of(job, self.partition_types)
            if allocation is None:
                rejected.append(
                    f"job {sia_id}: not scheduled: Slurm job {job.job_id} runs in partition "
                    f"{job.partition!r}, which maps to no configured GPU type; its GPUs count "
                    "as unmanaged"
                )
                return None
            config, placement = allocation
        return JobSnapshot(
            spec=spec,
            phase=phase,
            config=config,
            placement=placement,
            batch=batch,
            restarts=managed.restarts,
            finish_time=job.end_time if phase.finished else None,
            slurm_job_id=job.job_id,
            message=message,
        )

    def _node_views(
        self, nodes: tuple[NodeInfo, ...], reserved: set[str], unmanaged: list[SlurmJob]
    ) -> tuple[NodeView, ...]:
        """Nodes of configured partitions; usable GPUs net of state, reservations and the
        GPUs held by jobs that are not current managed jobs."""
        taken: dict[str, int] = {}
        for job in unmanaged:
            for node in job.nodes:
                taken[node] = taken.get(node, 0) + job.gpus_on(node)
        views = []
        for node in nodes:
            gpu_type = next(
                (self.partition_types[p] for p in node.partitions if p in self.partition_types),
                None,
            )
            if gpu_type is None:
                continue
            total = node.gpus(gpu_type) or node.gpus()
            if total < 1:
                continue
            usable = 0
            if node.usable and node.name not in reserved:
                usable = max(0, total - taken.get(node.name, 0))
            views.append(NodeView(node.name, gpu_type, total, usable))
        return tuple(views)

    def _once(self, messages: list[str]) -> list[str]:
        """Messages not reported in an earlier round (a bad file stays bad for a while)."""
        fresh = [m for m in dict.fromkeys(messages) if m not in self._reported]
        for message in fresh:
            logger.warning("%s", message)
        self._reported = set(messages) | (self._reported & set(messages))
        return fresh

    # ------------------------------------------------------------------------------------------
    # Actuate

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        """Carry out ``actions`` (each idempotent; see :mod:`sia_slurm.slurm.actuate`)."""
        return self.actuator.apply(actions)


def build_view(backend: SlurmBackend, jobs: tuple[SlurmJob, ...], problems: list[str]) -> JobsView:
    """Split ``jobs`` into managed (resolved per sia id, see :mod:`managed`) and the rest."""
    for problem in problems:
        logger.warning("%s", problem)
    managed = {}
    for sia_id, group in group_managed(jobs, backend.config.managed_marker).items():
        record = None
        try:
            record = SlurmRecord.read(backend.paths.job_dir(sia_id) / "slurm.json")
        except ProtocolError as exc:
            problems.append(str(exc))
        job = resolve(sia_id, group, record)
        if job is not None:
            managed[sia_id] = job
    return JobsView(jobs, managed, tuple(problems))


def build_backend(
    config: SiaConfig, runner: CommandRunner | None = None, clock: Clock | None = None
) -> SlurmBackend:
    """The backend the config names (``slurm.backend``), with Slurm's commands found in
    ``slurm.bin_dir`` (or on PATH). pyslurm is imported only when chosen."""
    if runner is None:
        bin_dir = Path(config.slurm.bin_dir) if config.slurm.bin_dir else None
        runner = SubprocessRunner(bin_dir=bin_dir)
    if config.slurm.backend == "pyslurm":
        from sia_slurm.slurm.pyslurm_backend import PyslurmBackend

        return PyslurmBackend(config, runner, clock)
    return SlurmBackend(config, runner, clock)


def _batch_of(assignment: Assignment) -> BatchChoice:
    return BatchChoice(assignment.batch_size, assignment.local_bsz, assignment.accum_steps)
