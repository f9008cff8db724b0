"""The simulated cluster: a :class:`~sia_slurm.cluster.ClusterBackend` driven by ground truth.

The simulator runs the production controller round unchanged against this backend, so what is
simulated is exactly what would run on Slurm; only the cluster is replayed from traces.

* **Clock.** :attr:`SimulatedCluster.time` (seconds since the workload started) moves only in
  :meth:`SimulatedCluster.advance`. A snapshot at time ``t`` shows every job submitted at or
  before ``t``.
* **Nodes.** ``nodes`` nodes of ``gpus_per_node`` GPUs per GPU type of the
  :class:`~sia_slurm.sim.clusterfile.ClusterSpec`, named ``<type>-<i>``; all usable.
* **Jobs** are :class:`SimJobSpec`\\ s (a :class:`~sia_slurm.protocol.JobSpec` and its app's
  :class:`~sia_slurm.sim.apptruth.AppTruth`). A job progresses in M0-equivalent samples at the
  rate of :mod:`sia_slurm.sim.progress` (measured step times of its configuration and per-GPU
  batch, true statistical efficiency at its progress, calibration) and is done at its app's
  completion target; it finishes at the exact second it gets there, inside a round.
* **Restarts.** Every grant of GPUs (``Start``, ``Move``) costs the app's *true* restart delay
  (:data:`sia_slurm.sim.restart.RESTART_DELAYS`) or, for a cluster file with a ``restart``
  section, the cluster's own ``start_s`` / ``move_s``; meanwhile the job holds its GPUs, makes no
  progress and shows phase ``STARTING``; the first start pays it too (the job loads its data and
  model). ``Stop`` releases the GPUs at once (the checkpoint cost is part of the next start's
  delay). ``Rebatch`` changes the batch with no delay. ``restarts`` counts grants after the
  first.
* **Reports.** Every job that trained during the last interval reports, in the next snapshot, a
  :class:`~sia_slurm.protocol.MetricsReport` with the measured step and sync time of its
  configuration and per-GPU batch and the true gradient statistics at its progress, so the
  controller's models learn online as in production.
* **Profiling.** A ``Start``/``Move`` with a ``profile_sweep`` (Sia's profiling of a new
  model) runs, after its restart delay, the sweep on its one GPU, then writes the job's profile
  document, shown as ``profiled_document`` from the next snapshot on, and trains on at its
  batch (:mod:`sia_slurm.sim.sweep`). The grant's delay and sweep count as profiling GPU time.
* **Accounting.** GPU-seconds are counted while a job holds GPUs (restart delays included), up
  to its completion; the snapshot after a job completes shows it ``DONE`` once, then it is gone.

Actions are validated (known job, right phase, existing nodes of the configuration's type, free
GPUs, consistent batch); a refused action returns ``ok=False`` and leaves the job as it was. All
``Move``\\ s release their old GPUs before any GPUs are granted, as all moving jobs checkpoint
before any restarts, so a swap of two jobs' nodes succeeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np

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
from sia_slurm.core import Configuration, NodeShare, NodeView
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.sim.apptruth import AppTruth
from sia_slurm.sim.artifact_metrics import JobOutcome
from sia_slurm.sim.clusterfile import ClusterSpec
from sia_slurm.sim.progress import DEFAULT_MAX_SUBSTEP, StatsTable, Stepped, integrate
from sia_slurm.sim.requested_shape import requested_shape_reports
from sia_slurm.sim.sweep import DEFAULT_NOISE, ProfiledTypes, SweepPlan, noise_key, plan_sweep


@dataclass(frozen=True)
class SimJobSpec:
    """A job to simulate: what it asks the scheduler for, and what is true about its app."""

    spec: JobSpec
    truth: AppTruth
    user: str = ""
    account: str = ""


@dataclass
class _Job:
    """A simulated job's mutable state (never leaves this module)."""

    spec: JobSpec
    truth: AppTruth
    user: str = ""
    account: str = ""
    phase: JobPhase = JobPhase.PENDING
    config: Configuration | None = None
    placement: tuple[NodeShare, ...] = ()
    batch: BatchChoice | None = None
    grants: int = 0  # Start/Move actions that gave it GPUs
    delay_left: float = 0.0  # restart delay still to serve (phase STARTING)
    progress: float = 0.0  # M0-equivalent samples
    steps: float = 0.0  # optimizer steps
    finish_time: float | None = None
    gpu_seconds: float = 0.0
    contention_sum: float = 0.0  # active jobs summed over the snapshots it was active in
    contention_rounds: int = 0
    admitted: bool = False  # submitted (the clock passed its submission time)
    trained: bool = False  # trained since the last snapshot (reports then)
    reported_done: bool = False
    # Truth at the current configuration and batch (set by _set_speed).
    step_time: float = 0.0
    sync_time: float = 0.0
    iter_time: float = 0.0
    base_rate: float = 0.0
    scale: float = 1.0
    curve: int = 0
    # Sia's profiling (sia_slurm/sim/sweep.py): the sweep of the current grant still to run,
    # the types measured so far and the document written, GPU-seconds spent on profiling
    # grants' restarts and sweeps, and sweeps completed.
    sweep: SweepPlan | None = None
    profiled: ProfiledTypes = field(default_factory=ProfiledTypes)
    profiled_document: dict[str, Any] | None = None
    profiling_gpu_seconds: float = 0.0
    sweeps: int = 0
    cached: JobSnapshot | None = field(default=None, repr=False)

    @property
    def restarts(self) -> int:
        return max(self.grants - 1, 0)


