"""The elastic training loop: the few calls a training script makes to be managed by Sia.

A script keeps its model, optimizer, loss and data, and drives them through an
:class:`ElasticTrainer` (``launcher/examples/`` shows the whole change)::

    trainer = ElasticTrainer(model, optimizer, dataset, scheduler=scheduler)
    for epoch in trainer.epochs(max_epochs):       # restores the newest checkpoint first
        for step in trainer.steps():               # this replica's share of one global batch
            for x, y in step.micro_batches():      # accumulation when the batch needs it
                step.backward(loss_fn(model(x), y))   # loss: the mean over the micro-batch
            step.finish()                          # all-reduce, optimizer step, control

The trainer does the gradient all-reduce itself (do not wrap the model in DDP): it needs the
per-replica gradients for the noise statistics, the exact all-reduce time for the metrics,
and a place to agree on control decisions. Each :meth:`Step.finish` runs two all-reduces: the
gradients (timed as ``sync_time``) and a small control vector that carries the sum of squared
per-micro-batch gradient norms, every rank's SIGTERM flag, and rank 0's reading of the
controller's files (a stop request; a new batch). All ranks therefore stop, or adopt a new
batch, after the same step. On an agreed stop rank 0 writes the checkpoint and the
acknowledgement, and every rank idles until the controller's requeue terminates it or the
linger limit passes, then exits with status 0 (``docs/protocol.md``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator, Sized
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist
from torch.utils.data import default_collate

from launcher.elastic.checkpoint import CheckpointError, CheckpointManager
from launcher.elastic.control import ControlFiles, SignalFlags
from launcher.elastic.lr import LRScaling
from launcher.elastic.metrics import MetricsReporter
from launcher.elastic.noise import GradientNoise
from launcher.elastic.sampler import ElasticSampler, StepPlan
from launcher.jobenv import JobEnvironment
from launcher.runs import TrainingRecorder
from sia_slurm.protocol import Assignment

logger = logging.getLogger(__name__)
CHECKPOINT_FORMAT = 1
# Control vector: [sum |g_i|^2, terminate, stop round + 1, new round + 1, batch, local, accum,
# superseded round + 1]
_CONTROL_SIZE = 8


class TrainerError(RuntimeError):
    """The training script used the trainer in a way it cannot support."""


class IndexedDataset(Sized, Protocol):
    def __getitem__(self, index: int) -> Any: ...


@dataclass(frozen=True)
class Batch:
    """A global batch and how it is split (``batch_size == replicas*local_bsz*(accum_steps+1)``)."""

    batch_size: int
    local_bsz: int
    accum_steps: int


class ElasticTrainer:
    """Runs one replica of an elastic data-parallel training job (see the module docstring).

    ``fetch`` turns a list of dataset indices into a micro-batch (default: the dataset's items
    collated with :func:`torch.utils.data.default_collate`). ``lr_scaling`` is a rule of
    :mod:`launcher.elastic.lr`. ``checkpoint_interval_s`` adds periodic checkpoints (default:
    only on stop, termination and completion). ``user_state`` is saved and restored with the
    checkpoint (tensors, numbers, strings, lists and dicts only).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        dataset: IndexedDataset,
        *,
        scheduler: Any = None,
        fetch: Callable[[list[int]], Any] | None = None,
        env: JobEnvironment | None = None,
        seed: int = 0,
        shuffle: bool = True,
        lr_scaling: str = "adascale",
        checkpoint_interval_s: float | None = None,
        noise_decay: float = 0.95,
        install_signal_handlers: bool = True,
    ):
        self.env = env if env is not None else JobEnvironment.from_env()
        self.model = model
        self.optimizer = optimizer
        self.scheduler = scheduler
        self.dataset = dataset
        self.fetch = fetch or (lambda indices: default_collate([dataset[i] for i in indices]))
        self.rank, self.replicas = _init_process_group()
        self.sampler = ElasticSampler(len(dataset), seed=seed, shuffle=shuffle)
        self.noise = GradientNoise(self.env.init_batch_size, decay=noise_decay)
        self.scaling = LRScaling(lr_scaling, self.env.init_batch_size)
        self.checkpoints = CheckpointManager(self.env.checkpoint_dir)
        self.reporter = MetricsReporter(self.env)
        self.files = ControlFiles.for_job(self.env)
        self.signals = SignalFlags()
        if install_signal_handlers:
            self.signals.install()
        self.batch = self._initial_batch()
        self.round = self.env.launch_round
        self.step = 0  # optimizer steps since the job first started
        self.progress = 0.0  # steps weighted by the AdaScale gain (M0-equivalent steps)
        self.user_state: dict[str, Any] = {}
        self.restored_step: int | None = None
        self.max_steps: int | None = None
        self._restored = False
        self._stop_round: int | None = None
        self._terminate = False
        self._superseded_round: int | None = None
        self._checkpoint_interval_s = checkpoint_interval_s
        self._last_checkpoint = time.monotonic()
        self._recorder = TrainingRecorder.for_rank(self.env, self.rank, lambda: self.step)
        self._params = [p for p in model.parameters() if p.requires_grad]
        self._device = self._params[0].device if self._params else torch.device("cpu")
        self._log(
            "rank %d of %d on %s (%d node(s), %d GPU(s)), batch %d = %d x %d x %d",
            self.rank,
            self.replicas,
            self.env.gpu_type,
            self.env.nodes,
            self.env.gpus,
            self.batch.batch_size,
            self.replicas,
            self.batch.local_bsz,
            self.batch.accum_steps + 1,
        )

    # ---- the loop ------------------------------------------------------------------------------

    def epochs(self, max_epochs: int, *, max_steps: int | None = None) -> Iterator[int]:
        """The epochs still to train (restores the newest checkpoint on first use)."""
        self.max_steps = max_steps
        if not self._restored:
            self.restore()
        while self.sampler.epoch < max_epochs and not self._steps_exhausted():
            if self.sampler.epoch_done:
                self.sampler.next_epoch()
                continue
            yield self.sampler.epoch
            if not self.sampler.epoch_done and not self._steps_exhausted():
                return  # the caller left the epoch early: not a completed training
        self._complete()

    def steps(self) -> Iterator[Step]:
        """This epoch's remaining steps; a stop agreed at the previous step ends the process."""
        while True:
            self._obey_control()
            if self._steps_exhausted():
                return
            plan = self.sampler.plan(
                batch_size=self.batch.batch_size,
                local_bsz=self.batch.local_bsz,
                accum_steps=self.batch.accum_steps,
                rank=self.rank,
                replicas=self.replicas,
            )
            if plan is None:
                return
            step = Step(self, plan)
            yield step
            if not step.finished:
                raise TrainerError("every step must end with step.finish() before the next one")

    def _steps_exhausted(self) -> bool:
        return self.max_steps is not None and self.step >= self.max_steps

    # ---- one step ------------------------------------------------------------------------------

    def _finish(self, step: Step) -> None:
        flat = self._flat_grad()
        plan = step.plan
        if step.needs_local_norms and len(plan.micro_batches) == 1 and plan.local_size:
            weight = plan.local_size / plan.size
            step.local_sqr = float(flat.double().dot(flat.double())) / weight**2
        control = self._control_vector(step.local_sqr)
        sync_start = time.perf_counter()
        try:
            if self.replicas > 1:
                dist.all_reduce(flat)
            sync_end = time.perf_counter()
            if self.replicas > 1:
                dist.all_reduce(control)
        except RuntimeError as exc:
            self._on_collective_failure(exc)
            raise
        step.global_sqr = float(control[0].item())
        self._apply_gradient(flat, step)
        self.sampler.advance(plan)
        self.step += 1
        if self.rank == 0 and plan.uniform and step.last_start is not None:
            self.reporter.record(
                sync_end - step.last_start,
                sync_end - sync_start,
                self.batch.local_bsz,
                self.batch.accum_steps,
            )
        self._decode_control(control)
        if self.rank == 0 and self.reporter.due():
            self._report()
        interval = self._checkpoint_interval_s
        due = interval is not None and time.monotonic() - self._last_checkpoint >= interval
        if due and self._superseded_round is None:
            self.save_checkpoint()

    def _apply_gradient(self, flat: torch.Tensor, step: Step) -> None:
        """Noise statistics, learning-rate scaling and the optimizer step on the mean gradient."""
        plan = step.plan
        if plan.uniform:
            micro = len(plan.micro_batches)
            count = micro * self.replicas
            if count >= 2:
                mean = flat.double()
                self.noise.observe(
                    float(mean.dot(mean)), step.global_sqr / count, count, self.batch.local_bsz
                )
            else:
                self.noise.observe_single(flat, self.batch.batch_size)
        offset = 0
        for param in self._params:
            size = param.numel()
            param.grad = flat[offset : offset + size].view_as(param).to(param.dtype)
            offset += size
        factor = self.scaling.factor(self.batch.batch_size, self.noise)
        with self.scaling.applied(self.optimizer, factor):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.progress += self.noise.gain(self.batch.batch_size)

    def _flat_grad(self) -> torch.Tensor:
        parts = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1)
            for p in self._params
        ]
        if not parts:
            return torch.zeros(0, device=self._device)
        return torch.cat(parts)

    # ---- control: stop, terminate, rebatch ---------------------------------------------------

    def _control_vector(self, local_sqr: float) -> torch.Tensor:
        control = torch.zeros(_CONTROL_SIZE, dtype=torch.float64, device=self._device)
        control[0] = local_sqr
        control[1] = 1.0 if self.signals.terminate else 0.0
        if self.rank == 0 and self.files.due(self.signals.wake):
            self.signals.wake = False
            stop = self.files.pending_stop()
            if stop is not None:
                control[2] = stop.round_index + 1
            assignment = self.files.new_assignment(self.round)
            if assignment is not None and self.files.supersedes(assignment):
                control[7] = assignment.round_index + 1
            elif assignment is not None and self._acceptable_rebatch(assignment):
                control[3] = assignment.round_index + 1
                control[4:7] = torch.tensor(
                    [assignment.batch_size, assignment.local_bsz, assignment.accum_steps],
                    dtype=torch.float64,
                )
        return control

    def _acceptable_rebatch(self, assignment: Assignment) -> bool:
        same = (assignment.gpu_type, assignment.nodes, assignment.gpus) == (
            self.env.gpu_type,
            self.env.nodes,
            self.replicas,
        )
        if not same:
            logger.warning(
                "[round=%d job=%s] assignment of round %d is for %s:%dx%d, not this run's "
                "%s:%dx%d; waiting for the controller to stop this job",
                self.round,
                self.env.sia_id,
                assignment.round_index,
                assignment.gpu_type,
                assignment.nodes,
                assignment.gpus,
                self.env.gpu_type,
                self.env.nodes,
                self.replicas,
            )
        return same

    def _decode_control(self, control: torch.Tensor) -> None:
        values = control.tolist()
        if values[1] > 0:
            self._terminate = True
        if values[2] > 0:
            self._stop_round = int(values[2]) - 1
        if values[7] > 0:
            self._superseded_round = int(values[7]) - 1
        elif values[3] > 0:
            new_round = int(values[3]) - 1
            batch = Batch(int(values[4]), int(values[5]), int(values[6]))
            self._adopt(new_round, batch)

    def _adopt(self, round_index: int, batch: Batch) -> None:
        self._log(
            "adopting the batch of round %d: %d = %d x %d x %d (was %d)",
            round_index,
            batch.batch_size,
            self.replicas,
            batch.local_bsz,
            batch.accum_steps + 1,
            self.batch.batch_size,
        )
        self.batch = batch
        self.round = round_index
        self.reporter.restart_window()

    def _obey_control(self) -> None:
        if self._superseded_round is not None:
            self._stop_superseded(self._superseded_round)
        if self._stop_round is not None:
            self._stop_for_controller(self._stop_round)
        if self._terminate:
            self._stop_for_termination()

    def _ended(self, end: str) -> None:
        if self._recorder is not None:
            self._recorder.ended(end)

    def _stop_for_controller(self, stop_round: int) -> None:
        self._ended("stopped")
        if self.rank == 0:
            self._report()
            path = self.save_checkpoint()
            self.files.write_ack(stop_round)
            self._log("stopped for round %d: checkpoint %s, acknowledged", stop_round, path)
        deadline = time.monotonic() + self.env.linger_s
        while not self.signals.terminate and time.monotonic() < deadline:
            time.sleep(0.1)
        reason = "terminated" if self.signals.terminate else "linger limit reached"
        self._log("idle after the stop; exiting (%s)", reason)
        self._exit()

    def _stop_superseded(self, round_index: int) -> None:
        """The controller gave the job to another Slurm run (round ``round_index``): this run
        was left behind (its slurmd died and Slurm requeued the job while it kept training).
        It exits at once and writes nothing: the other run owns the checkpoints now."""
        self._log(
            "the assignment of round %d is for another Slurm run; this run (%s.%d) was left "
            "behind and exits without a checkpoint",
            round_index,
            self.env.slurm_job_id,
            self.env.restarts,
        )
        self._exit()

    def _stop_for_termination(self) -> None:
        self._ended("terminated")
        if self.rank == 0:
            self._report()
            path = self.save_checkpoint()
            self._log("terminated by a signal: checkpoint %s", path)
        self._exit()

    def _on_collective_failure(self, exc: RuntimeError) -> None:
        """A peer vanished mid-step. If we are being terminated, the state of the previous step
        is still intact (the optimizer has not stepped): rank 0 saves it, then exits."""
        if not self.signals.terminate:
            return
        self._ended("terminated")
        self._log("all-reduce failed during termination (%s)", exc)
        if self.rank == 0:
            path = self.save_checkpoint()
            self._log("terminated: checkpoint %s of the last complete step", path)
        raise SystemExit(0)

    def _exit(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
        raise SystemExit(0)

    def _complete(self) -> None:
        if self.rank == 0:
            self._report()
            self.save_checkpoint()
        self._ended("completed")
        self._log("training complete after %d steps", self.step)
        # Every rank completes at the same step, so all can meet once more and leave the
        # process group cleanly; a rank exiting with gloo still up was seen to die with SIGABRT
        # on a multi-node job, and Slurm then records a trained job as FAILED.
        if dist.is_available() and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()

    def _report(self) -> None:
        self.reporter.report(
            steps=self.step,
            local_bsz=self.batch.local_bsz,
            accum_steps=self.batch.accum_steps,
            round_index=self.round,
            noise=self.noise,
        )

    # ---- checkpoints ---------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        return {
            "format": CHECKPOINT_FORMAT,
            "sia_id": self.env.sia_id,
            "step": self.step,
            "progress": self.progress,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "sampler": self.sampler.state_dict(),
            "noise": self.noise.state_dict(),
            "profile": self.reporter.profile_state(),
            "batch": [self.batch.batch_size, self.batch.local_bsz, self.batch.accum_steps],
            "configuration": [self.env.gpu_type, self.env.nodes, self.replicas],
            "round": self.round,
            "restarts": self.env.restarts,
            "time": time.time(),
            "user": self.user_state,
        }

    def save_checkpoint(self) -> str:
        """Rank 0 writes the checkpoint of the current step (other ranks: nothing)."""
        self._last_checkpoint = time.monotonic()
        if self.rank != 0:
            return ""
        return str(self.checkpoints.save(self.step, self.state_dict()))

    def restore(self) -> bool:
        """Load the newest complete checkpoint (rank 0 chooses, every rank loads the same)."""
        self._restored = True
        found = self.checkpoints.load() if self.rank == 0 else None
        choice = torch.tensor([found[0] + 1 if found else 0], dtype=torch.int64)
        if self.replicas > 1:
            shared = choice.to(self._device)
            dist.broadcast(shared, src=0)
            choice = shared.cpu()
        step = int(choice.item()) - 1
        if step < 0:
            self._log("no checkpoint in %s: starting from scratch", self.checkpoints.directory)
            return False
        if found is None:
            found = self.checkpoints.load(step)
        assert found is not None
        self.load_state_dict(found[1])
        self.restored_step = self.step
        self._log(
            "restored step %d (epoch %d, sample %d of %d) from %s",
            self.step,
            self.sampler.epoch,
            self.sampler.position,
            self.sampler.dataset_size,
            self.checkpoints.path(step),
        )
        return True

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != CHECKPOINT_FORMAT:
            raise CheckpointError(f"checkpoint format {state.get('format')!r} is not supported")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None and state["scheduler"] is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.sampler.load_state_dict(state["sampler"])
        self.noise.load_state_dict(state["noise"])
        self.reporter.load_profile_state(state["profile"])
        self.step = int(state["step"])
        self.progress = float(state["progress"])
        self.user_state = dict(state["user"])

    # ---- helpers -------------------------------------------------------------------------------

    def _initial_batch(self) -> Batch:
        env = self.env
        if self.replicas != env.gpus:
            logger.warning(
                "%d processes but the assignment has %d GPUs: using %d x %d x %d",
                self.replicas,
                env.gpus,
                self.replicas,
                env.local_bsz,
                env.accum_steps + 1,
            )
        batch_size = self.replicas * env.local_bsz * (env.accum_steps + 1)
        return Batch(batch_size, env.local_bsz, env.accum_steps)

    def _log(self, message: str, *args: Any) -> None:
        if self.rank == 0:
            logger.info(f"[round={self.round} job={self.env.sia_id}] {message}", *args)


