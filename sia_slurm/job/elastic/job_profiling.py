"""The job side of a profiling run (``docs/profiling.md``): measure a new model on one GPU type.

A run whose assignment carries a ``profile_sweep`` (``SIA_PROFILE_SWEEP``) trains, before
anything else, one warm-up step and ``SIA_PROFILE_STEPS`` measured steps at each per-GPU
batch of the sweep in turn (``Batch(b, b, 0)`` on its one replica). These are real training
steps: the optimizer steps, the sampler advances and the step counter counts them, so the
sweep costs the job nothing but the batch size it trains at for a few dozen steps. Their
times are the ones :meth:`MetricsReporter.record` takes (the synchronising micro-batch, and
the all-reduce wait after it, about 0 on one GPU).

The sweep stops at the first batch that does not fit:

* on the dev cluster a batch above the type's emulated memory (``SIA_DEVCLUSTER_MEMORY``,
  :func:`sia_slurm.job.elastic.devspeed.emulated_memory`) is not tried at all;
* on CUDA, an out-of-memory error raised where the job's own code surrounds the work
  (:meth:`ElasticJob.absorb_out_of_memory`: ``Step.backward``/``Step.finish`` of
  :class:`~sia_slurm.job.elastic.ElasticTrainer`, the Lightning strategy's training step and
  backward) is caught: the gradients are freed, DDP's reducer reset, the step dropped
  (neither counted nor advancing the sampler: its samples are trained again at the next
  batch) and the batch before is the type's largest. An error raised in the user's own code
  (the forward or ``loss.backward()`` of a plain DDP loop, or the forward pass under
  ``ElasticTrainer``, where no wrapper could return a result) ends the process like any
  exception. Rank 0 wrote :data:`TRYING_FILE` in the checkpoint directory before the batch
  was first tried, so the next run finds it and takes that batch as not fitting: a run that
  died during a try is assumed to have run out of memory (a node failure during a sweep
  therefore costs the type its largest batch).

Then rank 0 writes ``jobs/<id>/profiled.json`` (``sia_slurm/protocol/profile_json.py``'s
document) with every type this job measured so far, which the checkpoint keeps
(:meth:`JobProfiling.state_dict`), saves a checkpoint so the measurement survives a crash,
and trains on at the assignment's batch, split into accumulation steps if its per-GPU batch
exceeds the one measured. A stop, termination or completion in the middle drops the partial
sweep: the type is measured again by the next run. A run whose type the checkpoint already
has, or that has several replicas, does not sweep.
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from sia_slurm.job.elastic.devspeed import emulated_memory
from sia_slurm.job.elastic.steps import Batch
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.protocol import StatePaths
from sia_slurm.protocol.observation import Observation
from sia_slurm.protocol.profile import AppProfile
from sia_slurm.protocol.profile_json import profile_to_json, undercut_batches
from sia_slurm.safefiles import write_json_atomic

logger = logging.getLogger(__name__)
TRYING_FILE = "profiling-try.json"  # in the checkpoint directory: the batch being tried
# Steps one batch may take without enough timed ones (an epoch's uneven last step is not
# timed; a dataset smaller than the batch never gives a timed step) before the sweep ends.
PATIENCE = 4
# A batch is timed over at least SIA_PROFILE_MIN_S (more steps than SIA_PROFILE_STEPS where
# steps are short, up to MAX_STEPS): steps of a few milliseconds are all noise one by one (a
# small model on a busy CPU measured 0.03 s at a per-GPU batch of 8, 0.013 s at 16, 3 steps
# each).
MAX_STEPS = 64

Timing = tuple[float, float]  # (step_time, sync_time) of one step, seconds


@dataclass(frozen=True)
class MeasuredType:
    """One GPU type's sweep: the largest per-GPU batch that fitted, each batch measured with
    its typical times (``(local_bsz, step_time, sync_time)``, :func:`typical_timing`), and who
    measured it when."""

    max_local_bsz: int
    points: tuple[tuple[int, float, float], ...]
    measured_by: str

    def to_state(self) -> dict[str, Any]:
        return {
            "max_local_bsz": self.max_local_bsz,
            "points": [list(point) for point in self.points],
            "measured_by": self.measured_by,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> MeasuredType:
        points = tuple((int(b), float(t), float(s)) for b, t, s in state["points"])
        return cls(int(state["max_local_bsz"]), points, str(state["measured_by"]))


# A timed step over this many times the median is an outlier (a checkpoint, a collection)
OUTLIER = 3.0


def typical_timing(times: list[Timing]) -> Timing:
    """The mean step and sync time of ``times``, less the steps over :data:`OUTLIER` times
    the median step.

    The mean, because that is what the job's reports carry (the means of each interval) and
    what its throughput is: on a busy machine most steps are quick and some are slowed by a
    neighbour (a transformer's 800 steps at load 12: median 28.5 ms, mean 33.7 ms), so a
    model built from the median predicts the job faster than its reports show. Less the outliers,
    because one step slowed by something else (a checkpoint, a garbage collection) must not
    make a small batch look slower than a larger one."""
    median = statistics.median(t for t, _ in times)
    kept = [(t, s) for t, s in times if t <= OUTLIER * median]
    return statistics.fmean(t for t, _ in kept), statistics.fmean(s for _, s in kept)


class ProfileSweep:
    """The sweep on one GPU type: which batch the next step runs at, each step's time, when a
    batch is done and when the sweep ends (no I/O: :class:`JobProfiling` does that).

    ``batches`` are the sweep's batches that may be tried (those above a known limit already
    removed); each gets one warm-up step and ``steps`` timed steps.
    """

    def __init__(
        self, gpu_type: str, batches: tuple[int, ...], steps: int, min_seconds: float = 0.0
    ):
        self.gpu_type = gpu_type
        self.min_seconds = min_seconds
        self.batches = batches
        self.steps = steps
        self.failed = False  # the batch being tried ran out of memory; its step is dropped
        self._index = 0
        self._taken = 0  # steps completed at the current batch, the warm-up included
        self._times: list[Timing] = []
        self._points: list[tuple[int, float, float]] = []
        self._running = bool(batches)

    @property
    def running(self) -> bool:
        return self._running

    @property
    def batch(self) -> Batch:
        """The batch the next step trains at (only while :attr:`running`)."""
        size = self.batches[self._index]
        return Batch(size, size, 0)

    def record(self, timing: Timing | None) -> None:
        """A step at :attr:`batch` completed (``timing``: ``None`` if it was not timed)."""
        self._taken += 1
        if self._taken > 1 and timing is not None:  # the first step at a batch warms up
            self._times.append(timing)
        timed = math.fsum(t for t, _ in self._times)
        enough = len(self._times) >= self.steps and (
            timed >= self.min_seconds or len(self._times) >= MAX_STEPS
        )
        if enough:
            step, sync = typical_timing(self._times)
            self._points.append((self.batches[self._index], step, min(sync, step * 0.999)))
            self._next()
        elif self._taken >= PATIENCE * (MAX_STEPS + 1):
            logger.warning(
                "profiling %s: no %d timed steps at a per-GPU batch of %d in %d steps; the "
                "sweep ends below it",
                self.gpu_type,
                self.steps,
                self.batches[self._index],
                self._taken,
            )
            self._running = False

    def out_of_memory(self) -> None:
        """The step at :attr:`batch` ran out of memory: it is dropped (:meth:`drop`)."""
        self.failed = True

    def drop(self) -> None:
        """The failed step was dropped: the batch before is the largest that fits."""
        self.failed = False
        self._running = False

    def _next(self) -> None:
        self._index += 1
        self._taken = 0
        self._times = []
        self._running = self._index < len(self.batches)

    def result(self, measured_by: str) -> MeasuredType | None:
        """What the sweep measured (``None``: not one batch): its largest batch that fitted,
        and its points less those of smaller batches that a larger batch undercuts beyond the
        controller's growth rule (``undercut_batches``: a busy moment slowed them; reported,
        the whole type would be refused and measured again in another run, one more restart)."""
        if not self._points:
            return None
        dropped = undercut_batches([(b, step) for b, step, _ in self._points])
        if dropped:
            logger.warning(
                "profiling %s: %s left out, slower than a larger batch by more than timing "
                "noise: %s",
                self.gpu_type,
                "per-GPU batch " + ", ".join(str(b) for b in sorted(dropped)),
                ", ".join(f"{b}: {t:.4g} s" for b, t, _ in self._points),
            )
        points = tuple(p for p in self._points if p[0] not in dropped)
        return MeasuredType(self._points[-1][0], points, measured_by)


class JobProfiling:
    """The job's profiling state: the types measured (checkpointed), this run's sweep, the
    try file and the document. Every decision is rank 0's alone: a sweep needs one replica."""

    def __init__(self, env: JobEnvironment, checkpoint_dir: Path):
        self.env = env
        self.measured: dict[str, MeasuredType] = {}
        self.sweep: ProfileSweep | None = None
        self.limit: int | None = None  # this type's largest per-GPU batch, once measured
        self.written = False  # this run wrote profiled.json
        self._assigned: Batch | None = None
        self._trying = checkpoint_dir / TRYING_FILE

    # ---- the checkpoint ----------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {"types": {name: m.to_state() for name, m in sorted(self.measured.items())}}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        """The checkpoint's measured types (a checkpoint older than profiling: none)."""
        types = (state or {}).get("types", {})
        self.measured = {str(name): MeasuredType.from_state(m) for name, m in types.items()}

    # ---- the sweep ---------------------------------------------------------------------------

    @property
    def sweeping(self) -> bool:
        return self.sweep is not None and self.sweep.running

    @property
    def dropping(self) -> bool:
        """The current step ran out of memory during the sweep and is being dropped."""
        return self.sweep is not None and self.sweep.failed

    def begin(self, assigned: Batch, replicas: int) -> Batch:
        """After the restore: the batch to train at first (the sweep's first, or ``assigned``)."""
        self._assigned = assigned
        gpu_type, sweep = self.env.profile_gpu_type, self.env.sweep
        if not sweep:
            if gpu_type not in self.measured:
                return assigned
            self.limit = self.measured[gpu_type].max_local_bsz  # what fits, as measured
            return fit_batch(assigned, self.limit)
        if replicas != 1:
            logger.warning("profiling needs one replica, this run has %d: no sweep", replicas)
            return assigned
        if gpu_type in self.measured:  # the controller did not take it: measured again
            logger.info("profiling: %s was measured before; measuring it again", gpu_type)
        memory = emulated_memory(self.env.gpu_type)
        crashed = self._crashed_try(gpu_type)
        batches = tuple(
            b for b in sweep if (memory is None or b <= memory) and (crashed is None or b < crashed)
        )
        logger.info(
            "profiling %s: per-GPU batches %s, 1 warm-up + %d measured steps each%s%s",
            gpu_type,
            ",".join(map(str, batches)) or "none",
            self.env.profile_steps,
            "" if memory is None else f" (emulated memory: {memory})",
            "" if crashed is None else f" (a run died trying {crashed})",
        )
        self.sweep = ProfileSweep(gpu_type, batches, self.env.profile_steps, self.env.profile_min_s)
        if not self.sweep.running:
            return self._finish()
        self._write_try()
        return self.sweep.batch

    def assign(self, batch: Batch) -> Batch:
        """A new assignment's batch (a rebatch): adopted after the sweep, fitted to the type's
        measured limit once it is known; the batch to train at now."""
        self._assigned = batch
        if self.sweep is not None and self.sweep.running:
            return self.sweep.batch
        return fit_batch(batch, self.limit)

    def step_done(self, timing: Timing | None) -> Batch:
        """A sweep step completed: the batch the next one trains at."""
        assert self.sweep is not None
        before = self.sweep.batch
        self.sweep.record(timing)
        if not self.sweep.running:
            return self._finish()
        if self.sweep.batch != before:
            self._write_try()
        return self.sweep.batch

    def out_of_memory(self) -> None:
        assert self.sweep is not None
        logger.warning(
            "profiling %s: a per-GPU batch of %d does not fit (CUDA out of memory); the step "
            "is dropped",
            self.sweep.gpu_type,
            self.sweep.batch.local_bsz,
        )
        self.sweep.out_of_memory()

    def drop_step(self) -> Batch:
        """The step that ran out of memory is dropped: the sweep ends; the batch to train at."""
        assert self.sweep is not None
        self.sweep.drop()
        return self._finish()

    def abandon(self) -> None:
        """The run ends mid-sweep (stop, termination, completion): the partial sweep is
        dropped and its try file removed (nothing failed; the next run measures again)."""
        if self.sweeping:
            logger.info("profiling: the run ends mid-sweep; the next run measures again")
            self.sweep = None
            self._clear_try()

    def note_crash(self, exc: BaseException) -> None:
        """The process is dying of ``exc`` during the sweep (say what the next run does)."""
        if self.sweep is not None and self.sweep.running:
            logger.error(
                "profiling %s: the process fails at a per-GPU batch of %d (%s); the next run "
                "takes that batch as not fitting",
                self.sweep.gpu_type,
                self.sweep.batch.local_bsz,
                type(exc).__name__,
            )

    def _finish(self) -> Batch:
        """The sweep ended: keep and report what it measured; the batch to train on at."""
        assert self.sweep is not None and self._assigned is not None
        self._clear_try()
        gpu_type = self.sweep.gpu_type
        result = self.sweep.result(self._measured_by(gpu_type))
        if result is None:
            logger.error(
                "profiling %s: not one batch of the sweep %s fits; nothing measured",
                gpu_type,
                self.env.profile_sweep,
            )
            return self._assigned
        self.measured[gpu_type] = result
        self.limit = result.max_local_bsz
        self.write_document()
        batch = fit_batch(self._assigned, self.limit)
        logger.info(
            "profiling %s: largest per-GPU batch %d; %s; training on at %s",
            gpu_type,
            result.max_local_bsz,
            ", ".join(f"{b}: {t:.4g} s" for b, t, _ in result.points),
            batch,
        )
        return batch

    def _measured_by(self, gpu_type: str) -> str:
        env = self.env
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        run = f"Slurm job {env.slurm_job_id}.{env.restarts}, " if env.slurm_job_id else ""
        return f"{gpu_type} measured by job {env.sia_id} ({run}on {env.gpu_type}) at {stamp}"

    # ---- the document ------------------------------------------------------------------------

    def document(self) -> dict[str, Any]:
        """The profile document of every type measured (``profile_json``'s format)."""
        env = self.env
        profile = AppProfile(
            name=env.app or env.sia_id,
            init_batch_size=env.init_batch_size,
            max_batch_size=env.max_batch_size,
            min_local_bsz=env.sweep[0] if env.sweep else 1,
            max_local_bsz={name: m.max_local_bsz for name, m in sorted(self.measured.items())},
            seed={
                name: tuple(Observation(1, 1, b, step, sync) for b, step, sync in m.points)
                for name, m in sorted(self.measured.items())
            },
            description="; ".join(m.measured_by for _, m in sorted(self.measured.items())),
        )
        return profile_to_json(profile)

    def write_document(self) -> None:
        """``jobs/<id>/profiled.json``, atomically; a failed write is logged, never fatal (the
        type is measured again by a later run)."""
        path = StatePaths(self.env.state_dir).profiled(self.env.sia_id)
        try:
            write_json_atomic(path, self.document())
        except OSError as exc:
            logger.warning("profiled.json not written: %s", exc)
            return
        self.written = True

    # ---- the try file ------------------------------------------------------------------------

    def _write_try(self) -> None:
        """Before a batch is first tried: if the process dies during it, the next run knows."""
        assert self.sweep is not None
        payload = {
            "gpu_type": self.sweep.gpu_type,
            "local_bsz": self.sweep.batch.local_bsz,
            "slurm_job_id": self.env.slurm_job_id,
            "restarts": self.env.restarts,
            "time": time.time(),
        }
        try:
            write_json_atomic(self._trying, payload, mode=0o600)
        except OSError as exc:
            logger.warning(
                "%s not written (a crash in this try goes unseen): %s", self._trying, exc
            )

    def _clear_try(self) -> None:
        self._trying.unlink(missing_ok=True)

    def _crashed_try(self, gpu_type: str) -> int | None:
        """The batch a run died trying on ``gpu_type`` (the try file it left), if any."""
        try:
            payload = json.loads(self._trying.read_text())
            if payload["gpu_type"] != gpu_type:
                return None
            local_bsz = payload["local_bsz"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            logger.warning("%s ignored: %s", self._trying, exc)
            return None
        if not isinstance(local_bsz, int) or isinstance(local_bsz, bool) or local_bsz < 1:
            logger.warning("%s ignored: local_bsz %r", self._trying, local_bsz)
            return None
        logger.warning(
            "profiling %s: a previous run died trying a per-GPU batch of %d: taken as not fitting",
            gpu_type,
            local_bsz,
        )
        return local_bsz


def fit_batch(batch: Batch, limit: int | None) -> Batch:
    """``batch`` (one replica) with its per-GPU batch at most ``limit``: the same global batch
    in the fewest accumulation steps that divide it evenly."""
    if limit is None or batch.local_bsz <= limit:
        return batch
    size = batch.batch_size
    for count in range(-(-size // limit), size + 1):
        if size % count == 0:
            return Batch(size, size // count, count - 1)
    return batch  # unreachable: count == size divides it


def is_out_of_memory(exc: BaseException) -> bool:
    return isinstance(exc, torch.cuda.OutOfMemoryError)


def free_device_memory() -> None:
    """Return the cached blocks of a failed step to the device (CUDA only)."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
