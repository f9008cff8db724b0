"""Finish-time fairness: each job's JCT on the shared cluster over its JCT alone on an equal share.

Themis (Mahajan et al., NSDI 2020) calls a job treated fairly when it finishes no later than it
would have on its own slice of the cluster: ``rho = T_shared / T_independent``, with
``T_independent`` the job's completion time on an independent ``1/N`` share of the cluster and
``N`` the number of jobs contending for it. ``rho <= 1`` is fair, ``rho > 1`` unfair. Themis
averages ``N`` over the job's life, since contention changes while a job waits and runs; Gavel's
finish-time-fairness policy takes the same ratio with the jobs of the current round. This module
computes ``T_independent`` after a simulation, from the simulator's own ground truth, so that
``rho`` is a property of the run and not of any policy's model:

* ``T_shared``: the job's JCT in the run (completion - submission).
* ``N``: :attr:`~sia_slurm.sim.artifact_metrics.JobOutcome.contention`, the mean number of
  active (submitted, unfinished) jobs, the job itself included, over the rounds it was active
  in: Themis's average over the job's life, sampled once a round. ``N >= 1``.
* **Equal share** on a cluster of several GPU types: ``1/N`` of each type's GPUs,
  ``s_t = G_t / N`` (a real number). A job runs on one GPU type at a time, so it takes the best
  type its share gives and leaves the other types' slices unused (Gavel's isolated allocation
  instead time-slices the job over every type's slice; one job here never runs on two types,
  and a move between them costs a restart). On type ``t`` the job may hold ``k`` GPUs, any
  count from 1 to ``ceil(s_t)`` (within the job's own limits, below), on the fewest nodes
  (``ceil(k / gpus_per_node)``): ``k <= s_t`` all the time, a larger ``k`` a fraction
  ``s_t / k`` of the time, so that it never holds more than ``s_t`` GPUs on average. The share is
  thus a share of GPU-time, as Themis's ``1/N`` is: with more jobs than GPUs (``s_t < 1``) a job
  has one GPU part of the time, not one GPU to itself, which would make every job of a busy
  cluster look unfair.
* **Work** ``W(t, k)``: the time the job's training takes at ``k`` GPUs of type ``t``, with the
  best batch size at every point of its progress (a batch change costs no restart in the
  simulator): ``W = integral over progress p from 0 to the completion target of
  dp / max_M rate(M, p)``, ``rate`` being the simulator's (:mod:`sia_slurm.sim.progress`:
  measured step and sync time of the shape and per-GPU batch, true gradient statistics of the
  validation curve of the batch nearest ``M``, the app's calibration). The candidate batches are
  the policy's (:func:`~sia_slurm.model.batch.candidate_batch_sizes`: ~50 geometric between
  ``max(M0, min_local_bsz * k)`` and the largest batch, split into the fewest accumulation steps
  that fit the type's largest per-GPU batch), with ``min_local_bsz`` and the per-GPU limit the
  smallest and largest per-GPU batch the ground truth measured on one GPU of the type (the same
  numbers as the profiles' ``min_local_bsz`` and ``max_local_bsz``). Adaptive jobs choose
  ``k`` and ``M``; a job of another kind keeps its fixed batch (strong-scaling), its fixed count
  (rigid) or its type too (pinned), as reference section 4 says.
* ``T_independent = restart + min over t, k of W(t, k) / min(1, s_t / k)``: the restart delay the
  simulator charges a first start, counted once (the job starts once and never moves).

The integral is a trapezoid rule over the validation curves' own progress points and 1,024
equal steps, on which the statistics are piecewise linear; it agrees with the simulator's
midpoint rule to well under 1% (``tests/sim/test_finish_time_fairness.py``). Profiling time
(``SimulationConfig.profiling``) is not part of ``T_independent``: the job alone is taken to
know its model, as with profiling off.

What ``rho`` includes by construction: a job alone on the cluster (``N = 1``) still has
``rho > 1`` by its waits for a round boundary, the growth cap's ramp (Sia starts every job on
one GPU) and the restarts of each resize, so a fraction of jobs with ``rho > 1`` counts those
too, and jobs are never compared with a schedule that is itself feasible for all of them at
once.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from sia_slurm.core import JobKind
from sia_slurm.model.batch import BatchLimits, candidate_batch_sizes, split_batch
from sia_slurm.protocol import JobSpec
from sia_slurm.sim.apptruth import AppTruth
from sia_slurm.sim.artifact_metrics import JobOutcome
from sia_slurm.sim.clusterfile import ClusterGpuType, ClusterSpec
from sia_slurm.sim.progress import true_gain
from sia_slurm.sim.simulated_cluster import SimJobSpec

FloatArray = npt.NDArray[np.float64]

GRID_STEPS = 1024  # equal progress steps of the integral, besides the curves' own points


class IndependentTimes:
    """``T_independent`` of jobs on one cluster (module doc); work times are cached per
    (app truth, batch rule, GPU type, GPU count), since they do not depend on ``N``."""

    def __init__(self, cluster: ClusterSpec) -> None:
        self.cluster = cluster
        self._work: dict[tuple[int, int, int, int, str, int], float] = {}
        self._truths: dict[int, AppTruth] = {}  # keeps the ids of the cache's keys in use

    def seconds(self, spec: JobSpec, truth: AppTruth, contention: float) -> float:
        """``T_independent`` of a job that saw ``contention`` active jobs on average;
        ``inf`` if no GPU type of the cluster can run it."""
        if not contention >= 1:
            raise ValueError(f"contention: expected a mean of >= 1 active jobs, got {contention}")
        best = math.inf
        for gpu_type in self.cluster.gpu_types:
            if spec.kind is JobKind.PINNED and spec.requested_gpu_type not in (
                None,
                gpu_type.name,
            ):
                continue
            share = gpu_type.gpus / contention
            for gpus in self._counts(spec, truth, gpu_type, share):
                work = self.work_seconds(spec, truth, gpu_type, gpus)
                best = min(best, work / min(1.0, share / gpus))
        return self._restart_s(truth) + best

    def _counts(
        self, spec: JobSpec, truth: AppTruth, gpu_type: ClusterGpuType, share: float
    ) -> range:
        """GPU counts the job may hold on ``gpu_type`` within a share of ``share`` GPUs."""
        if spec.kind in (JobKind.RIGID, JobKind.PINNED):
            low = high = spec.requested_gpus
        else:
            min_local, _ = truth.speed[gpu_type.name].local_bsz_range(1, 1)
            low = spec.min_gpus
            high = _max_batch(spec, truth) // max(int(min_local), 1)
            if spec.kind is not JobKind.ADAPTIVE:
                high = _fixed_batch(spec, truth)  # at least one sample per GPU
            if spec.max_gpus is not None:
                high = min(high, spec.max_gpus)
            high = min(high, max(math.ceil(share - 1e-9), low))
        return range(low, min(high, gpu_type.gpus) + 1)

    def work_seconds(
        self, spec: JobSpec, truth: AppTruth, gpu_type: ClusterGpuType, gpus: int
    ) -> float:
        """``W(t, k)``: seconds of training to completion at ``gpus`` GPUs of ``gpu_type``,
        the best batch at every point of progress (``inf`` if no batch fits)."""
        fixed = 0 if spec.kind is JobKind.ADAPTIVE else _fixed_batch(spec, truth)
        m0 = spec.init_batch_size or truth.init_batch_size
        key = (id(truth), fixed, m0, _max_batch(spec, truth), gpu_type.name, gpus)
        if key not in self._work:
            self._truths.setdefault(id(truth), truth)
            self._work[key] = _work_seconds(truth, gpu_type, gpus, fixed, m0, key[3])
        return self._work[key]

    def _restart_s(self, truth: AppTruth) -> float:
        """The delay of a first start, as :class:`SimulatedCluster` charges it."""
        restart = self.cluster.restart
        return truth.restart.true_s if restart is None else restart.start_s


def _max_batch(spec: JobSpec, truth: AppTruth) -> int:
    return spec.max_batch_size or max(truth.stats.batch_sizes)


def _fixed_batch(spec: JobSpec, truth: AppTruth) -> int:
    return spec.requested_batch_size or spec.init_batch_size or truth.init_batch_size


def _work_seconds(
    truth: AppTruth,
    gpu_type: ClusterGpuType,
    gpus: int,
    fixed_batch: int,
    init_batch_size: int,
    max_batch_size: int,
) -> float:
    speed = truth.speed[gpu_type.name]
    min_local, max_local = speed.local_bsz_range(1, 1)
    if fixed_batch:
        candidates = np.array([float(fixed_batch)])
    else:
        limits = BatchLimits(init_batch_size, max_batch_size, int(min_local))
        grid, feasible = candidate_batch_sizes(gpus, limits)
        if not feasible[0]:
            return math.inf
        candidates = grid[0]
    local_bsz, accum = split_batch(candidates, gpus, max_local)
    if not fixed_batch:  # round down where rounding up passed the largest batch, as the policy
        over = gpus * local_bsz * (accum + 1) > max_batch_size
        local_bsz = np.where(over, local_bsz - 1, local_bsz)
    ok = local_bsz >= 1
    if not ok.any():
        return math.inf
    local_bsz, accum = local_bsz[ok], accum[ok]
    batch = gpus * local_bsz * (accum + 1)
    nodes = math.ceil(gpus / gpu_type.gpus_per_node)
    t_iter = speed.iteration_time(nodes, gpus, local_bsz, accum)
    app_m0 = truth.init_batch_size  # progress and statistics are measured at the app's M0
    base_rate = app_m0 / (t_iter * truth.calibration)
    scale = batch / app_m0
    progress = _progress_grid(truth)
    rate = np.zeros((batch.size, progress.size))
    for i, m in enumerate(batch.tolist()):
        sqr, var = truth.stats.curve_for(m).at(progress)
        rate[i] = base_rate[i] * true_gain(sqr, var, np.float64(scale[i]))
    best = rate.max(axis=0)
    return float(np.trapezoid(1.0 / best, progress))


def _progress_grid(truth: AppTruth) -> FloatArray:
    """0 to the completion target: the validation curves' points and equal steps."""
    target = truth.completion_samples
    points = [np.linspace(0.0, target, GRID_STEPS + 1)]
    points += [curve.progress for curve in truth.stats.curves.values()]
    grid = np.unique(np.concatenate(points))
    return grid[(grid >= 0.0) & (grid <= target)]


def with_independent_times(
    outcomes: Sequence[JobOutcome], jobs: Sequence[SimJobSpec], cluster: ClusterSpec
) -> list[JobOutcome]:
    """``outcomes`` with :attr:`JobOutcome.independent_s` set (jobs in the same order; ``None``
    for a job no GPU type can run; a job never seen active counts as alone, ``N = 1``)."""
    times = IndependentTimes(cluster)
    result = []
    for outcome, job in zip(outcomes, jobs, strict=True):
        if outcome.name != job.spec.sia_id:
            raise ValueError(f"outcome {outcome.name!r} given for job {job.spec.sia_id!r}")
        seconds = times.seconds(job.spec, job.truth, max(outcome.contention, 1.0))
        finite = seconds if math.isfinite(seconds) else None
        result.append(replace(outcome, independent_s=finite))
    return result