class SimulatedCluster:
    """A :class:`~sia_slurm.cluster.ClusterBackend` replaying ground truth on a simulated clock."""

    def __init__(
        self,
        cluster: ClusterSpec,
        jobs: Sequence[SimJobSpec],
        *,
        start_time: float = 0.0,
        max_substep: float = DEFAULT_MAX_SUBSTEP,
        profile_requested: bool = False,
        profile_noise: float = DEFAULT_NOISE,
        seed: int = 0,
    ) -> None:
        names = [job.spec.sia_id for job in jobs]
        if len(set(names)) != len(names):
            raise ValueError("simulated jobs need unique ids")
        submits = [job.spec.submit_time for job in jobs]
        if any(b < a for a, b in pairwise(submits)):
            raise ValueError("simulated jobs must be given in order of submission time")
        self.cluster = cluster
        self.time = float(start_time)
        self.max_substep = max_substep
        # Each arriving job also reports a measured step at its requested size on every type
        # (sia_slurm/sim/requested_shape.py: what Gavel assumes is profiled).
        self.profile_requested = profile_requested
        self._profiles: list[MetricsReport] = []
        # A profiling run's reported step times carry this much lognormal noise, seeded.
        self.profile_noise = profile_noise
        self.seed = seed
        self._profile_type = {t.name: t.profile for t in cluster.gpu_types}
        self.nodes = tuple(
            NodeView(f"{t.name}-{i}", t.name, t.gpus_per_node, t.gpus_per_node)
            for t in cluster.gpu_types
            for i in range(t.nodes)
        )
        self._node_type = {node.name: node.gpu_type for node in self.nodes}
        self._free = {node.name: node.total_gpus for node in self.nodes}
        self._jobs = [_Job(job.spec, job.truth, job.user, job.account) for job in jobs]
        self._by_id = {job.spec.sia_id: job for job in self._jobs}
        self._arrived = 0  # jobs [0, _arrived) have been submitted
        self._active: list[_Job] = []  # submitted, not yet shown DONE
        truths = {job.truth.app: job.truth for job in jobs}
        self._table = StatsTable.build({app: t.stats for app, t in truths.items()})

    # --------------------------------------------------------------------------------------
    # Observing

    def snapshot(self) -> ClusterSnapshot:
        """Nodes, submitted jobs (finished ones once, as DONE) and the reports since last time."""
        self._admit()
        live = [job for job in self._active if not job.phase.finished]
        for job in live:
            job.contention_sum += len(live)
            job.contention_rounds += 1
        reports = (*self._profiles, *self._reports([job for job in live if job.trained]))
        self._profiles = []
        for job in live:
            job.trained = False
        views = tuple(self._job_snapshot(job) for job in self._active)
        for job in self._active:
            if job.phase.finished:
                job.reported_done = True
        self._active = [job for job in self._active if not job.reported_done]
        return ClusterSnapshot(time=self.time, nodes=self.nodes, jobs=views, reports=reports)

    def _admit(self) -> None:
        while (
            self._arrived < len(self._jobs)
            and self._jobs[self._arrived].spec.submit_time <= self.time
        ):
            job = self._jobs[self._arrived]
            job.admitted = True
            self._active.append(job)
            if self.profile_requested:
                self._profiles.extend(
                    requested_shape_reports(job.spec, job.truth, self.cluster, self.time)
                )
            self._arrived += 1

    def _job_snapshot(self, job: _Job) -> JobSnapshot:
        if job.cached is None:
            job.cached = JobSnapshot(
                spec=job.spec,
                phase=job.phase,
                config=job.config,
                placement=job.placement,
                batch=job.batch,
                restarts=job.restarts,
                finish_time=job.finish_time,
                user=job.user,
                account=job.account,
                profiled_document=job.profiled_document,
            )
        return job.cached

    def _reports(self, jobs: list[_Job]) -> tuple[MetricsReport, ...]:
        """What each job that trained since the last snapshot measured (one stats lookup)."""
        if not jobs:
            return ()
        curves = np.array([job.curve for job in jobs], dtype=np.int64)
        grad_sqr, grad_var = self._table.at(curves, np.array([job.progress for job in jobs]))
        reports = []
        for job, sqr, var in zip(jobs, grad_sqr.tolist(), grad_var.tolist(), strict=True):
            assert job.config is not None and job.batch is not None
            app_m0 = job.truth.init_batch_size
            job_m0 = job.spec.init_batch_size or app_m0
            reports.append(
                MetricsReport(
                    sia_id=job.spec.sia_id,
                    time=self.time,
                    gpu_type=job.config.gpu_type,
                    nodes=job.config.nodes,
                    gpus=job.config.gpus,
                    local_bsz=job.batch.local_bsz,
                    accum_steps=job.batch.accum_steps,
                    step_time=job.step_time,
                    sync_time=job.sync_time,
                    grad_sqr=sqr,
                    grad_var=var * app_m0 / job_m0,  # the variance of a job-M0 batch's mean
                    steps=int(job.steps),
                )
            )
        return tuple(reports)

    # --------------------------------------------------------------------------------------
    # Acting

    def apply(self, actions: Sequence[Action]) -> list[ActionResult]:
        """Apply the round's actions: stops, then every move's release, then grants in order."""
        results: dict[int, ActionResult] = {}
        released: set[str] = set()
        for i, action in enumerate(actions):
            if isinstance(action, Stop | Move):
                job, problem = self._holding(action.sia_id)
                if problem:
                    results[i] = ActionResult(action, False, problem)
                    continue
                assert job is not None
                self._release(job)
                released.add(job.spec.sia_id)
                if isinstance(action, Stop):
                    results[i] = ActionResult(action, True)
        for i, action in enumerate(actions):
            if i in results:
                continue
            if isinstance(action, Move | Start):
                results[i] = self._grant(action, moving=action.sia_id in released)
            elif isinstance(action, Rebatch):
                results[i] = self._rebatch(action)
        return [results[i] for i in range(len(actions))]

    def _holding(self, sia_id: str) -> tuple[_Job | None, str]:
        job = self._by_id.get(sia_id)
        if job is None or not job.admitted:
            return None, f"job {sia_id}: not a submitted job of this cluster"
        if not job.phase.holds_gpus:
            return None, f"job {sia_id}: holds no GPUs (phase {job.phase.value})"
        return job, ""

    def _release(self, job: _Job) -> None:
        for share in job.placement:
            self._free[share.node] += share.gpus
        job.phase, job.config, job.placement, job.batch = JobPhase.PENDING, None, (), None
        job.delay_left = 0.0
        job.sweep = None  # a sweep cut short is run again by the next profiling grant
        job.cached = None

    def _grant(self, action: Start | Move, *, moving: bool) -> ActionResult:
        job = self._by_id.get(action.sia_id)
        if job is None or not job.admitted or job.phase.finished:
            return ActionResult(action, False, f"job {action.sia_id}: not a live submitted job")
        if isinstance(action, Start) and job.phase.holds_gpus:
            return ActionResult(action, False, f"job {action.sia_id}: already holds GPUs")
        if isinstance(action, Move) and not moving:
            return ActionResult(action, False, f"job {action.sia_id}: move of a job not held")
        problem = self._check_grant(action.config, action.placement, action.batch)
        if problem:
            note = " (it was stopped; it waits for a later round)" if moving else ""
            return ActionResult(action, False, f"job {action.sia_id}: {problem}{note}")
        for share in action.placement:
            self._free[share.node] -= share.gpus
        job.phase = JobPhase.STARTING
        job.config, job.placement, job.batch = action.config, action.placement, action.batch
        job.grants += 1
        job.delay_left = self._restart_delay(job, moving=moving)
        job.sweep = None
        if action.profile_sweep:
            gpu_type = action.config.gpu_type
            job.sweep = plan_sweep(
                job.truth.speed[gpu_type], self._profile_type[gpu_type], action.profile_sweep
            )
        job.cached = None
        self._set_speed(job)
        return ActionResult(action, True)

    def _restart_delay(self, job: _Job, *, moving: bool) -> float:
        """Seconds the grant costs: the cluster's own restart time if it has one, else the app's."""
        restart = self.cluster.restart
        if restart is None:
            return job.truth.restart.true_s
        return restart.move_s if moving else restart.start_s

    def _check_grant(
        self, config: Configuration, placement: tuple[NodeShare, ...], batch: BatchChoice
    ) -> str:
        nodes = [share.node for share in placement]
        if len(set(nodes)) != config.nodes or sum(s.gpus for s in placement) != config.gpus:
            return f"placement {placement} does not match configuration {config}"
        for share in placement:
            if self._node_type.get(share.node) != config.gpu_type:
                return f"node {share.node!r} is not a {config.gpu_type} node of this cluster"
            if share.gpus < 1 or self._free[share.node] < share.gpus:
                return f"node {share.node} has {self._free[share.node]} free GPUs, not {share.gpus}"
        return _batch_problem(config, batch)

    def _rebatch(self, action: Rebatch) -> ActionResult:
        job, problem = self._holding(action.sia_id)
        if job is None:
            return ActionResult(action, False, problem)
        assert job.config is not None
        problem = _batch_problem(job.config, action.batch)
        if problem:
            return ActionResult(action, False, f"job {action.sia_id}: {problem}")
        job.batch = action.batch
        job.cached = None
        self._set_speed(job)
        return ActionResult(action, True)

    def _set_speed(self, job: _Job) -> None:
        """Cache the truth at the job's configuration and batch (constant until they change)."""
        assert job.config is not None and job.batch is not None
        speed = job.truth.speed[job.config.gpu_type]
        step, sync = speed.step_time(job.config.nodes, job.config.gpus, job.batch.local_bsz)
        job.step_time, job.sync_time = float(step), float(sync)
        job.iter_time = job.batch.accum_steps * (job.step_time - job.sync_time) + job.step_time
        m0 = job.truth.init_batch_size
        job.base_rate = m0 / (job.iter_time * job.truth.calibration)
        job.scale = job.batch.batch_size / m0
        job.curve = self._table.curve_index(job.truth.app, job.batch.batch_size)

    # --------------------------------------------------------------------------------------
    # Time

    def advance(self, seconds: float) -> list[str]:
        """Run every job holding GPUs for ``seconds``; returns the ids of jobs that completed."""
        if not seconds >= 0:
            raise ValueError(f"seconds: expected >= 0, got {seconds!r}")
        holding = [job for job in self._active if job.phase.holds_gpus]
        plain = [job for job in holding if job.sweep is None]
        if plain:
            delay = np.array([min(job.delay_left, seconds) for job in plain])
            stepped = integrate(
                self._table,
                progress=np.array([job.progress for job in plain]),
                base_rate=np.array([job.base_rate for job in plain]),
                scale=np.array([job.scale for job in plain]),
                curve=np.array([job.curve for job in plain], dtype=np.int64),
                target=np.array([job.truth.completion_samples for job in plain]),
                duration=seconds - delay,
                max_substep=self.max_substep,
            )
            for i, job in enumerate(plain):
                self._step_job(job, float(delay[i]), seconds, stepped, i)
        for job in holding:
            if job.sweep is not None:
                self._step_profiling(job, seconds)
        self.time += seconds
        return [job.spec.sia_id for job in holding if job.phase is JobPhase.DONE]

    def _step_job(self, job: _Job, delay: float, seconds: float, stepped: Stepped, i: int) -> None:
        """Book one job's interval: restart delay served, training done, completion."""
        finish = float(stepped.finish[i])
        job.progress = float(stepped.progress[i])
        self._serve_delay(job, delay)
        trained = seconds - delay if np.isnan(finish) else finish
        if trained > 0:
            job.trained = True
            job.steps += trained / job.iter_time
        assert job.config is not None
        if np.isnan(finish):
            job.gpu_seconds += seconds * job.config.gpus
            return
        self._complete(job, delay + finish)

    def _serve_delay(self, job: _Job, delay: float) -> None:
        if delay > 0:
            job.delay_left -= delay
            if job.delay_left <= 1e-9:
                job.delay_left = 0.0
        if job.phase is JobPhase.STARTING and job.delay_left == 0.0:
            job.phase = JobPhase.RUNNING  # restored: training from now on
            job.cached = None

    def _complete(self, job: _Job, held: float) -> None:
        """The job reached its completion target ``held`` seconds into this interval."""
        assert job.config is not None
        job.gpu_seconds += held * job.config.gpus
        job.finish_time = self.time + held
        for share in job.placement:
            self._free[share.node] += share.gpus
        job.phase = JobPhase.DONE
        job.cached = None

    def _step_profiling(self, job: _Job, seconds: float) -> None:
        """Book one interval of a profiling grant (sia_slurm/sim/sweep.py): its restart delay,
        the sweep's segments, each training at its own batch (the failed try at none), the
        document once the sweep is done, then training at the assignment for what is left.
        The delay and the sweep count as profiling GPU time."""
        sweep, config = job.sweep, job.config
        assert sweep is not None and config is not None
        delay = min(job.delay_left, seconds)
        self._serve_delay(job, delay)
        elapsed = delay
        profiling = delay
        while sweep.segments and elapsed < seconds:
            segment = sweep.segments[0]
            use = min(segment.seconds, seconds - elapsed)
            if segment.local_bsz:
                done = self._train(job, use, *self._rate_at(job, segment.local_bsz))
                if done is not None:
                    job.profiling_gpu_seconds += (profiling + done) * config.gpus
                    self._complete(job, elapsed + done)
                    return
            segment.seconds -= use
            elapsed += use
            profiling += use
            if segment.seconds <= 1e-9:
                sweep.segments.pop(0)
        job.profiling_gpu_seconds += profiling * config.gpus
        if not sweep.segments:
            self._write_profile(job, sweep)
            job.sweep = None
        if elapsed < seconds:
            done = self._train(job, seconds - elapsed, job.base_rate, job.scale, job.curve)
            if done is not None:
                self._complete(job, elapsed + done)
                return
        job.gpu_seconds += seconds * config.gpus

    def _rate_at(self, job: _Job, local_bsz: int) -> tuple[float, float, int]:
        """(base rate, scale, curve) of one GPU at per-GPU batch ``local_bsz``, no accumulation
        (a sweep step): :meth:`_set_speed` for that batch."""
        assert job.config is not None
        step, _ = job.truth.speed[job.config.gpu_type].step_time(1, 1, local_bsz)
        m0 = job.truth.init_batch_size
        base_rate = m0 / (float(step) * job.truth.calibration)
        return base_rate, local_bsz / m0, self._table.curve_index(job.truth.app, local_bsz)

    def _train(
        self, job: _Job, seconds: float, base_rate: float, scale: float, curve: int
    ) -> float | None:
        """Train ``job`` alone for ``seconds`` at this rate; the seconds into them at which it
        completed, or ``None``. Steps are counted at the rate's step time."""
        if seconds <= 0:
            return None
        stepped = integrate(
            self._table,
            progress=np.array([job.progress]),
            base_rate=np.array([base_rate]),
            scale=np.array([scale]),
            curve=np.array([curve], dtype=np.int64),
            target=np.array([job.truth.completion_samples]),
            duration=np.array([seconds]),
            max_substep=self.max_substep,
        )
        job.progress = float(stepped.progress[0])
        finish = float(stepped.finish[0])
        trained = seconds if np.isnan(finish) else finish
        job.trained = True
        # base_rate = M0 / (step time x calibration): the step time, back
        job.steps += trained * base_rate * job.truth.calibration / job.truth.init_batch_size
        return None if np.isnan(finish) else finish

    def _write_profile(self, job: _Job, sweep: SweepPlan) -> None:
        """The sweep is done: the job writes its profile document (every type so far)."""
        m0 = job.spec.init_batch_size or job.truth.init_batch_size
        header = {
            "app": job.spec.app or job.truth.app,
            "init_batch_size": m0,
            "max_batch_size": job.spec.max_batch_size or m0,
        }
        document = job.profiled.add(
            sweep,
            header=header,
            gpu_types=set(self._profile_type.values()),
            rng_key=noise_key(self.seed, job.spec.sia_id, sweep.profile_type, job.sweeps),
            sigma=self.profile_noise,
        )
        job.sweeps += 1
        if document is not None:
            job.profiled_document = document
            job.cached = None

    # --------------------------------------------------------------------------------------
    # Results

    @property
    def all_done(self) -> bool:
        """Whether every job has been submitted and has completed."""
        return self._arrived == len(self._jobs) and all(
            job.finish_time is not None for job in self._jobs
        )

    @property
    def next_submit_time(self) -> float | None:
        """Submission time of the next job not yet admitted, if any."""
        if self._arrived < len(self._jobs):
            return self._jobs[self._arrived].spec.submit_time
        return None

    def idle(self) -> bool:
        """Whether no submitted job is waiting, running or unreported (nothing to schedule)."""
        return not self._active

    def node_usage(self) -> dict[str, int]:
        """GPUs held on each node, summed from the jobs' placements (a consistency check of
        the free-GPU bookkeeping: it must equal ``total - free`` and never exceed ``total``)."""
        usage = dict.fromkeys(self._free, 0)
        for job in self._active:
            if job.phase.holds_gpus:
                for share in job.placement:
                    usage[share.node] += share.gpus
        return usage

    def free_gpus(self) -> dict[str, int]:
        """Free GPUs on each node right now (a copy: the caller may keep it)."""
        return dict(self._free)

    def holding(self) -> frozenset[str]:
        """The ids of the jobs that hold GPUs right now (starting or running)."""
        return frozenset(job.spec.sia_id for job in self._active if job.phase.holds_gpus)

    def gpus_held(self) -> dict[str, int]:
        """GPUs held per GPU type right now (every type listed)."""
        used = {t.name: 0 for t in self.cluster.gpu_types}
        for node in self.nodes:
            used[node.gpu_type] += node.total_gpus - self._free[node.name]
        return used

    def outcomes(self) -> list[JobOutcome]:
        """Per job, in submission order: submission, completion, GPU-seconds, restarts."""
        return [
            JobOutcome(
                name=job.spec.sia_id,
                app=job.truth.app,
                submit_time=job.spec.submit_time,
                finish_time=job.finish_time,
                gpu_seconds=job.gpu_seconds,
                restarts=job.restarts,
                contention=job.contention_sum / max(job.contention_rounds, 1),
                account=job.account,
                profiling_gpu_seconds=job.profiling_gpu_seconds,
                sweeps=job.sweeps,
            )
            for job in self._jobs
        ]


def _batch_problem(config: Configuration, batch: BatchChoice) -> str:
    if batch.local_bsz < 1 or batch.accum_steps < 0:
        return f"batch {batch}: expected local_bsz >= 1 and accum_steps >= 0"
    expected = config.gpus * batch.local_bsz * (batch.accum_steps + 1)
    if batch.batch_size != expected:
        return (
            f"batch {batch}: batch_size must be gpus * local_bsz * (accum_steps + 1) = {expected}"
        )
    return ""
