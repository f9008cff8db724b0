"""One scheduling round: observe -> estimate -> allocate -> place -> actions.

:class:`Controller` is the only place that runs a round; ``sia-slurm controller run`` drives it
with the Slurm backend and the wall clock, ``sia-slurm simulate`` with the simulated cluster and
a simulated clock. It reads a :class:`~sia_slurm.cluster.ClusterSnapshot` and returns the
:class:`~sia_slurm.cluster.Action` list; applying them is the caller's business, so the same
round also serves ``--dry-run``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from sia_slurm.cluster import (
    Action,
    BatchChoice,
    ClusterSnapshot,
    JobPhase,
    JobSnapshot,
    Move,
    Rebatch,
    Start,
    Stop,
)
from sia_slurm.controller.jobs import JobRecord
from sia_slurm.controller.profiling import Profiler
from sia_slurm.controller.quarantine import MAX_CULPRITS, QUARANTINED, Quarantine
from sia_slurm.core import Decision, JobKind
from sia_slurm.model import JobGoodputEstimator
from sia_slurm.policy.base import (
    Allocation,
    ClusterView,
    JobAllocation,
    JobView,
    NodeShare,
    Policy,
    PolicyInput,
)
from sia_slurm.policy.entitlement import owed_gpus, weighs_jobs
from sia_slurm.policy.limits import GpuLimit
from sia_slurm.policy.placement import Placement, place
from sia_slurm.policy.shares import (
    EQUAL_USERS,
    JobOwner,
    SharesConfig,
    UsageLedger,
    account_parts,
    job_weights,
)
from sia_slurm.protocol import JobSpec, MetricsReport

logger = logging.getLogger(__name__)

EstimatorBuilder = Callable[[JobSpec], JobGoodputEstimator]


@dataclass(frozen=True)
class RoundOutcome:
    """Everything one round decided, and how long each stage took (seconds)."""

    round_index: int
    time: float
    allocation: Allocation
    placement: Placement
    actions: tuple[Action, ...]
    decisions: tuple[Decision, ...]
    rejected: tuple[str, ...] = ()
    timings: Mapping[str, float] = field(default_factory=dict)
    quarantined: Mapping[str, str] = field(default_factory=dict)  # sia id -> stage: why
    reports_taken: tuple[MetricsReport, ...] = ()  # the reports the models were fed
    # The policy's view of every job it decided (its limits as the controller set them this
    # round): what measures of the round, such as the simulator's idle waits, judge against.
    views: tuple[JobView, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "timings", MappingProxyType(dict(self.timings)))
        object.__setattr__(self, "quarantined", MappingProxyType(dict(self.quarantined)))


@dataclass(frozen=True)
class _Decided:
    """What one attempt at allocating and placing the live jobs gave."""

    live: list[JobSnapshot]
    allocation: Allocation
    placement: Placement
    policy_s: float
    place_s: float
    views: tuple[JobView, ...] = ()


class _StageError(Exception):
    """An exception of the policy or the placement, with the stage it came from."""

    def __init__(self, stage: str, cause: Exception) -> None:
        super().__init__(f"{type(cause).__name__}: {cause}")
        self.stage = stage
        self.cause = cause


def _stage_of(exc: Exception) -> str:
    """Where a failed decision raised: ``estimate`` when the goodput model raised inside the
    policy, else the stage that raised (``allocate``, ``place``)."""
    if not isinstance(exc, _StageError):
        return "allocate"
    traceback = exc.cause.__traceback__
    while traceback is not None:
        if traceback.tb_frame.f_globals.get("__name__", "").startswith("sia_slurm.model"):
            return "estimate"
        traceback = traceback.tb_next
    return exc.stage


class Controller:
    """Runs rounds against snapshots; keeps each job's goodput model and the policy's memory."""

    def __init__(
        self,
        policy: Policy,
        estimator_for: EstimatorBuilder,
        shares: SharesConfig = EQUAL_USERS,
        profiler: Profiler | None = None,
    ) -> None:
        self.policy = policy
        # Profiles new models (docs/profiling.md); None: a job without a profile is refused.
        self.profiler = profiler
        self.shares = shares
        self.usage = UsageLedger(
            half_life_s=shares.usage_half_life_s, limit=shares.usage_factor_limit
        )
        self._estimator_for = estimator_for
        self.jobs: dict[str, JobRecord] = {}
        self.previous: Allocation | None = None
        self.round_index = 0
        # sia id -> the quarantine reason last logged (restored with the memory, so that a
        # controller run once per round by cron logs each reason once too)
        self.quarantine_said: dict[str, str] = {}

    # --------------------------------------------------------------------------------------
    # The round

    def round(self, snapshot: ClusterSnapshot) -> RoundOutcome:
        """Decide this round's actions from ``snapshot`` (does not apply them).

        One job's failure is that job's alone: a job whose goodput model cannot be built or
        fed (``fit``), or whose presence makes the policy or the placement raise
        (``estimate``, ``allocate``, ``place``), is quarantined for the round: left out of the
        decision, its GPUs (if it holds any) counted as taken, its reason in its
        :class:`Decision`. The backend quarantines the jobs it cannot read (``read``,
        ``ClusterSnapshot.quarantined``). The round goes on for everyone else.
        """
        t0 = time.perf_counter()
        quarantine = Quarantine.from_snapshot(snapshot)
        taken: list[MetricsReport] = []
        live, rejected = self._observe(snapshot, quarantine, taken)
        live, waiting = self._profile(snapshot, live)
        t1 = time.perf_counter()
        try:
            decided = self._decide_isolating(snapshot, live, quarantine)
        except _StageError as exc:  # not one job's failure: the round's, as it was raised
            raise exc.cause from None
        live = decided.live
        actions, decisions = self._diff(live, decided.allocation, decided.placement)
        if self.profiler is not None:
            self.profiler.assigned(actions, self.jobs)
        self._count_restarts(actions)
        decisions = [self._with_profiling(d) for d in decisions]
        decisions += [_decision(job, "wait", "-", None, note) for job, note in waiting]
        decisions += [
            Decision(sia_id, phase, QUARANTINED, held, "-", note=reason)
            for sia_id, phase, held, reason in quarantine.decisions()
        ]
        self._say_quarantine(quarantine)
        outcome = RoundOutcome(
            round_index=self.round_index,
            time=snapshot.time,
            allocation=decided.allocation,
            placement=decided.placement,
            actions=tuple(actions),
            decisions=tuple(decisions),
            rejected=tuple(rejected),
            timings={
                "observe_s": t1 - t0,
                "policy_s": decided.policy_s,
                "place_s": decided.place_s,
                "total_s": time.perf_counter() - t0,
            },
            quarantined=quarantine.reasons,
            reports_taken=tuple(taken),
            views=decided.views,
        )
        self.previous = decided.allocation
        self.round_index += 1
        return outcome

    # --------------------------------------------------------------------------------------
    # Allocate and place, each job's failure isolated

    def _decide_isolating(
        self, snapshot: ClusterSnapshot, live: list[JobSnapshot], quarantine: Quarantine
    ) -> _Decided:
        """Allocate and place ``live``; if that raises, find the job whose presence makes it
        raise (:meth:`_culprit`), quarantine it and decide again without it, up to
        :data:`MAX_CULPRITS` jobs. A failure that no single job causes (an empty round that
        raises, or more culprits than that) is the round's, and propagates."""
        for _ in range(MAX_CULPRITS + 1):
            try:
                return self._decide(snapshot, live, quarantine)
            except Exception as exc:
                if not live:
                    raise
                found = self._culprit(snapshot, live, quarantine)
                if found is None:
                    raise
                culprit, stage, why = found
                quarantine.add(culprit, stage, why)
                live = [job for job in live if job.sia_id != culprit.sia_id]
                logger.debug("round failed with job %s (%s): %s", culprit.sia_id, stage, exc)
        return self._decide(snapshot, live, quarantine)

    def _culprit(
        self, snapshot: ClusterSnapshot, live: list[JobSnapshot], quarantine: Quarantine
    ) -> tuple[JobSnapshot, str, str] | None:
        """The first job of ``live`` whose addition to the jobs before it makes the decision
        raise, the stage it raised in and why; ``None`` if the jobs before none of them fail
        alone (the failure is not one job's). Bisects on the prefix length: ``log2(len(live))``
        decisions, paid only in a round that failed."""
        low, high = 0, len(live)  # deciding live[:low] succeeds; live[:high] raises
        failure: tuple[str, str] | None = None
        for k in (0, len(live)):
            failure = self._try_decide(snapshot, live[:k], quarantine)
            if (failure is None) != (k == 0):
                return None  # no jobs fail too, or all of them succeed: not one job's doing
        while high - low > 1:
            middle = (low + high) // 2
            attempt = self._try_decide(snapshot, live[:middle], quarantine)
            if attempt is None:
                low = middle
            else:
                high, failure = middle, attempt
        assert failure is not None
        return live[high - 1], failure[0], failure[1]

    def _try_decide(
        self, snapshot: ClusterSnapshot, jobs: list[JobSnapshot], quarantine: Quarantine
    ) -> tuple[str, str] | None:
        """``None`` if deciding ``jobs`` succeeds, else the stage and the error."""
        try:
            self._decide(snapshot, jobs, quarantine)
        except Exception as exc:
            cause = exc.cause if isinstance(exc, _StageError) else exc
            return _stage_of(exc), f"{type(cause).__name__}: {cause}"
        return None

    def _decide(
        self, snapshot: ClusterSnapshot, live: list[JobSnapshot], quarantine: Quarantine
    ) -> _Decided:
        t1 = time.perf_counter()
        cluster = ClusterView(quarantine.nodes_without_holders(snapshot))
        views = tuple(self._view(job, snapshot.time) for job in live)
        policy_input = PolicyInput(
            cluster=cluster,
            jobs=views,
            previous=self.previous,
            now=snapshot.time,
            round_index=self.round_index,
            limits=self._limits(live, snapshot),
        )
        policy_input = replace(
            policy_input,
            weights=self._weights(live, snapshot, policy_input),
            groups=self._groups(live, snapshot),
        )
        try:
            allocation = self.policy.solve(policy_input)
        except Exception as exc:
            raise _StageError("allocate", exc) from exc
        t2 = time.perf_counter()
        try:
            placement = place(cluster, allocation, views)
        except Exception as exc:
            raise _StageError("place", exc) from exc
        if placement.replaced:  # placed at the policy's fallbacks: the round's allocation
            allocation = replace(allocation, jobs={**allocation.jobs, **placement.replaced})
        place_s = time.perf_counter() - t2
        return _Decided(live, allocation, placement, t2 - t1, place_s, views)

    def _say_quarantine(self, quarantine: Quarantine) -> None:
        """Log each job's quarantine when it begins or its reason changes, and its end."""
        for sia_id, reason in quarantine.reasons.items():
            if self.quarantine_said.get(sia_id) != reason:
                logger.warning("job %s: quarantined this round: %s", sia_id, reason)
        for sia_id in set(self.quarantine_said) - set(quarantine.reasons):
            logger.info("job %s: out of quarantine", sia_id)
        self.quarantine_said = dict(quarantine.reasons)

    # --------------------------------------------------------------------------------------
    # Observe: admit new jobs, forget finished ones, learn from reports

    def _observe(
        self, snapshot: ClusterSnapshot, quarantine: Quarantine, taken: list[MetricsReport]
    ) -> tuple[list[JobSnapshot], list[str]]:
        """Admit new jobs, forget finished ones, and feed each believed report to its job's
        model (appended to ``taken``); the live jobs to decide, and what was rejected."""
        rejected = list(snapshot.rejected)
        live: list[JobSnapshot] = []
        seen: set[str] = set()
        finished: set[str] = set()
        for job in snapshot.jobs:
            seen.add(job.sia_id)
            if job.phase.finished:
                self.jobs.pop(job.sia_id, None)
                finished.add(job.sia_id)
                continue
            record = self.jobs.get(job.sia_id)
            if record is None:
                try:
                    record = self._admit(job, snapshot.time)
                except ValueError as exc:  # an unknown app, a bad profile: said, not a bug
                    rejected.append(f"job {job.sia_id}: not scheduled: {exc}")
                    quarantine.add(job, "fit", str(exc))
                    continue
                except Exception as exc:
                    quarantine.add(job, "fit", f"{type(exc).__name__}: {exc}")
                    continue
                self.jobs[job.sia_id] = record
            if job.phase.holds_gpus and job.config is not None:
                record.max_gpus_seen = max(record.max_gpus_seen, job.config.gpus)
            live.append(job)
        seen |= set(snapshot.quarantined)  # unread this round, not gone: keep its model
        for gone in set(self.jobs) - seen:  # vanished from the cluster without finishing
            del self.jobs[gone]
        current = {job.sia_id: job for job in live}
        for report in snapshot.reports:
            if report.sia_id in finished:
                continue  # a finished job's last report: nothing left to decide with it
            record = self.jobs.get(report.sia_id)
            if record is not None and record.profiling is not None:
                continue  # its profile is measured by its sweep (docs/profiling.md), not here
            why = self._ingest(report, current.get(report.sia_id), snapshot.time)
            if why:
                rejected.append(why)
            else:
                taken.append(report)
        return [j for j in live if not quarantine.holds(j)], rejected

    def _admit(self, job: JobSnapshot, now: float) -> JobRecord:
        """A new job's record: a profiling one when it has no profile (and profiling is on),
        else its goodput model from its profile."""
        if self.profiler is not None and self.profiler.needs(job):
            return self.profiler.admit(job, now)
        return JobRecord(job.spec, self._build_estimator(job), job.profile_document)

    def _profile(
        self, snapshot: ClusterSnapshot, live: list[JobSnapshot]
    ) -> tuple[list[JobSnapshot], list[tuple[JobSnapshot, str]]]:
        """Take in what profiling jobs measured (:mod:`sia_slurm.controller.profiling`): the
        live jobs left to decide, and those waiting for another job's profiling (with why).
        A job whose measurements were refused too often is held: it is offered no GPU type
        (its decision says why)."""
        if self.profiler is None:
            return live, []
        site_types = {node.gpu_type for node in snapshot.nodes}
        waits = self.profiler.round(live, self.jobs, site_types, snapshot.time)
        waiting = [(job, waits[job.sia_id]) for job in live if job.sia_id in waits]
        return [j for j in live if j.sia_id not in waits], waiting

    def _build_estimator(self, job: JobSnapshot) -> JobGoodputEstimator:
        """The job's goodput model, from its own profile document when it brought one (a
        ``--profile`` directory, copied by sia-sbatch), else from its app's shipped profile."""
        if job.profile_document is None:
            return self._estimator_for(job.spec)
        return self._estimator_for(job.spec, job.profile_document)  # type: ignore[call-arg]

    def _ingest(self, report: MetricsReport, job: JobSnapshot | None, now: float) -> str:
        """Feed ``report`` to its job's model; why not (``""`` if it was). A report the checks
        of :mod:`sia_slurm.controller.reports` or the model refuse is said and left out, and
        the job keeps the model it had (a report is one measurement among many)."""
        record = self.jobs.get(report.sia_id)
        if record is None or job is None:
            return f"metrics for {report.sia_id}: no such live managed job; ignored"
        try:
            why = record.believe(report, job, now)
            if not why:
                record.ingest(report)
        except Exception as exc:
            why = f"{type(exc).__name__}: {exc}"
        return f"metrics for {report.sia_id}: {why}; ignored" if why else ""

    def _weights(
        self, live: list[JobSnapshot], snapshot: ClusterSnapshot, policy_input: PolicyInput
    ) -> dict[str, float]:
        """Each live job's weight from the shares (Slurm's association shares when accounting
        is on, else the config's) and each account's recent GPU time against what it was
        owed (:mod:`sia_slurm.policy.shares`, :mod:`sia_slurm.policy.entitlement`)."""
        shares = self._shares(snapshot)
        owners = [_owner(job) for job in live]
        account_of = {o.job_id: shares.account_of(o.user, o.account) for o in owners}
        held: dict[str, float] = {}
        for job, owner in zip(live, owners, strict=True):
            if job.phase.holds_gpus and job.config is not None:
                account = account_of[owner.job_id]
                held[account] = held.get(account, 0.0) + job.config.gpus
        parts = account_parts(owners, shares)
        owed: dict[str, int] = {}
        if len(parts) > 1 and self.usage.limit > 1 and weighs_jobs(self.policy):
            owed = owed_gpus(self.policy, policy_input, account_of, parts)
        self.usage.record(snapshot.time, held, owed)
        return job_weights(owners, shares, self.usage.factors(parts))

    def _shares(self, snapshot: ClusterSnapshot) -> SharesConfig:
        """Slurm's association shares when accounting is on, else the config's."""
        return self.shares if snapshot.site is None else snapshot.site.shares()

    def _groups(
        self, live: list[JobSnapshot], snapshot: ClusterSnapshot
    ) -> dict[str, tuple[str, ...]]:
        """Each live job's (account, user), as its weight counts them (:meth:`_weights`)."""
        shares = self._shares(snapshot)
        owners = [_owner(job) for job in live]
        return {o.job_id: (shares.account_of(o.user, o.account), o.user) for o in owners}

    @staticmethod
    def _limits(live: list[JobSnapshot], snapshot: ClusterSnapshot) -> tuple[GpuLimit, ...]:
        """Slurm's association and QOS GPU limits over the live jobs (none without
        accounting): granting past them would leave jobs pending in Slurm."""
        if snapshot.site is None:
            return ()
        return snapshot.site.limits(_owner(job) for job in live)

    def _count_restarts(self, actions: Sequence[Action]) -> None:
        """Count the restarts this round asks for (moves and stops of jobs past profiling)."""
        for action in actions:
            record = self.jobs.get(action.sia_id)
            if isinstance(action, Move | Stop) and record is not None and not record.profiling:
                record.chosen_restarts += 1

    def _view(self, job: JobSnapshot, now: float) -> JobView:
        holds = job.phase.holds_gpus
        return self.jobs[job.sia_id].view(
            now=now,
            restarts=job.restarts,
            current=job.config if holds else None,
            placement=job.placement if holds else (),
            restoring=job.phase is JobPhase.STARTING,
        )

    def _with_profiling(self, decision: Decision) -> Decision:
        """``decision`` with where its job's profiling stands as its note, if it profiles."""
        record = self.jobs.get(decision.sia_id)
        if self.profiler is None or record is None or record.profiling is None:
            return decision
        note = self.profiler.describe(record)
        return replace(decision, note=f"{note}; {decision.note}" if decision.note else note)

    def _sweep(self, job: JobSnapshot) -> tuple[int, ...]:
        """The per-GPU batches ``job``'s next run measures (none unless it profiles)."""
        if self.profiler is None:
            return ()
        return self.profiler.sweep(self.jobs[job.sia_id])

    # --------------------------------------------------------------------------------------
    # Diff: current state vs. placed allocation -> actions

    def _diff(
        self, live: list[JobSnapshot], allocation: Allocation, placement: Placement
    ) -> tuple[list[Action], list[Decision]]:
        stops: list[Action] = []
        moves: list[Action] = []
        rebatches: list[Action] = []
        starts: list[Action] = []
        decisions: list[Decision] = []
        r = self.round_index
        for job in live:
            share = allocation.get(job.sia_id)
            nodes = placement.assignments.get(job.sia_id)
            before = str(job.config) if job.phase.holds_gpus else "-"
            if share is None or nodes is None:
                note = "allocated but not placed" if share is not None else ""
                if job.phase.holds_gpus and job.spec.kind is not JobKind.PINNED:
                    stops.append(Stop(job.sia_id, r))
                    decisions.append(_decision(job, "stop", before, None, note))
                else:
                    action = "keep" if job.phase.holds_gpus else "wait"
                    decisions.append(_decision(job, action, before, None, note))
                continue
            batch = BatchChoice(share.batch_size, share.local_bsz, share.accum_steps)
            sweep = self._sweep(job)
            if not job.phase.holds_gpus:
                starts.append(Start(job.sia_id, r, share.config, nodes, batch, sweep))
                decisions.append(_decision(job, "start", before, share))
            elif share.config != job.config or not _same_nodes(nodes, job.placement):
                moves.append(Move(job.sia_id, r, share.config, nodes, batch, sweep))
                decisions.append(_decision(job, "move", before, share))
            elif (
                job.spec.kind is JobKind.ADAPTIVE
                and job.phase is JobPhase.RUNNING
                and job.batch is not None
                and batch != job.batch
            ):
                rebatches.append(Rebatch(job.sia_id, r, batch))
                decisions.append(_decision(job, "rebatch", before, share))
            else:
                decisions.append(_decision(job, "keep", before, share))
        # Free GPUs before granting them: stops, then moves, then batch-only changes, then starts.
        return [*stops, *moves, *rebatches, *starts], decisions


def _owner(job: JobSnapshot) -> JobOwner:
    return JobOwner(job.sia_id, job.user, job.account, job.qos)


def _same_nodes(a: tuple[NodeShare, ...], b: tuple[NodeShare, ...]) -> bool:
    return sorted((s.node, s.gpus) for s in a) == sorted((s.node, s.gpus) for s in b)


def _decision(
    job: JobSnapshot, action: str, before: str, share: JobAllocation | None, note: str = ""
) -> Decision:
    if share is None:
        return Decision(job.sia_id, job.phase.value, action, before, "-", note=note)
    return Decision(
        sia_id=job.sia_id,
        phase=job.phase.value,
        action=action,
        before=before,
        after=str(share.config),
        batch_size=share.batch_size,
        local_bsz=share.local_bsz,
        accum_steps=share.accum_steps,
        goodput=share.goodput,
        note=note,
        throughput=share.throughput,
    )
