"""A job's goodput estimator with Sia's bootstrapped per-GPU-type throughput models.

Reference section 3. Sia fits one throughput model per (job, GPU type) from the steps that type
has actually run, seeded by a 1-GPU profile of every type taken at arrival. Until a type has run
the job on more than one GPU, its multi-GPU goodput is projected from a type B that has::

    goodput(A, n, K) = goodput(B, n, K) * xput1(A) / xput1(B)

where ``xput1(t)`` is the best measured 1-GPU throughput on type t. After its first multi-GPU run,
type A's own model is used. If no type has multi-GPU data yet, each type's own model (fitted to
1-GPU data only, so with zero network cost) predicts linear scaling. This module fits the
types' models and caches their grids; the projection itself, over arrays, is
:mod:`sia_slurm.model.bootstrap`.

Gradient statistics are a property of the model and data, not the hardware, so one
:class:`GradientStats` is shared by every type (a measurement on any type informs all of them).

:class:`JobGoodputEstimator` implements :class:`sia_slurm.core.GoodputEstimator`. It is mutable on
purpose: the controller and the simulator feed it measurements (:meth:`observe`,
:meth:`update_grad_stats`) as the job runs, and policies only call :meth:`evaluate`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields

import numpy as np
import numpy.typing as npt

from sia_slurm.core import Configuration, GoodputRow
from sia_slurm.model.batch import (
    DEFAULT_NUM_CANDIDATES,
    BatchLimits,
    CandidateGrid,
    RowLimits,
    choose_batch,
    choose_batch_rows,
)
from sia_slurm.model.bootstrap import PlanInputs, TypeTable, plan_inputs, projected_grid
from sia_slurm.model.efficiency import NO_STATS, GradientStats
from sia_slurm.model.fit import Observation, fit_observations
from sia_slurm.model.throughput import ThroughputParams
from sia_slurm.protocol.profile import AppProfile

_PLAN_CACHE_SIZE = 8
# A repeated measurement of a known shape triggers a refit only when it moves that shape's mean
# step time by more than this fraction: jobs report every ~30 s, and refitting (and re-planning)
# every job every round for timer noise would cost more than it could change a decision.
REFIT_TOLERANCE = 0.02
# evaluate_jobs works through jobs in slices of at most this many grid cells (128 KiB per float64
# array): large enough to amortise numpy's per-call overhead, small enough that the arrays stay in
# cache and below glibc's mmap threshold, so temporaries are recycled rather than mapped fresh and
# page-faulted on every call (measured, 1000 jobs x 20 configs x 50 candidates: ~35 ms per cold
# call at 16k cells, ~55 ms at 25k-100k cells).
_CHUNK_ELEMENTS = 16_384
# Stand-in parameters for configurations the job cannot use; their throughput is masked to 0.
_UNUSABLE = ThroughputParams(1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0)


@dataclass(frozen=True)
class TypeModel:
    """A job's fitted throughput model on one GPU type, with what the bootstrap needs about it."""

    gpu_type: str
    params: ThroughputParams
    max_local_bsz: int
    xput1: float  # best 1-GPU throughput, samples/s
    multi_gpu_shapes: int  # distinct observed (nodes, gpus, local_bsz) shapes with gpus > 1

    @property
    def has_multi_gpu_data(self) -> bool:
        """Whether this type's own model has seen a multi-GPU run (else it is projected)."""
        return self.multi_gpu_shapes > 0


class _RowKey:
    """Cache key for a configuration list; hashes once (Configuration hashes are not cached)."""

    __slots__ = ("_hash", "configs", "fixed_batch")

    def __init__(self, configs: Sequence[Configuration], fixed_batch: bool) -> None:
        self.configs = tuple(configs)
        self.fixed_batch = fixed_batch
        self._hash = hash((self.configs, fixed_batch))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _RowKey)
            and self._hash == other._hash
            and self.fixed_batch == other.fixed_batch
            and self.configs == other.configs
        )