class Step:
    """One optimizer step of one replica: its micro-batches, then :meth:`finish`."""

    def __init__(self, trainer: ElasticTrainer, plan: StepPlan):
        self.plan = plan
        self._trainer = trainer
        self._weight = 0.0
        self._previous: torch.Tensor | None = None
        self.local_sqr = 0.0  # sum over this replica's micro-batches of |g_i|^2
        self.global_sqr = 0.0
        self.last_start: float | None = None
        self.finished = False
        self.needs_local_norms = plan.uniform

    @property
    def index(self) -> int:
        """The number of this step (steps since the job first started, from 0)."""
        return self._trainer.step

    @property
    def epoch(self) -> int:
        return self.plan.epoch

    def micro_batches(self) -> Iterator[Any]:
        """This replica's micro-batches of the step (fetched data)."""
        last = len(self.plan.micro_batches) - 1
        for index, indices in enumerate(self.plan.micro_batches):
            if index == last:
                self.last_start = time.perf_counter()
            if not indices:
                continue
            self._weight = len(indices) / self.plan.size
            yield self._trainer.fetch(list(indices))

    def backward(self, loss: torch.Tensor) -> None:
        """Back-propagate ``loss`` (the mean over the current micro-batch), weighted so that
        the all-reduced gradient is the mean over the whole global batch."""
        (loss * self._weight).backward()
        if self.needs_local_norms and len(self.plan.micro_batches) > 1:
            flat = self._trainer._flat_grad().double()
            delta = flat if self._previous is None else flat - self._previous
            self.local_sqr += float(delta.dot(delta)) / self._weight**2
            self._previous = flat

    def finish(self) -> None:
        """All-reduce, optimizer step, metrics, and the agreement on stop and rebatch."""
        if self.finished:
            raise TrainerError("step.finish() called twice")
        self._trainer._finish(self)
        self.finished = True


def _init_process_group() -> tuple[int, int]:
    """``(rank, world size)``: join torchrun's process group, or run alone without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1 or not dist.is_available():
        return 0, 1
    backend = "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    dist.init_process_group(backend=backend)
    return dist.get_rank(), dist.get_world_size()
