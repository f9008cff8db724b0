"""Sia's profiling of a new model, on the controller's side (docs/profiling.md).

A job whose model the controller has no profile for (no shipped ``--app``, no ``--profile``,
no measured profile kept for its app and account) is *profiling*: its goodput model offers one
GPU of each GPU type not measured yet, so the policy gives it one of them when it sees fit; its
run there measures a sweep of per-GPU batches (the assignment's ``profile_sweep``) and writes
what it measured to ``profiled.json``, which the backend reads through the user-file door. The
controller takes from that document only the types the job was given, checks them, and when
every GPU type of the cluster is measured, keeps the profile (:class:`ProfileBook`) and builds
the job's real goodput model from it.

The profiling is per *key*, not per job: the jobs of one app and account share it (the oldest
profiles, the others wait), so two jobs of a new app give one profile, and if the profiler
ends before it is done the next one takes over with the types already measured. A job without
an app profiles for itself alone (its key is its id).

This module is the round's stage (:class:`Profiler`); each key's state, which the controller's
memory keeps, is :class:`sia_slurm.controller.profiling_state.Profiling`.

Nothing here reads a file: documents come from the snapshot, measured profiles from the book.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from sia_slurm.cluster import Action, JobSnapshot, Move, Start
from sia_slurm.controller.jobs import EstimatorFactory, JobRecord
from sia_slurm.controller.profiling_state import MAX_REFUSALS, OWN, ProfileKey, Profiling
from sia_slurm.model import JobGoodputEstimator
from sia_slurm.model.batch import BatchLimits
from sia_slurm.model.type_speeds import profile_speed_factors
from sia_slurm.protocol import MAX_SWEEP, JobSpec
from sia_slurm.protocol.observation import Observation
from sia_slurm.protocol.profile_json import measured_problems, profile_from_json

# A profiling job's per-GPU batches: powers of two from the smallest useful one (M0 over this)
# up to its largest batch; the job stops at the first that does not fit.
SWEEP_SPREAD = 16
# How much more goodput a profiling job's placeholder model gives the type expected slowest
# than the fastest (provisional_estimator): enough to decide between free types, too little to
# weigh against other jobs.
SLOW_FIRST = 0.05
PROFILING_NOTE = "profiling:"  # how a profiling job's decision note begins (status shows it)
DEADLINE_S = 900.0  # seconds a profiling run may take to measure its type

logger = logging.getLogger(__name__)


class ProfileBook(Protocol):
    """Where measured profiles are kept (sia_slurm/state/profiles.py: files under the state
    directory for the Slurm controller, a dict in the simulator)."""

    def get(self, account: str, app: str) -> Mapping[str, Any] | None: ...

    def put(
        self, account: str, app: str, document: Mapping[str, Any], meta: Mapping[str, Any]
    ) -> None: ...


@dataclass
class MemoryProfileBook:
    """A :class:`ProfileBook` in memory (the simulator; tests)."""

    documents: dict[ProfileKey, Mapping[str, Any]] = field(default_factory=dict)
    meta: dict[ProfileKey, Mapping[str, Any]] = field(default_factory=dict)

    def get(self, account: str, app: str) -> Mapping[str, Any] | None:
        return self.documents.get((account, app))

    def put(
        self, account: str, app: str, document: Mapping[str, Any], meta: Mapping[str, Any]
    ) -> None:
        self.documents[(account, app)] = document
        self.meta[(account, app)] = meta


def profile_sweep(limits: BatchLimits) -> tuple[int, ...]:
    """The per-GPU batches a profiling run measures: powers of two from ``min_local_bsz`` up
    to the largest batch (at most :data:`~sia_slurm.protocol.MAX_SWEEP`)."""
    sweep = [limits.min_local_bsz]
    while sweep[-1] * 2 <= limits.max_batch_size and len(sweep) < MAX_SWEEP:
        sweep.append(sweep[-1] * 2)
    return tuple(sweep)


def profiling_limits(spec: JobSpec) -> BatchLimits:
    """A profiling job's batch bounds: its M0 (required: nothing else says what batch its
    learning rate is tuned for), its largest batch (M0 when not given) and a smallest useful
    per-GPU batch of M0 / :data:`SWEEP_SPREAD`."""
    m0 = spec.init_batch_size
    if m0 < 1:
        raise ValueError(
            f"job {spec.sia_id}: a model without a profile is profiled, which needs its "
            "initial batch size: submit it with --init-batch-size"
        )
    largest = max(spec.max_batch_size or m0, m0)
    return BatchLimits(m0, largest, max(1, m0 // SWEEP_SPREAD))


def provisional_estimator(
    limits: BatchLimits,
    profile_types: Collection[str],
    aliases: Mapping[str, str],
    expected_speed: Mapping[str, float] | None = None,
) -> JobGoodputEstimator:
    """The goodput model of a job still profiling: one GPU of each of ``profile_types`` (those
    not measured yet), nothing else. The policy only needs to compare the job's options with
    the other jobs'; a placeholder speed on every type leaves the choice of type to where there
    is room. The placeholder is a little faster (up to :data:`SLOW_FIRST` more goodput) the
    slower the type is expected to be (``expected_speed``, :mod:`sia_slurm.model.type_speeds`):
    where there is room on several, the job measures the slowest first and ends its profiling
    on the type it is likeliest to keep, one restart fewer. The batch it chooses is M0 on one
    GPU (the job splits it into accumulation steps where it does not fit)."""
    m0 = limits.init_batch_size
    speeds = expected_speed or {}

    def placeholder(profile_type: str) -> tuple[Observation, ...]:
        slowness = 1.0 - min(max(speeds.get(profile_type, 1.0), 0.0), 1.0)
        step_time = 1.0 / (1.0 + SLOW_FIRST * slowness)
        return (Observation(nodes=1, gpus=1, local_bsz=m0, step_time=step_time, sync_time=0.0),)

    return JobGoodputEstimator(
        {t: m0 for t in profile_types},
        BatchLimits(m0, m0, min(limits.min_local_bsz, m0)),
        seed={t: placeholder(t) for t in profile_types},
        type_aliases=aliases,
    )


__all__ = [
    "PROFILING_NOTE",
    "SWEEP_SPREAD",
    "MemoryProfileBook",
    "ProfileBook",
    "Profiler",
    "profile_sweep",
    "profiling_limits",
    "provisional_estimator",
]


@dataclass
class Profiler:
    """The profilings under way, and where measured profiles are kept.

    ``factory`` builds goodput models (it knows the shipped apps, the profiles' GPU types and
    the site's aliases for them); ``book`` keeps measured profiles for later jobs."""

    book: ProfileBook
    factory: EstimatorFactory
    profilings: dict[ProfileKey, Profiling] = field(default_factory=dict)
    # A profiling run that has measured nothing this long after its start is refused (a
    # script without the elastic wrappers never writes profiled.json).
    deadline_s: float = DEADLINE_S

    @functools.cached_property
    def expected_speed(self) -> dict[str, float]:
        """Each profile type's expected speed factor from the shipped profiles (fastest 1)."""
        profiles = self.factory.profiles
        return profile_speed_factors(profiles, profiles.gpu_types)

    def needs(self, job: JobSnapshot) -> bool:
        """Whether ``job`` brings no profile and names no shipped app."""
        spec = job.spec
        if job.profile_document is not None or spec.profile:
            return False
        return not spec.app or spec.app not in self.factory.profiles.apps

    @staticmethod
    def key(job: JobSnapshot) -> ProfileKey:
        """Who shares the job's profile: its app and account, or the job alone (no app)."""
        return (job.account, job.spec.app) if job.spec.app else (OWN, job.sia_id)

    def admit(self, job: JobSnapshot, now: float) -> JobRecord:
        """A new job's record: built from the profile kept for its app and account, else a
        profiling record (:class:`ValueError` if the job cannot be profiled)."""
        key = self.key(job)
        kept = self.book.get(*key) if key[0] != OWN else None
        if kept is not None:
            return JobRecord(job.spec, self.factory(job.spec, kept), kept)
        limits = profiling_limits(job.spec)
        profiling = self.profilings.setdefault(key, Profiling(key, limits, now))
        estimator = provisional_estimator(
            profiling.limits,
            sorted(self.factory.profiles.gpu_types),
            self.factory.type_aliases,
            self.expected_speed,
        )
        return JobRecord(job.spec, estimator, profiling=key)

    def profile_type(self, site_type: str) -> str:
        return self.factory.type_aliases.get(site_type, site_type)

    def sweep(self, record: JobRecord) -> tuple[int, ...]:
        """The per-GPU batches a run of ``record``'s job measures (none when not profiling)."""
        if record.profiling is None or record.profiling not in self.profilings:
            return ()
        return profile_sweep(self.profilings[record.profiling].limits)

    def round(
        self,
        live: list[JobSnapshot],
        records: Mapping[str, JobRecord],
        site_types: Collection[str],
        now: float,
    ) -> dict[str, str]:
        """Take in what the profiling jobs of ``live`` measured; finish the profilings that have
        every type of ``site_types``; set each profiling job's model and GPU types. Returns
        the jobs that wait for another job's profiling (sia id -> why)."""
        by_key: dict[ProfileKey, list[JobSnapshot]] = {}
        for job in live:
            key = records[job.sia_id].profiling
            if key is not None:
                by_key.setdefault(key, []).append(job)
        for gone in set(self.profilings) - set(by_key):
            del self.profilings[gone]  # no job left to profile it: a later one starts afresh
        required = {self.profile_type(t) for t in site_types}
        waiting: dict[str, str] = {}
        for key, jobs in by_key.items():
            profiling = self.profilings[key]
            for job in jobs:
                self._take(profiling, job, now)
            missing = profiling.missing(required)
            kept = self.book.get(*key) if key[0] != OWN else None
            if kept is not None or not missing:
                self._finish(profiling, jobs, records, kept, required, now)
                continue
            jobs.sort(key=lambda j: (j.spec.submit_time, j.sia_id))
            for job in jobs:
                if job is not jobs[0] and not job.phase.holds_gpus:
                    waiting[job.sia_id] = (
                        f"{PROFILING_NOTE} waits for job {jobs[0].sia_id}'s profile of {key[1]}"
                    )
                    continue
                self._offer(profiling, job, records[job.sia_id], site_types, missing)
        return waiting

    def assigned(self, actions: Iterable[Action], records: Mapping[str, JobRecord]) -> None:
        """Record the type of each profiling run this round starts or moves a job onto as
        given to it, when the action is decided: seen only in a later snapshot, a run whose node
        died before that snapshot was never seen there, and its honest measurement of the type
        was refused as a type it was never given (then measured again: a live test at load)."""
        for action in actions:
            if not isinstance(action, Start | Move) or not action.profile_sweep:
                continue
            record = records.get(action.sia_id)
            if record is None or record.profiling not in self.profilings:
                continue
            profiling = self.profilings[record.profiling]  # type: ignore[index]
            gpu_type = self.profile_type(action.config.gpu_type)
            profiling.given.setdefault(action.sia_id, set()).add(gpu_type)

    def _offer(
        self,
        profiling: Profiling,
        job: JobSnapshot,
        record: JobRecord,
        site_types: Collection[str],
        missing: list[str],
    ) -> None:
        """The GPU types ``job`` may run on: one not measured yet, not the one whose
        measurement this very run had refused (it is measured again in another run), none
        once a type was refused :data:`MAX_REFUSALS` times (held: it waits, with the reason).
        A job on a type it is measuring keeps it until the measurement arrives."""
        record.profile_left = frozenset(t for t in site_types if self.profile_type(t) in missing)
        current = self._now_type(job)
        refused = current is not None and profiling.refused_run.get(job.sia_id) == (
            job.restarts,
            current,
        )
        if profiling.held_types():
            allowed: frozenset[str] = frozenset()
        elif current is not None and current in missing and not refused:
            # On a type it is measuring: it stays there until the measurement arrives (or is
            # refused, or the deadline passes); moved before, its sweep would be lost.
            assert job.config is not None
            allowed = frozenset({job.config.gpu_type})
        else:
            allowed = frozenset(t for t in site_types if self.profile_type(t) in missing)
            if refused:
                assert job.config is not None
                allowed -= {job.config.gpu_type}
        if record.profile_types != allowed:
            types = sorted({self.profile_type(t) for t in allowed}) or missing
            record.estimator = provisional_estimator(
                profiling.limits, types, self.factory.type_aliases, self.expected_speed
            )
            record.profile_types = allowed

    def describe(self, record: JobRecord) -> str:
        """Where ``record``'s profiling stands, for its decision (status, explain)."""
        profiling = self.profilings.get(record.profiling) if record.profiling else None
        if profiling is None:
            return ""
        measured = ", ".join(sorted(profiling.measured)) or "none"
        if profiling.held_types():
            return (
                f"{PROFILING_NOTE} held: measurements refused {MAX_REFUSALS} times "
                f"({profiling.said}); submit it again, or with a profile"
            )
        left = ", ".join(sorted(record.profile_left)) or "-"
        said = f"; last refused: {profiling.said}" if profiling.said else ""
        return f"{PROFILING_NOTE} measured {measured}; to measure {left}{said}"

    def _now_type(self, job: JobSnapshot) -> str | None:
        if job.phase.holds_gpus and job.config is not None:
            return self.profile_type(job.config.gpu_type)
        return None

    def _take(self, profiling: Profiling, job: JobSnapshot, now: float) -> None:
        """Record the type ``job`` runs on as given, take in its document, and refuse a run
        that measured nothing within :attr:`deadline_s` of its start."""
        current = self._now_type(job)
        run = (job.restarts, current) if current is not None else None
        if run is not None:
            profiling.given.setdefault(job.sia_id, set()).add(run[1])
            since = profiling.on_since.get(job.sia_id)
            if since is None or (since[0], since[1]) != run:
                profiling.on_since[job.sia_id] = (run[0], run[1], now)
        if job.profiled_problem:
            profiling.take_unreadable(job.sia_id, job.profiled_problem, run, job.profiled_version)
        elif job.profiled_document is not None:
            why = profiling.take(
                job.sia_id,
                job.profiled_document,
                self.factory.profiles.gpu_types,
                run,
                job.profiled_version,
            )
            if why:
                logger.warning("job %s: profile refused: %s", job.sia_id, why)
        if run is None or run[1] in profiling.measured:
            return
        if profiling.refused_run.get(job.sia_id) == run:
            return
        started = profiling.on_since[job.sia_id][2]
        if now - started > self.deadline_s:
            profiling.refuse(
                job.sia_id,
                run,
                f"nothing measured on {run[1]} within {self.deadline_s:.0f} s of the run's "
                f"start (does the script train with sia-slurm's elastic wrappers?)",
            )

    def _finish(
        self,
        profiling: Profiling,
        jobs: list[JobSnapshot],
        records: Mapping[str, JobRecord],
        kept: Mapping[str, Any] | None,
        required: Collection[str],
        now: float,
    ) -> None:
        """Every job of the key gets its goodput model from the profile: the one kept (another
        controller's, or one measured before), else the one just measured, checked and kept."""
        document = kept
        if document is None:
            who = ", ".join(sorted(profiling.given)) or jobs[0].sia_id
            document = profiling.document(now, f"job {who}")
            profile = profile_from_json(
                document, "measured profile", self.factory.profiles.gpu_types
            )
            problems = measured_problems(profile, required)
            if problems:  # every type was checked when taken: a bug if this ever says anything
                raise ValueError(f"measured profile of {profiling.key}: {'; '.join(problems)}")
            if profiling.key[0] != OWN:
                self.book.put(*profiling.key, document, profiling.meta(now, who))
            logger.info(
                "profile of %s measured by %s on %s",
                profiling.key[1] or jobs[0].sia_id,
                who,
                ", ".join(sorted(profiling.measured)),
            )
        for job in jobs:
            record = records[job.sia_id]
            record.estimator = self.factory(job.spec, document)
            record.profile_document = document
            record.profiling = None
            record.profile_types = None
            record.profile_left = frozenset()
            record.profiling_restarts = job.restarts  # not the policy's restarts
        self.profilings.pop(profiling.key, None)