@dataclass
class _ShapeMean:
    """Running mean of repeated measurements of one shape, and the mean the model last saw."""

    count: int
    step_time: float
    sync_time: float
    fitted_step_time: float


@functools.lru_cache(maxsize=4096)
def _fit_memo(observations: tuple[Observation, ...]) -> ThroughputParams:
    """Fits are deterministic, and every new job of an app starts from the same seed profile, so
    identical point sets are fitted once per process rather than once per job."""
    return fit_observations(observations)


class JobGoodputEstimator:
    """Goodput of one job on any (GPU type, nodes, GPUs), with the best batch size for each.

    Build it with :meth:`from_profile` (1-GPU seed profiles and limits from ``profiles/``), then
    feed it the job's measurements; :meth:`evaluate` scores a policy's row of configurations.
    """

    def __init__(
        self,
        max_local_bsz: Mapping[str, int],
        limits: BatchLimits,
        *,
        seed: Mapping[str, Sequence[Observation]] | None = None,
        grad_stats: GradientStats | None = None,
        fixed_batch_size: int | None = None,
        type_aliases: Mapping[str, str] | None = None,
        num_candidates: int = DEFAULT_NUM_CANDIDATES,
    ) -> None:
        for name, limit in max_local_bsz.items():
            if limit < 1:
                raise ValueError(f"max_local_bsz[{name}]: expected a positive integer, got {limit}")
        self._max_local_bsz = dict(max_local_bsz)
        self._limits = limits
        self._grad_stats = grad_stats if grad_stats is not None else NO_STATS
        self._fixed_batch_size = fixed_batch_size or limits.init_batch_size
        self._aliases = dict(type_aliases or {})
        self._num_candidates = num_candidates
        self._points: dict[str, dict[tuple[int, int, int], _ShapeMean]] = {}
        self._models: dict[str, TypeModel] = {}
        self._dirty: set[str] = set()
        self._table: TypeTable | None = None
        self._plans: dict[_RowKey, CandidateGrid] = {}
        for gpu_type, observations in (seed or {}).items():
            self.observe_many(gpu_type, observations)

    @classmethod
    def from_profile(
        cls,
        profile: AppProfile,
        *,
        init_batch_size: int | None = None,
        max_batch_size: int | None = None,
        min_local_bsz: int | None = None,
        fixed_batch_size: int | None = None,
        grad_stats: GradientStats | None = None,
        type_aliases: Mapping[str, str] | None = None,
        num_candidates: int = DEFAULT_NUM_CANDIDATES,
    ) -> JobGoodputEstimator:
        """An estimator for a new job of ``profile``'s app, seeded with its 1-GPU profiles.

        Keyword arguments override the app's defaults for this job (e.g. the job's own M0).
        ``type_aliases`` maps site GPU type names (as they appear in configurations) to profile
        type names, e.g. ``{"a100": "dgx"}``; unmapped names are used as they are.
        """
        limits = BatchLimits(
            init_batch_size=init_batch_size or profile.init_batch_size,
            max_batch_size=max_batch_size or profile.max_batch_size,
            min_local_bsz=min_local_bsz or profile.min_local_bsz,
        )
        return cls(
            profile.max_local_bsz,
            limits,
            seed=profile.seed,
            grad_stats=grad_stats,
            fixed_batch_size=fixed_batch_size,
            type_aliases=type_aliases,
            num_candidates=num_candidates,
        )

    # ----------------------------------------------------------------------------------------
    # Feeding measurements

    @property
    def limits(self) -> BatchLimits:
        """The job's batch-size bounds (M0, max_batch_size, min_local_bsz)."""
        return self._limits

    @property
    def grad_stats(self) -> GradientStats:
        """Current gradient statistics, shared by every GPU type."""
        return self._grad_stats

    def update_grad_stats(self, stats: GradientStats) -> None:
        """Replace the gradient statistics (reported by the job on whatever type it runs)."""
        self._grad_stats = stats

    def observe(self, gpu_type: str, observation: Observation) -> None:
        """Record a measured step on ``gpu_type``; that type's model is refitted when next used."""
        self.observe_many(gpu_type, (observation,))

    def observe_many(self, gpu_type: str, observations: Iterable[Observation]) -> None:
        """Record several measured steps on one type.

        Repeated measurements of a shape (nodes, GPUs, local batch) are averaged. The type's
        model is refitted, lazily at the next use, after a new shape or a material change of a
        known shape's mean (see ``REFIT_TOLERANCE``).
        """
        name = self._profile_type(gpu_type)
        if name not in self._max_local_bsz:
            known = ", ".join(sorted(self._max_local_bsz))
            raise ValueError(f"gpu_type: expected one of {known}, got {gpu_type!r}")
        points = self._points.setdefault(name, {})
        changed = False
        for obs in observations:
            mean = points.get(obs.shape)
            if mean is None:
                points[obs.shape] = _ShapeMean(1, obs.step_time, obs.sync_time, obs.step_time)
                changed = True
                continue
            mean.count += 1
            mean.step_time += (obs.step_time - mean.step_time) / mean.count
            mean.sync_time += (obs.sync_time - mean.sync_time) / mean.count
            drift = abs(mean.step_time - mean.fitted_step_time) / mean.fitted_step_time
            changed = changed or drift > REFIT_TOLERANCE
        if not changed:
            return
        self._dirty.add(name)
        self._table = None
        self._plans.clear()

    # ----------------------------------------------------------------------------------------
    # Models

    def _profile_type(self, gpu_type: str) -> str:
        return self._aliases.get(gpu_type, gpu_type)

    def type_model(self, gpu_type: str) -> TypeModel | None:
        """The job's own model on ``gpu_type`` (None if the type has no measurement at all)."""
        name = self._profile_type(gpu_type)
        if name in self._dirty:
            self._models[name] = self._fit(name)
            self._dirty.discard(name)
        return self._models.get(name)

    def _fit(self, name: str) -> TypeModel:
        shapes = self._points[name]
        for mean in shapes.values():
            mean.fitted_step_time = mean.step_time
        observations = [
            Observation(n, k, m, mean.step_time, mean.sync_time)
            for (n, k, m), mean in sorted(shapes.items())
        ]
        params = _fit_memo(tuple(observations))
        single = [o for o in observations if o.gpus == 1]
        if single:
            xput1 = max(o.local_bsz / o.step_time for o in single)
        else:  # only multi-GPU runs: fall back to the model's 1-GPU prediction
            m = self._max_local_bsz[name]
            xput1 = m / (params.alpha_c + params.beta_c * m)
        return TypeModel(
            gpu_type=name,
            params=params,
            max_local_bsz=self._max_local_bsz[name],
            xput1=float(xput1),
            multi_gpu_shapes=sum(1 for o in observations if o.gpus > 1),
        )

    def reference_type(self) -> str | None:
        """Type B whose multi-GPU model projects types without multi-GPU data, if any.

        The type with the most distinct multi-GPU shapes (its network terms are best identified);
        ties go to the higher 1-GPU throughput, then the name, so the choice is deterministic.
        """
        best: tuple[int, float, str] | None = None
        for name in sorted(self._points):
            if not any(k > 1 for _, k, _ in self._points[name]):
                continue  # cheap pre-check: do not fit types that cannot be the reference
            model = self.type_model(name)
            if model is None or not model.has_multi_gpu_data:
                continue
            key = (model.multi_gpu_shapes, model.xput1, name)
            if best is None or key[:2] > best[:2]:
                best = key
        return best[2] if best else None

    # ----------------------------------------------------------------------------------------
    # Evaluation

    def evaluate(
        self, configs: Sequence[Configuration], *, fixed_batch: bool = False
    ) -> GoodputRow:
        """Predicted goodput and best batch for each configuration (see :class:`GoodputRow`).

        ``fixed_batch`` evaluates the job's fixed batch size only (strong-scaling and rigid jobs).
        The batch-independent part is cached per configuration list until the next measurement,
        so a policy calling every round with the same list pays only for the efficiency step.
        """
        key = _RowKey(configs, fixed_batch)
        grid = self._plans.get(key)
        if grid is None:
            grid = self._plan(key.configs, fixed_batch)
            if len(self._plans) >= _PLAN_CACHE_SIZE:
                self._plans.clear()
            self._plans[key] = grid
        return choose_batch(grid, self._grad_stats, self._limits.init_batch_size)

    @staticmethod
    def evaluate_many(
        estimators: Sequence[JobGoodputEstimator],
        configs: Sequence[Configuration],
        *,
        fixed_batch: bool = False,
    ) -> list[GoodputRow]:
        """``[e.evaluate(configs, fixed_batch=...) for e in estimators]``, the same rows, in one
        numpy pass per candidate count (:func:`evaluate_jobs`): how a policy scores the many
        jobs that share a configuration list in one call."""
        rows: list[GoodputRow | None] = [None] * len(estimators)
        by_count: dict[int, list[int]] = {}
        for i, estimator in enumerate(estimators):
            by_count.setdefault(estimator._num_candidates, []).append(i)
        for members in by_count.values():
            batch = evaluate_jobs(
                [estimators[i] for i in members], configs, fixed_batch=fixed_batch
            )
            for i, row in zip(members, batch, strict=True):
                rows[i] = row
        return rows  # type: ignore[return-value]

    def _type_table(self) -> TypeTable:
        """Every fitted type as rows of arrays, so a row of configurations indexes, not loops."""
        if self._table is None:
            names = sorted(self._points)
            models = [self.type_model(name) for name in names]
            reference = self.reference_type()
            usable = [m for m in models if m is not None]
            params = [m.params for m in usable] + [_UNUSABLE]
            self._table = TypeTable(
                index={m.gpu_type: i for i, m in enumerate(usable)},
                params=np.array([p.to_array() for p in params]),
                xput1=np.array([m.xput1 for m in usable] + [1.0]),
                max_local_bsz=np.array([m.max_local_bsz for m in usable] + [0], dtype=np.int64),
                multi_gpu=np.array([m.has_multi_gpu_data for m in usable] + [False]),
                reference=[m.gpu_type for m in usable].index(reference) if reference else -1,
            )
        return self._table

    def _plan(self, configs: tuple[Configuration, ...], fixed_batch: bool) -> CandidateGrid:
        """Candidate grid with throughput for each configuration, bootstrap projection applied."""
        fixed = self._fixed_batch_size if fixed_batch else None
        return projected_grid(
            _plan_inputs((self,), configs), self._limits, fixed, self._num_candidates
        )


