"""The controller's memory of each managed job: its goodput model and what it has run on.

A job's :class:`JobRecord` lives as long as the job: it is created the first round the job is
seen (from its :class:`~sia_slurm.protocol.JobSpec`), fed every metrics report, and dropped
when the job finishes. Nothing here talks to a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sia_slurm.cluster import JobSnapshot
from sia_slurm.controller.reports import Pace, clamped_stats, mismatch
from sia_slurm.core import Configuration, JobKind
from sia_slurm.model import JobGoodputEstimator
from sia_slurm.policy.base import JobView, NodeShare
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.protocol.observation import Observation
from sia_slurm.protocol.profile import AppProfile, ProfileSet
from sia_slurm.protocol.profile_json import PROFILE_FILE, profile_from_json


class UnknownAppError(ValueError):
    """A job names an app (or profile directory) the controller has no profile for."""


@dataclass
class EstimatorFactory:
    """Builds a job's :class:`JobGoodputEstimator` from its spec and the site's profiles.

    ``type_aliases`` maps the site's GPU type names (partitions, cluster files) to the profile
    type names (``{"a100": "dgx"}``). A job that brought its own profile (``--profile DIR``)
    is built from its profile document, never from the directory (:meth:`_profile`).
    """

    profiles: ProfileSet
    type_aliases: Mapping[str, str] = field(default_factory=dict)

    def __call__(
        self, spec: JobSpec, profile_document: Mapping[str, Any] | None = None
    ) -> JobGoodputEstimator:
        profile = self._profile(spec, profile_document)
        fixed = spec.kind in (JobKind.STRONG_SCALING, JobKind.RIGID, JobKind.PINNED)
        fixed_batch = (spec.init_batch_size or profile.init_batch_size) if fixed else None
        return JobGoodputEstimator.from_profile(
            profile,
            init_batch_size=spec.init_batch_size or None,
            max_batch_size=spec.max_batch_size or None,
            # The batch of fixed-batch evaluations (Gavel, FIFO, rigid kinds): what was asked.
            fixed_batch_size=spec.requested_batch_size or fixed_batch,
            type_aliases=self.type_aliases,
        )

    def _profile(self, spec: JobSpec, document: Mapping[str, Any] | None) -> AppProfile:
        """The job's own profile from its document, else the shipped profile it names.

        A ``profile`` that is a path is never read: the directory is the user's, who could
        swap in a FIFO or a symlink to another user's file (issue 35). ``sia-sbatch`` copied
        it into the job's directory as ``profile.json``, which the backend read through the
        user-file door; here every value of it is checked."""
        if document is not None:
            where = f"job {spec.sia_id}: {PROFILE_FILE}"
            try:
                return profile_from_json(document, where, self.profiles.gpu_types)
            except ValueError as exc:
                raise UnknownAppError(str(exc)) from None
        if spec.profile and "/" in spec.profile:
            raise UnknownAppError(
                f"job {spec.sia_id}: profile {spec.profile}: a directory of its own, but the "
                f"job's {PROFILE_FILE} (written by sia-sbatch) is missing; submit it again"
            )
        name = spec.profile or spec.app
        try:
            return self.profiles.app(name)
        except (KeyError, ValueError) as exc:
            raise UnknownAppError(f"job {spec.sia_id}: app: {exc}") from None


@dataclass
class JobRecord:
    """What the controller remembers about one job between rounds."""

    spec: JobSpec
    estimator: JobGoodputEstimator
    # The job's own profile document its model was built from (None: a shipped profile), kept
    # so that a restarted controller rebuilds the same model
    # (sia_slurm/service/controller_memory.py).
    profile_document: Mapping[str, Any] | None = None
    max_gpus_seen: int = 0
    reports: int = 0
    last_report_time: float = float("-inf")
    # The first report taken on the job's current shape, on the controller's clock: what the
    # steps its later reports claim are checked against (controller/reports.py). Kept in the
    # state database with ``distrusted`` (sia_slurm/service/controller_memory.py), for cron's
    # --once.
    pace: Pace | None = None
    # Why its last report was not believed, when it described another configuration than the
    # job runs or claimed a pace its steps do not show: until a report is believed again the
    # job is held at its minimum (a lie never earns GPUs; a report refused for a batch the
    # job is still changing to does not count). "" when its reports are believed.
    distrusted: str = ""
    # While the job profiles (docs/profiling.md): the key of its profiling, and the site GPU
    # types it may run on (one GPU of a type not measured yet); None once it has a profile.
    profiling: tuple[str, str] | None = None
    profile_types: frozenset[str] | None = None
    profile_left: frozenset[str] = frozenset()  # site GPU types not measured yet
    # The restarts its profiling took (one per GPU type): not charged by Sia's restart factor
    # afterwards, as they are not while it profiles
    profiling_restarts: int = 0
    # The restarts this controller asked for after its profiling (each move, each stop: a stop
    # restarts the job when it is started again): the others the cluster made on its own (a
    # node failure, a preemption), which Sia need not charge (JobView.requeues). Counted when
    # decided, so an action Slurm then refused counts too: the count errs towards charging.
    chosen_restarts: int = 0

    def view(
        self,
        *,
        now: float,
        restarts: int,
        current: Configuration | None,
        placement: tuple[NodeShare, ...],
        restoring: bool,
    ) -> JobView:
        """The policies' view of the job at ``now``: its spec and model, with what it holds.

        The round takes ``restarts``, ``current`` and ``placement`` from the cluster's snapshot;
        ``sia-slurm explain`` from the snapshot or, offline, from the state database.
        """
        spec = self.spec
        if self.profiling is not None:
            # A profiling run writes its measurement before its first metrics report, so the
            # snapshot says it is mid-restore; but once its type is measured there is nothing
            # to keep it for: it moves to the next type this round (kept as restoring, it was
            # stopped, and started only a round later).
            allowed = self.profile_types
            restoring = restoring and (
                current is None or allowed is None or current.gpu_type in allowed
            )
            return JobView(
                job_id=spec.sia_id,
                kind=spec.kind,
                estimator=self.estimator,
                age=max(now - spec.submit_time, 0.0),
                submit_time=spec.submit_time,
                restarts=restarts,
                # Not discounted by the restart factor: going from type to type is what
                # profiling is, not a move the policy chose (Sia would hold it instead).
                restart_cost=0.0,
                current=current,
                placement=placement,
                min_gpus=1,
                max_gpus=1,
                max_gpus_seen=max(self.max_gpus_seen, 1),
                requested_gpus=1,
                restoring=restoring,
                gpu_types=self.profile_types,
                profiling=True,
            )
        return JobView(
            job_id=spec.sia_id,
            kind=spec.kind,
            estimator=self.estimator,
            age=max(now - spec.submit_time, 0.0),
            submit_time=spec.submit_time,
            restarts=max(restarts - self.profiling_restarts, 0),
            requeues=max(restarts - self.profiling_restarts - self.chosen_restarts, 0),
            restart_cost=spec.restart_cost,
            current=current,
            placement=placement,
            min_gpus=spec.min_gpus,
            max_gpus=spec.min_gpus if self.distrusted else spec.max_gpus,
            max_gpus_seen=self.max_gpus_seen,
            requested_gpus=spec.requested_gpus,
            requested_gpu_type=spec.requested_gpu_type,
            restoring=restoring,
        )

    def believe(self, report: MetricsReport, job: JobSnapshot, now: float) -> str:
        """Why ``report`` is not believed (``""`` if it is): it does not describe what ``job``
        runs, or it claims a pace its steps do not show on the controller's clock ``now``."""
        why, lie = mismatch(report, job)
        if not why:
            shape = Pace.shape_of(report)
            if self.pace is None or self.pace.shape != shape:
                self.pace = Pace(shape, now, report.steps)
            why = lie = self.pace.implausible(report, now)
        if lie:
            self.distrusted = lie
        elif not why:
            self.distrusted = ""
        return why

    def ingest(self, report: MetricsReport) -> None:
        """Feed one metrics report to the job's goodput model (throughput and statistics, the
        latter clamped: :func:`~sia_slurm.controller.reports.clamped_stats`)."""
        observation = Observation(
            nodes=report.nodes,
            gpus=report.gpus,
            local_bsz=report.local_bsz,
            step_time=report.step_time,
            sync_time=report.sync_time,
            accum_steps=report.accum_steps,
        )
        self.estimator.observe(report.gpu_type, observation)
        limits = self.estimator.limits
        stats = clamped_stats(report, limits.init_batch_size, limits.max_batch_size)
        self.estimator.update_grad_stats(stats)
        self.reports += 1
        self.last_report_time = report.time
