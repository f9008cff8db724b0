"""One replica's side of an elastic job for scripts that keep their own DDP loop.

:func:`init` makes the :class:`ElasticJob` of the process (the process group, the job's
environment, checkpoints, metrics, the controller's files); :class:`ElasticDataParallel`
(sia_slurm/job/elastic/ddp.py) and :class:`ElasticDataLoader` (sia_slurm/job/elastic/dataloader.py)
attach to it, and :meth:`ElasticJob.remaining_epochs` drives the epochs. The loader calls
:meth:`ElasticJob.end_step` after the last micro-batch of each optimizer step: there the
ranks agree, in one small all-reduce, on the step's gradient-noise sums and on the
controller's requests (stop, rebatch, termination, a periodic checkpoint, a run left
behind) (``docs/protocol.md``, "Running"). This is the job side's one implementation of
that reliability: :class:`~sia_slurm.job.elastic.ElasticTrainer` (the step loop) and the
Lightning integration drive the same :class:`ElasticJob`.

Rank 0 tells ``sia-launch`` through :class:`~sia_slurm.job.runs.TrainingRecorder` that the run
trained and how its process ended: ``completed`` only when :meth:`remaining_epochs` ran out,
``stopped`` on the controller's stop, ``terminated`` on a signal, ``exited`` otherwise.
"""

from __future__ import annotations

import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from sia_slurm.job.elastic import devspeed
from sia_slurm.job.elastic.checkpoint import CheckpointError, CheckpointManager
from sia_slurm.job.elastic.control import ControlFiles, SignalFlags
from sia_slurm.job.elastic.distributed import init_process_group
from sia_slurm.job.elastic.job_profiling import JobProfiling, free_device_memory, is_out_of_memory
from sia_slurm.job.elastic.metrics_reporter import MetricsReporter
from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.elastic.rng import load_rng_state, rng_state
from sia_slurm.job.elastic.sampler import ElasticSampler, StepPlan
from sia_slurm.job.elastic.steps import Batch, MicroBatch, StepStats
from sia_slurm.job.jobenv import JobEnvironment
from sia_slurm.job.runs import TrainingRecorder

logger = logging.getLogger(__name__)
CHECKPOINT_FORMAT = 2
# [local sum |g_i|^2, terminate, stop round + 1, new round + 1, batch, local, accum,
#  superseded round + 1, |mean g|^2 / replicas, checkpoint due]
_CONTROL_SIZE = 10
_current: ElasticJob | None = None


class ElasticJobError(RuntimeError):
    """The script used the elastic wrappers in a way they cannot support."""


def init(env: JobEnvironment | None = None, **options: Any) -> ElasticJob:
    """The process's elastic job, made on first call (replaces ``init_process_group``)."""
    global _current
    if _current is None:
        _current = ElasticJob(env, **options)
    return _current


def current_job() -> ElasticJob:
    if _current is None:
        return init()
    return _current