def _plan_inputs(
    jobs: Sequence[JobGoodputEstimator], configs: tuple[Configuration, ...]
) -> PlanInputs:
    """:func:`~sia_slurm.model.bootstrap.plan_inputs` of these jobs' type tables and aliases."""
    return plan_inputs([job._type_table() for job in jobs], [job._aliases for job in jobs], configs)


def evaluate_jobs(
    jobs: Sequence[JobGoodputEstimator],
    configs: Sequence[Configuration],
    *,
    fixed_batch: bool = False,
) -> list[GoodputRow]:
    """``[job.evaluate(configs, fixed_batch=fixed_batch) for job in jobs]`` in one numpy pass.

    Same results as the per-job calls (and the same per-job caches), but the rows of all jobs
    are evaluated as one (jobs x configurations, candidates) array, which removes the per-call
    numpy overhead that dominates for small rows. This is how a policy builds Sia's goodput
    matrix G[job, config] for a round; call it once for adaptive jobs and once, with
    ``fixed_batch=True``, for strong-scaling and rigid ones.

    The per-job inputs (plan inputs of the jobs whose grid is not cached, statistics) are
    gathered once for all jobs; the grid arithmetic then runs over slices of jobs whose arrays
    stay small (see ``_CHUNK_ELEMENTS``). A slice whose jobs all need a new grid is chosen from
    straight from it, without a round trip through the per-job caches.
    """
    key = _RowKey(configs, fixed_batch)
    count = len(key.configs)
    is_cold = [key not in job._plans for job in jobs]
    cold = [job for job, flag in zip(jobs, is_cold, strict=True) if flag]
    if len({job._num_candidates for job in cold}) > 1:
        raise ValueError("evaluate_jobs needs jobs with the same num_candidates")
    plans = _ColdPlans.gather(cold, key) if cold else None
    stats = np.array(
        [(j._grad_stats.grad_sqr, j._grad_stats.grad_var, j._limits.init_batch_size) for j in jobs]
    ).reshape(len(jobs), 3)
    grad_sqr, grad_var, init_batch_size = (np.repeat(stats[:, i], count) for i in range(3))
    width = max(count, 1) * max((job._num_candidates for job in jobs), default=1)
    step = max(1, _CHUNK_ELEMENTS // width)
    rows: list[GoodputRow] = []
    built = 0
    for start in range(0, len(jobs), step):
        part = jobs[start : start + step]
        fresh = sum(is_cold[start : start + step])
        if fresh:
            assert plans is not None
            grid = plans.build(built, built + fresh)
            built += fresh
        if fresh < len(part):
            grid = _cached_grid(part, key)
        cells = slice(start * count, (start + len(part)) * count)
        row = choose_batch_rows(
            grid, grad_sqr[cells, None], grad_var[cells, None], init_batch_size[cells, None]
        )
        per_job = [getattr(row, f.name).reshape(len(part), count) for f in fields(GoodputRow)]
        rows += [GoodputRow(*values) for values in zip(*per_job, strict=True)]
    return rows


@dataclass(frozen=True)
class _ColdPlans:
    """Everything :func:`evaluate_jobs` needs to build the grids of jobs without a cached one."""

    jobs: Sequence[JobGoodputEstimator]
    key: _RowKey
    inputs: PlanInputs
    limits: RowLimits
    fixed_batch_size: npt.NDArray[np.int64] | None

    @classmethod
    def gather(cls, jobs: Sequence[JobGoodputEstimator], key: _RowKey) -> _ColdPlans:
        """One pass over the jobs' type tables and limits, for all slices at once."""
        count = len(key.configs)
        fixed = [job._fixed_batch_size for job in jobs] if key.fixed_batch else None
        return cls(
            jobs=jobs,
            key=key,
            inputs=_plan_inputs(jobs, key.configs),
            limits=RowLimits.repeat([job._limits for job in jobs], count),
            fixed_batch_size=None if fixed is None else np.repeat(fixed, count),
        )

    def build(self, first: int, stop: int) -> CandidateGrid:
        """Grids of jobs ``first:stop``, cached in each job; returns them as one grid."""
        count = len(self.key.configs)
        cells = slice(first * count, stop * count)
        jobs = self.jobs[first:stop]
        fixed = None if self.fixed_batch_size is None else self.fixed_batch_size[cells]
        grid = projected_grid(
            self.inputs.rows(cells), self.limits.rows(cells), fixed, jobs[0]._num_candidates
        )
        per_job = (
            grid.batch_size.reshape(len(jobs), count, -1),
            grid.local_bsz.reshape(len(jobs), count, -1),
            grid.accum_steps.reshape(len(jobs), count, -1),
            grid.throughput.reshape(len(jobs), count, -1),
        )
        for job, *arrays in zip(jobs, *per_job, strict=True):
            if len(job._plans) >= _PLAN_CACHE_SIZE:
                job._plans.clear()
            job._plans[self.key] = CandidateGrid(*arrays)
        return grid


def _cached_grid(jobs: Sequence[JobGoodputEstimator], key: _RowKey) -> CandidateGrid:
    """The cached grids of ``jobs`` as one grid."""
    grids = [job._plans[key] for job in jobs]
    return CandidateGrid(
        np.concatenate([g.batch_size for g in grids]),
        np.concatenate([g.local_bsz for g in grids]),
        np.concatenate([g.accum_steps for g in grids]),
        np.concatenate([g.throughput for g in grids]),
    )