class ElasticJob:
    """The run-level state of one training process (see the module docstring)."""

    def __init__(
        self,
        env: JobEnvironment | None = None,
        *,
        seed: int = 0,
        checkpoint_keep: int = 2,
        checkpoint_interval_s: float | None = None,
        noise_decay: float = 0.95,
        control_interval: int = 4,
        install_signal_handlers: bool = True,
        reporter: MetricsReporter | None = None,
    ):
        if control_interval < 1:
            raise ElasticJobError(f"control_interval: expected >= 1, got {control_interval}")
        self.env = env if env is not None else JobEnvironment.from_env()
        self.rank, self.replicas, self.device = init_process_group()
        self.seed = seed
        self.control_interval = control_interval
        self.measuring = True  # whether this step's gradient-noise norms are taken
        self.noise = GradientNoise(self.env.init_batch_size, decay=noise_decay)
        self.checkpoints = CheckpointManager(self.env.checkpoint_dir, keep=checkpoint_keep)
        self.reporter = reporter if reporter is not None else MetricsReporter(self.env)
        self.files = ControlFiles.for_job(self.env)
        self.signals = SignalFlags()
        if install_signal_handlers:
            self.signals.install()
        self.batch = _initial_batch(self.env, self.replicas)
        self.profiling = JobProfiling(self.env, self.checkpoints.directory)
        self.round = self.env.launch_round
        self.step = 0  # optimizer steps since the job first started
        self.progress = 0.0  # steps weighted by the AdaScale gain
        self.user_state: dict[str, Any] = {}
        self.max_steps: int | None = None
        self.sampler: ElasticSampler | None = None
        self.model: Any = None  # the ElasticDataParallel
        self.current: MicroBatch | None = None
        self.stats = StepStats()
        self.step_callbacks: list[Callable[[ElasticJob, StepPlan], None]] = []
        self.last_noise_sample: tuple[float, float, int, float] | None = None
        # (step_time, sync_time) of the step that just ended, as rank 0 reports it (every rank
        # measures its own); None after a step that is not uniform or was dropped
        self.last_timing: tuple[float, float] | None = None
        self._previous: tuple[int, float, int] = (-2, 0.0, 0)  # step, |g|^2, M
        self._loss_scale: torch.Tensor | None = None
        self._in_flight: tuple[StepPlan, torch.Tensor, Any, StepStats] | None = None
        self._last_start: float | None = None
        self._stop_round: int | None = None
        self._terminate = False
        self._superseded_round: int | None = None
        self.completed = False
        self._checkpoint_interval_s = checkpoint_interval_s
        self._last_checkpoint = time.monotonic()
        self._loaded: tuple[int, dict[str, Any]] | bool | None = False
        self._recorder = TrainingRecorder.for_rank(self.env, self.rank, lambda: self.step)
        self._install_failure_hook()
        self._log(
            "rank %d of %d on %s (%s), batch %d = %d x %d x %d",
            self.rank,
            self.replicas,
            self.env.gpu_type,
            self.device,
            self.batch.batch_size,
            self.replicas,
            self.batch.local_bsz,
            self.batch.accum_steps + 1,
        )

    def plan(self, sampler: ElasticSampler, batch: Batch) -> StepPlan | None:
        """``sampler``'s next step at ``batch`` for this replica (None: its epoch is done): the
        trainer plans the step it runs, a loader's workers the steps ahead of it."""
        return sampler.plan(
            batch_size=batch.batch_size,
            local_bsz=batch.local_bsz,
            accum_steps=batch.accum_steps,
            rank=self.rank,
            replicas=self.replicas,
        )

    # ---- parts attach; the newest checkpoint is read once, each part takes its own ---------

    def attach_sampler(self, sampler: ElasticSampler) -> None:
        """Register the data order; the first one resumes at the checkpoint's position, a later
        one (a loader made again, e.g. by Lightning's reloading) at the current one."""
        previous, self.sampler = self.sampler, sampler
        if previous is not None:
            sampler.load_state_dict(previous.state_dict())
            return
        restored = self._checkpoint()
        if restored is not None:
            sampler.load_state_dict(restored[1]["sampler"])

    def attach_model(self, model: Any) -> dict[str, Any] | None:
        """Register the model wrapper; returns the checkpoint's state for it to load."""
        self.model = model
        restored = self._checkpoint()
        return None if restored is None else restored[1]

    @property
    def restored_step(self) -> int | None:
        """The step of the checkpoint this process resumed from (``None``: from scratch)."""
        restored = self._checkpoint() if self.sampler is not None else None
        return None if restored is None else restored[0]

    def _checkpoint(self) -> tuple[int, dict[str, Any]] | None:
        if self._loaded is False:
            self._loaded = self._restore()
            self._set_batch(self.profiling.begin(self.batch, self.replicas))  # a sweep first?
        return self._loaded  # type: ignore[return-value]

    def _restore(self) -> tuple[int, dict[str, Any]] | None:
        """Rank 0 verifies and chooses the newest complete checkpoint; the others load it
        memory mapped. Job-level state and this rank's RNG state are applied here."""
        found = self.checkpoints.load() if self.rank == 0 else None
        choice = [found[0] if found else -1]
        if self.replicas > 1:
            dist.broadcast_object_list(choice, src=0)
        step = int(choice[0])
        if step < 0:
            self._log("no checkpoint in %s: starting from scratch", self.checkpoints.directory)
            return None
        state = found[1] if found is not None else self.checkpoints.load_trusted(step)
        if state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"checkpoint format {state.get('format')!r} is not supported")
        self.noise.load_state_dict(state["noise"])
        self.reporter.load_profile_state(state["profile"])
        self.profiling.load_state_dict(state.get("profiled"))  # absent before profiling
        self.step = int(state["step"])
        self.progress = float(state["progress"])
        self.user_state = dict(state["user"])
        self._set_rng(self.checkpoints.load_extra(step, "rng"))
        self._log("restored step %d from %s", self.step, self.checkpoints.path(step))
        return step, state

    # ---- the loop --------------------------------------------------------------------------

    def remaining_epochs(self, max_epochs: int, *, max_steps: int | None = None) -> Iterator[int]:
        """The epochs still to train (``for epoch in range(max_epochs)`` made resumable)."""
        if self.sampler is None or self.model is None:
            raise ElasticJobError(
                "make the ElasticDataParallel and the ElasticDataLoader before the epoch loop"
            )
        self.max_steps = max_steps
        sampler = self.sampler
        while sampler.epoch < max_epochs and not self.steps_exhausted():
            if sampler.epoch_done:
                sampler.next_epoch()
                continue
            yield sampler.epoch
            if not sampler.epoch_done and not self.steps_exhausted():
                return  # the caller left the epoch early: not a completed training
        self._complete()

    def steps_exhausted(self) -> bool:
        return self.max_steps is not None and self.step >= self.max_steps

    def begin_micro(self, micro: MicroBatch) -> None:
        """The loader hands out ``micro`` next."""
        if micro.index == 0:
            self.stats = StepStats(step_index=self.step)
            self.measuring = self._measured(self.step)
            if self.model is not None:
                local = micro.count > 1 or self.replicas > 1  # local norms are the hooks'
                self.model.arm_hooks(not micro.plan.uniform or (self.measuring and local))
            scaler = getattr(self.model, "scaler", None)
            if scaler is not None and scaler.is_enabled():
                scale = scaler._get_scale_async()  # None before the first scaler.scale()
                self._loss_scale = (
                    torch.tensor(float(scaler._init_scale))
                    if scale is None
                    else scale.detach().clone()
                )
                self.stats.scaled = True
            else:
                self._loss_scale = None
        if micro.last:
            self._last_start = time.perf_counter()
        self.current = micro

    def finish_step(self) -> None:
        """End the current step if its last micro-batch has trained and nobody ended it yet
        (the loader does when the next batch is asked for; a Lightning hook may be first)."""
        micro = self.current
        if micro is not None and micro.last:
            self.end_step(micro.plan)

    def _syncs(self, step: int) -> bool:
        """Whether step ``step`` ends with a control all-reduce: every ``control_interval``-th
        step with several replicas (each is a collective round trip), every step alone."""
        return self.replicas == 1 or (step + 1) % self.control_interval == 0

    def _measured(self, step: int) -> bool:
        """Whether step ``step``'s noise norms are taken: the steps that sync (their sums
        travel in that step's control vector), and alone also the step before (the
        two-consecutive-steps estimate needs the pair)."""
        position = (step + 1) % self.control_interval
        return position == 0 or (self.replicas == 1 and position == self.control_interval - 1)

    def position(self) -> dict[str, Any]:
        """Where training is (for logs): the step in progress, its micro-batch, the run."""
        micro = self.current
        return {
            "step": self.step,
            "epoch": self.sampler.epoch if self.sampler is not None else 0,
            "micro": micro.index if micro is not None else -1,
            "round": self.round,
            "restarts": self.env.restarts,
            "gpu_type": self.env.gpu_type,
            "replicas": self.replicas,
            "batch_size": self.batch.batch_size,
            "local_bsz": self.batch.local_bsz,
            "accum_steps": self.batch.accum_steps,
        }

    @property
    def accumulating(self) -> bool:
        """True on a micro-batch that is not the last of its step (no sync, no optimizer step)."""
        return self.current is not None and not self.current.last

    def end_step(self, plan: StepPlan) -> None:
        """After the step's last micro-batch: account, and agree on the step's control vector.

        With several replicas the vector is all-reduced every ``control_interval`` steps
        (:meth:`_syncs`), started here and waited for at the next such step (or when
        training ends), so it rides behind DDP's buckets instead of adding a synchronous
        round trip to every step: the ranks act on an agreement ``control_interval`` steps
        after it was started, all at the same step. A profiling step that ran out of memory
        is dropped instead (:meth:`absorb_out_of_memory`)."""
        assert self.sampler is not None
        self.last_timing = None
        if self.profiling.dropping:
            self._drop_step()
            return
        stats, self.current = self.stats, None
        devspeed.pace_step(self, stats, self._last_start)  # a dev cluster's slower GPU types
        syncs = self._syncs(self.step)
        control = self._control_vector(stats) if syncs else None
        work = None
        if control is not None and self.replicas > 1:
            work = dist.all_reduce(control, async_op=True)
        self.sampler.advance(plan)
        self.step += 1
        self.progress += self.noise.gain(self.batch.batch_size)
        timing = None
        if plan.uniform and self._last_start is not None:
            done = stats.sync_done if stats.sync_done is not None else time.perf_counter()
            ready = stats.sync_ready if stats.sync_ready is not None else done
            timing = (done - self._last_start, done - ready)
            if self.rank == 0:
                self.reporter.record(*timing, self.batch.local_bsz, self.batch.accum_steps)
        self.last_timing = timing
        for callback in self.step_callbacks:
            callback(self, plan)
        if control is None:
            return
        previous, self._in_flight = self._in_flight, (plan, control, work, stats)
        if work is None:
            self._settle()
        elif previous is not None:
            self._settle(previous)
        if self.profiling.sweeping:  # one replica: every step settled above
            self._sweep_step(timing)

    # ---- profiling (sia_slurm/job/elastic/job_profiling.py) ------------------------------------

    def _set_batch(self, batch: Batch) -> None:
        """Train at ``batch`` from the next step on (the loaders plan with it; a report never
        mixes two batches)."""
        if batch != self.batch:
            self.batch = batch
            self.reporter.restart_window()

    def _sweep_step(self, timing: tuple[float, float] | None) -> None:
        """A profiling step completed (after its agreement, so that the noise estimate pairs
        steps of one batch): the next step's batch; a checkpoint keeps a finished sweep."""
        self._set_batch(self.profiling.step_done(timing))
        if not self.profiling.sweeping and self._superseded_round is None:
            self.save_checkpoint()

    def absorb_out_of_memory(self, exc: BaseException) -> bool:
        """Whether ``exc``, raised during the step where the job's code surrounds it, was a
        CUDA out-of-memory error of a profiling step, now absorbed: the gradients freed,
        DDP's reducer reset, the cache emptied, and the step to be dropped at its end (the
        optimizer and the scaler skip it). Otherwise the caller re-raises."""
        if not (self.profiling.sweeping and is_out_of_memory(exc)):
            return False
        if self.model is not None and not self.model.recover_from_out_of_memory():
            return False
        free_device_memory()
        self.profiling.out_of_memory()
        return True

    @property
    def dropping(self) -> bool:
        """The current step ran out of memory while profiling: nothing of it is applied."""
        return self.profiling.dropping

    def _drop_step(self) -> None:
        """End a step that ran out of memory while profiling without counting it: the
        sampler stays (its samples train again), the sweep ends at the batch before."""
        self.current, self.stats = None, StepStats(step_index=self.step)
        self._set_batch(self.profiling.drop_step())
        self.save_checkpoint()

    def _settle(self, agreed: tuple[StepPlan, torch.Tensor, Any, StepStats] | None = None) -> None:
        """Act on a step's agreed control vector (the one in flight when not given)."""
        if agreed is None:
            agreed, self._in_flight = self._in_flight, None
            if agreed is None:
                return
        plan, control, work, stats = agreed
        if work is not None:
            work.wait()
        values = control.tolist()
        if plan.uniform:
            self._observe_noise(plan, values, stats)
        self._decode_control(values)
        if self.rank == 0 and self.reporter.due():
            self._report()
        if values[9] > 0 and self._superseded_round is None:
            self.save_checkpoint()

    def _drain(self) -> None:
        """Wait for the control all-reduce in flight, without acting on it (the process is
        stopping on an earlier agreement)."""
        if self._in_flight is not None and self._in_flight[2] is not None:
            self._in_flight[2].wait()
        self._in_flight = None

    def _observe_noise(self, plan: StepPlan, values: list[float], stats: StepStats) -> None:
        count = len(plan.micro_batches) * self.replicas
        local_bsz = len(plan.micro_batches[0])
        if count >= 2:
            sample = (values[8], values[0] / count, count, float(local_bsz))
            self.noise.observe(*sample)
            self.last_noise_sample = sample
            return
        if not stats.single_sqr:
            return
        cur = float(torch.stack(stats.single_sqr).double().sum())
        step, prev, batch = self._previous
        complete = len(stats.single_cross) == len(stats.single_sqr)
        if step == stats.step_index - 1 and complete and batch == self.batch.batch_size:
            cross = float(torch.stack(stats.single_cross).double().sum())
            sample = ((prev + cur + 2 * cross) / 4, (prev + cur) / 2, 2, float(plan.size))
            self.noise.observe(*sample)
            self.last_noise_sample = sample
        self._previous = (stats.step_index, cur, self.batch.batch_size)

    def loss_scale_inverse_sq(self) -> float:
        """``1 / scale^2`` of the step's GradScaler (1 without one): what a squared norm of a
        scaled gradient is multiplied by to be the unscaled gradient's."""
        return 1.0 if self._loss_scale is None else 1.0 / float(self._loss_scale) ** 2

    # ---- control: stop, terminate, rebatch ---------------------------------------------------

    def _control_vector(self, stats: StepStats) -> torch.Tensor:
        control = torch.zeros(_CONTROL_SIZE, dtype=torch.float64, device=self.device)
        if stats.micro_sqr:
            local = torch.stack([t.double() for t in stats.micro_sqr]).sum()
            if self._loss_scale is not None:
                local /= self._loss_scale.double().to(self.device) ** 2
            control[0] = local
        if stats.global_sqr:
            control[8] = torch.stack([t.double() for t in stats.global_sqr]).sum() / self.replicas
        control[1] = 1.0 if self.signals.terminate else 0.0
        if self.rank == 0:
            interval = self._checkpoint_interval_s
            due = interval is not None and time.monotonic() - self._last_checkpoint >= interval
            control[9] = 1.0 if due else 0.0
            if self.files.due(self.signals.wake):
                self.signals.wake = False
                self._read_files(control)
        return control

    def _read_files(self, control: torch.Tensor) -> None:
        stop = self.files.pending_stop()
        if stop is not None:
            control[2] = stop.round_index + 1
        assignment = self.files.new_assignment(self.round)
        if assignment is not None and self.files.supersedes(assignment):
            control[7] = assignment.round_index + 1
        elif assignment is not None:
            same = (assignment.gpu_type, assignment.nodes, assignment.gpus) == (
                self.env.gpu_type,
                self.env.nodes,
                self.replicas,
            )
            if same:
                control[3] = assignment.round_index + 1
                control[4] = assignment.batch_size
                control[5] = assignment.local_bsz
                control[6] = assignment.accum_steps
            else:
                logger.warning(
                    "[round=%d job=%s] assignment of round %d is for another configuration; "
                    "waiting for the controller to stop this job",
                    self.round,
                    self.env.sia_id,
                    assignment.round_index,
                )

    def _decode_control(self, values: list[float]) -> None:
        if values[1] > 0:
            self._terminate = True
        if values[2] > 0:
            self._stop_round = int(values[2]) - 1
        if values[7] > 0:
            self._superseded_round = int(values[7]) - 1
        elif values[3] > 0:
            batch = Batch(int(values[4]), int(values[5]), int(values[6]))
            self._log("adopting the batch of round %d: %s", int(values[3]) - 1, batch)
            self.batch = self.profiling.assign(batch)  # a sweep keeps its own until it ends
            self.round = int(values[3]) - 1
            self.reporter.restart_window()

    def obey_control(self) -> None:
        """Between steps: end the process on an agreed stop, termination or supersession."""
        if self._superseded_round is not None:
            self._log(
                "the assignment of round %d is for another Slurm run; this run (%s.%d) was "
                "left behind and exits without a checkpoint",
                self._superseded_round,
                self.env.slurm_job_id,
                self.env.restarts,
            )
            self._exit()
        if self._stop_round is not None:
            self._stop_for_controller(self._stop_round)
        if self._terminate:
            self._drain()
            self._ended("terminated")
            path = self.save_checkpoint()
            self._log("terminated by a signal: checkpoint %s", path)
            self._exit()

    def _stop_for_controller(self, stop_round: int) -> None:
        self._drain()
        self._ended("stopped")
        if self.rank == 0:
            self._report()
        path = self.save_checkpoint()
        if self.rank == 0:
            self.files.write_ack(stop_round)
            self._log("stopped for round %d: checkpoint %s, acknowledged", stop_round, path)
        deadline = time.monotonic() + self.env.linger_s
        while not self.signals.terminate and time.monotonic() < deadline:
            time.sleep(0.1)
        self._exit()

    def _complete(self) -> None:
        self.complete()
        self.leave_process_group()

    def complete(self) -> None:
        """Training ran to its end: the last statistics, report and checkpoint, and the run
        recorded as ``completed``."""
        self._settle()  # the last step's statistics; its requests no longer matter
        if self.rank == 0:
            self._report()
        self.save_checkpoint()
        self._ended("completed")
        self.completed = True
        self._log("training complete after %d steps", self.step)

    def leave_process_group(self) -> None:
        """Meet once more and tear the group down (every rank completes at the same step): a
        rank that exited with gloo still up was seen to die with SIGABRT on a multi-node job,
        and Slurm then records a trained job as FAILED."""
        if dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def _exit(self) -> None:
        self._drain()
        if dist.is_initialized():
            dist.destroy_process_group()
        raise SystemExit(0)

    def _ended(self, end: str) -> None:
        self.profiling.abandon()  # a sweep not finished is measured again by the next run
        if self._recorder is not None:
            self._recorder.ended(end)

    def _install_failure_hook(self) -> None:
        """A peer that dies during a termination fails a collective inside the user's
        ``backward``; rank 0 then checkpoints the last complete step (the optimizer has not
        stepped) and the process exits 0."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            if self.signals.terminate and isinstance(exc, RuntimeError):
                self._ended("terminated")
                self._log("a collective failed during termination (%s)", exc)
                path = self.save_checkpoint(collective=False)
                self._log("terminated: checkpoint %s of the last complete step", path)
                sys.stderr.flush()
                os._exit(0)
            self.profiling.note_crash(exc)
            previous(kind, exc, tb)

        sys.excepthook = hook

    def _report(self) -> None:
        self.reporter.report(
            steps=self.step,
            local_bsz=self.batch.local_bsz,
            accum_steps=self.batch.accum_steps,
            round_index=self.round,
            noise=self.noise,
        )

    # ---- checkpoints -------------------------------------------------------------------------

    def save_checkpoint(self, *, collective: bool = True) -> str:
        """Every rank's RNG state to rank 0, which writes the checkpoint of this step.
        All ranks call it at the same step (``collective=False``: rank 0 alone, its peers
        gone; their RNG states are then not saved)."""
        self._last_checkpoint = time.monotonic()
        rng = [rng_state()]
        if collective and self.replicas > 1:
            rng = [None] * self.replicas
            dist.all_gather_object(rng, rng_state())
        if self.rank != 0:
            return ""
        path = self.checkpoints.save(self.step, self.state_dict(), {"rng": rng})
        return str(path)

    def state_dict(self) -> dict[str, Any]:
        assert self.sampler is not None
        state = {
            "format": CHECKPOINT_FORMAT,
            "sia_id": self.env.sia_id,
            "step": self.step,
            "progress": self.progress,
            "sampler": self.sampler.state_dict(),
            "noise": self.noise.state_dict(),
            "profile": self.reporter.profile_state(),
            "batch": [self.batch.batch_size, self.batch.local_bsz, self.batch.accum_steps],
            "configuration": [self.env.gpu_type, self.env.nodes, self.replicas],
            "round": self.round,
            "restarts": self.env.restarts,
            "time": time.time(),
            "user": self.user_state,
            "profiled": self.profiling.state_dict(),
        }
        if self.model is not None:
            state.update(self.model.training_state())
        return state

    def _set_rng(self, states: list[Any] | None) -> None:
        """This rank's RNG state from the checkpoint; a rank the saved run did not have (a
        larger world) seeds from (seed, step, rank) instead."""
        if states and self.rank < len(states) and states[self.rank] is not None:
            load_rng_state(states[self.rank])
            return
        derived = hash((self.seed, self.step, self.rank)) % (2**31)
        random.seed(derived)
        np.random.seed(derived)
        torch.manual_seed(derived)

    def _log(self, message: str, *args: Any) -> None:
        if self.rank == 0:
            logger.info(f"[round={self.round} job={self.env.sia_id}] {message}", *args)


def _initial_batch(env: JobEnvironment, replicas: int) -> Batch:
    if replicas != env.gpus:
        logger.warning(
            "%d processes but the assignment has %d GPUs: using %d x %d x %d",
            replicas,
            env.gpus,
            replicas,
            env.local_bsz,
            env.accum_steps + 1,
        )
    return Batch(replicas * env.local_bsz * (env.accum_steps + 1), env.local_bsz, env.accum_steps)
