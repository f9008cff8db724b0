"""EMULATED trainer for demos on fake GPUs: its step time follows the job's throughput profile.

On the dev cluster the GPUs are fake and everything runs on a CPU, so a real model would be
equally fast on every "GPU type". This trainer makes the difference visible: each micro-batch
trains a small linear-regression model for real (so the loss falls, the gradient statistics
are genuine and checkpoints hold real state) and then sleeps until it has taken as long as the
app's measurements say one micro-batch of that size takes on the assigned GPU type and shape
(:class:`StepTimes`; ``--time-scale`` shrinks or stretches it): on one GPU the profile's
(``profiles/<app>/seed.csv``, 1-GPU measurements, linearly interpolated over the local batch),
on several the app's measured traces at that shape (``data/traces/<app>/placements-<key>.csv``,
as the simulator charges them), whose compute and all-reduce wait both grow with the GPU count
for some apps (yolov3: up to 2.4x the 1-GPU step on 4 GPUs). The synchronising micro-batch's
all-reduce wait is slept inside the real all-reduce (a DDP communication hook), so the reports
split step and sync time as the traces do. The reported step times therefore look like the
measured hardware. It says so in its log, and it is not a benchmark of anything. It takes
each type's speed from its measurements, so a dev cluster's slowdown of its GPU types
(``sia_slurm/job/elastic/devspeed.py``) does not apply to it. ``--untimed-scale c`` makes each
optimizer step last c times its emulated time with the excess spent after the step, where the
step timer does not see it: the simulator's calibration factor (``sia_slurm/sim/apptruth.py``:
data loading, evaluation and logging slow the app's progress, not the step times it reports).

When is it done? ``--progress`` chooses (``auto``, the default, is ``efficiency`` for an app with
validation traces in ``data/traces/`` and ``raw`` for any other, e.g. a test profile):

* ``raw`` (the original behaviour): after ``--epochs`` passes over ``--dataset-size`` samples,
  whatever the batch size; the metrics carry the linear regression's gradient statistics.
* ``efficiency``: like a simulated job (``sia_slurm/sim/progress.py``), it counts
  *M0-equivalent samples*: each optimizer step at batch ``M`` adds ``M0 x gain`` with the
  app's TRUE gradient statistics at its progress (``AppGradStats``, the validation file of the
  batch nearest ``M``), ``scale = M / M0``, M0 the app's. A job that grows its batch therefore
  needs more raw samples, as the real app would. It is done after ``--target-samples``
  M0-equivalent samples (default ``--epochs x --dataset-size``); the statistics are read at the
  same *fraction* of the app's whole training (``max_epochs`` x samples per epoch), so a
  shortened job still goes through the app's whole statistical trajectory, exactly as the
  simulator's time compression does (progress k times faster towards the full target). Its
  metrics report those trace statistics, normalised to the job's M0 as the simulator's are,
  instead of the toy model's, so the controller sees the app's noise scale. The toy model still
  trains (and scales its learning rate) on its own statistics.

Cost: the emulation's own CPU work is small and bounded, so the time it emulates is what the
profile says even at large batches on a crowded machine: a micro-batch is gathered with one
tensor index, and the toy model computes on its first ``COMPUTED_SAMPLES`` (1,024) samples only
(the sampler still walks the whole batch, and the gradient still counts with the micro-batch's
full weight). Above that local batch, raw mode's gradient statistics are those of 1,024-sample
micro-batches; efficiency mode reports the traces' statistics anyway.

    sia-sbatch --app cifar10 -- python -m sia_slurm.job.examples.emulated --epochs 50
"""

from __future__ import annotations

import argparse
import bisect
import logging
import math
import sys
import time
import typing
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.distributed as dist
from torch import futures, nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticTrainer, JobEnvironment, Step, devspeed
from sia_slurm.job.elastic.metrics_reporter import MetricsReporter
from sia_slurm.job.elastic.noise import GradientNoise
from sia_slurm.job.examples.common import SampleLog, parser, setup
from sia_slurm.model.efficiency import GradientStats
from sia_slurm.protocol import MetricsReport
from sia_slurm.protocol.profile import (
    GPU_TYPES_FILE,
    AppProfile,
    default_profiles_dir,
    load_app_profile,
    load_gpu_types,
)
from sia_slurm.sim.apps import default_traces_dir
from sia_slurm.sim.gradstats import AppGradStats, GradStatsError
from sia_slurm.sim.groundtruth import GroundTruth, GroundTruthError, has_ground_truth
from sia_slurm.sim.progress import true_gain

logger = logging.getLogger("sia_slurm.job.examples.emulated")
Fetch = Callable[[list[int]], tuple[torch.Tensor, ...]]
FEATURES = 16
PROGRESS_MODES = ("auto", "efficiency", "raw")
USER_STATE_KEY = "m0_progress"  # the checkpointed app progress (M0-equivalent samples)


class ProfileTimeError(ValueError):
    """The profile has no measurement for the assigned GPU type."""


def load_job_profile(env: JobEnvironment) -> AppProfile:
    """The profile the job was submitted with: a directory (``--profile``) or a shipped app."""
    root = default_profiles_dir()
    directory = Path(env.profile) if env.profile else root / env.app
    return load_app_profile(directory, load_gpu_types(root / GPU_TYPES_FILE))


def micro_batch_seconds(profile: AppProfile, gpu_type: str, local_bsz: int) -> float:
    """Compute time of one micro-batch of ``local_bsz`` on ``gpu_type`` (profile key), from the
    1-GPU seed points, linear between them and beyond the ends along the end segments."""
    points = sorted(
        (obs.local_bsz, obs.step_time - obs.sync_time)
        for obs in profile.seed.get(gpu_type, ())
        if obs.gpus == 1
    )
    if not points:
        known = ", ".join(sorted(profile.seed)) or "none"
        raise ProfileTimeError(
            f"profile {profile.name}: no 1-GPU seed measurement for GPU type {gpu_type!r} "
            f"(types with measurements: {known})"
        )
    if len(points) == 1:
        return points[0][1] * local_bsz / points[0][0]
    sizes = [size for size, _ in points]
    right = min(max(bisect.bisect_left(sizes, local_bsz), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[right - 1], points[right]
    value = y0 + (y1 - y0) * (local_bsz - x0) / (x1 - x0)
    return max(value, min(y for _, y in points) * 0.5)


@dataclass(frozen=True)
class EmulatedTimes:
    """One micro-batch's emulated compute, and the all-reduce wait of the synchronising one."""

    compute_s: float
    sync_s: float = 0.0

    def scaled(self, factor: float) -> EmulatedTimes:
        return EmulatedTimes(self.compute_s * factor, self.sync_s * factor)

    def step_s(self, micro_batches: int) -> float:
        """An optimizer step of ``micro_batches``: each computes, the last also synchronises
        (the simulator's ``T_iter = accum_steps * (step - sync) + step``)."""
        return micro_batches * self.compute_s + self.sync_s


class StepTimes:
    """Where the emulated times come from (module docstring): one GPU, the job's profile; several
    GPUs, the app's traces at that shape when it has them (a shipped app; not a ``--profile`` of
    the user's, whose traces nobody measured), else the profile's 1-GPU time with a real
    all-reduce, as before traces were used."""

    def __init__(self, profile: AppProfile, truth: GroundTruth | None):
        self.profile = profile
        self.truth = truth

    @classmethod
    def for_job(cls, profile: AppProfile, env: JobEnvironment) -> StepTimes:
        """The job's times: its profile, and the traces of its app on its profile type."""
        truth = None
        root = default_profiles_dir()
        gpu = load_gpu_types(root / GPU_TYPES_FILE).get(env.profile_gpu_type)
        traces = default_traces_dir()
        shipped = not env.profile and gpu is not None and gpu.trace_key
        if shipped and has_ground_truth(traces, env.app, gpu.trace_key):
            try:
                truth = GroundTruth.load(traces, env.app, gpu.trace_key, calibration=1.0)
            except GroundTruthError as exc:
                logger.warning("multi-GPU steps take the 1-GPU profile's time: %s", exc)
        return cls(profile, truth)

    def at(self, profile_type: str, nodes: int, gpus: int, local_bsz: int) -> EmulatedTimes:
        """The times of one micro-batch of ``local_bsz`` on ``gpus`` GPUs over ``nodes`` nodes."""
        if gpus == 1 or self.truth is None:
            return EmulatedTimes(micro_batch_seconds(self.profile, profile_type, local_bsz))
        step, sync = self.truth.step_time(nodes, gpus, local_bsz)
        return EmulatedTimes(float(step - sync), float(sync))


class SyncDelay:
    """A DDP communication hook that waits ``seconds`` before the step's last all-reduce: the
    emulated all-reduce wait, inside the window the job measures as sync time (from the last
    gradient to the end of the backward pass, sia_slurm/job/elastic/ddp.py)."""

    def __init__(self, sleep: Callable[[float], None] = time.sleep) -> None:
        self.seconds = 0.0
        self._sleep = sleep

    def install(self, trainer: ElasticTrainer) -> None:
        """Register on the trainer's DDP (before its first backward pass, as DDP requires)."""
        trainer.model.ddp.register_comm_hook(self, _delayed_allreduce)


def _delayed_allreduce(delay: SyncDelay, bucket: dist.GradBucket) -> futures.Future[torch.Tensor]:
    """DDP's own all-reduce (mean over the replicas), after the delay on the last bucket."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    if bucket.is_last() and delay.seconds > 0:
        delay._sleep(delay.seconds)
    return default_hooks.allreduce_hook(None, bucket)  # type: ignore[arg-type]


# DDP checks a hook's annotations as objects, and this module's are strings (PEP 563).
_delayed_allreduce.__annotations__ = typing.get_type_hints(_delayed_allreduce)


COMPUTED_SAMPLES = 1024
"""The most samples of a micro-batch the toy model computes on (module doc, "Cost")."""


def bounded_fetch(dataset: TensorDataset, computed: int = COMPUTED_SAMPLES) -> Fetch:
    """A micro-batch as the first ``computed`` of its samples, gathered in one tensor index.

    The trainer's default fetch collates sample by sample, which at a local batch of 32,768
    took 0.4-2 s of CPU (the profile's step there is 20 ms); this costs a few hundred
    microseconds whatever the batch.
    """
    tensors = dataset.tensors

    def fetch(indices: list[int]) -> tuple[torch.Tensor, ...]:
        chosen = torch.as_tensor(indices[:computed], dtype=torch.long)
        return tuple(t.index_select(0, chosen) for t in tensors)

    return fetch


def make_dataset(size: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(FEATURES, generator=generator)
    inputs = torch.randn(size, FEATURES, generator=generator)
    targets = inputs @ weights + 0.5 * torch.randn(size, generator=generator)
    return TensorDataset(inputs, targets)


class ProgressModeError(ValueError):
    """``--progress efficiency`` asked for an app without validation traces, or a bad target."""


@dataclass
class EfficiencyProgress:
    """A job's progress in the app's M0-equivalent samples, as the simulator counts it.

    ``app_progress`` runs from 0 to the app's ``completion_samples`` (its ``max_epochs`` of
    M0-equivalent samples); each optimizer step adds ``compression x M0 x gain``, so a job whose
    target is ``completion_samples / compression`` finishes after the same trajectory in the
    app's statistics as a simulated job whose progress runs ``compression`` times faster. The
    gain of a step is taken at its midpoint (the rule of :func:`sia_slurm.sim.progress.integrate`,
    with one optimizer step as the sub-step).
    """

    stats: AppGradStats
    compression: float = 1.0
    app_progress: float = 0.0

    @classmethod
    def for_target(cls, stats: AppGradStats, target_samples: float) -> EfficiencyProgress:
        """Done after ``target_samples`` M0-equivalent samples of this job."""
        if not (math.isfinite(target_samples) and target_samples > 0):
            raise ProgressModeError(
                f"--target-samples: expected a positive number, got {target_samples!r}"
            )
        return cls(stats, compression=stats.completion_samples / target_samples)

    @property
    def target(self) -> float:
        """The app progress at which the job is done (the simulator's completion target)."""
        return self.stats.completion_samples

    @property
    def done(self) -> bool:
        return self.app_progress >= self.target

    @property
    def job_progress(self) -> float:
        """M0-equivalent samples of this (compressed) job: ``app_progress / compression``."""
        return self.app_progress / self.compression

    def gain(self, batch_size: float, app_progress: float) -> float:
        """The app's true AdaScale gain at ``batch_size`` and ``app_progress``."""
        grad_sqr, grad_var = self.stats.at(batch_size, app_progress)
        scale = batch_size / self.stats.init_batch_size
        return float(true_gain(grad_sqr, grad_var, scale))

    def step(self, batch_size: float) -> float:
        """Account one optimizer step at ``batch_size``; returns the progress it added."""
        per_gain = self.compression * self.stats.init_batch_size
        first = self.gain(batch_size, self.app_progress)
        added = per_gain * self.gain(batch_size, self.app_progress + 0.5 * per_gain * first)
        self.app_progress += added
        return added

    def statistics(self, batch_size: float, job_init_batch_size: float) -> GradientStats:
        """The app's statistics now, normalised to the job's M0 (what the simulator reports)."""
        return self.stats.stats(batch_size, self.app_progress, init_batch_size=job_init_batch_size)


class _ReportedNoise(GradientNoise):
    """The statistics a report carries: fixed values instead of the toy model's estimates."""

    def __init__(self, init_batch_size: int, stats: GradientStats):
        super().__init__(init_batch_size)
        self._fixed = stats

    @property
    def grad_sqr(self) -> float:
        return self._fixed.grad_sqr

    @property
    def grad_var(self) -> float:
        return self._fixed.grad_var


class TraceStatsReporter(MetricsReporter):
    """Writes the usual metrics report, with ``grad_sqr``/``grad_var`` from ``statistics``
    (the app's trace statistics) instead of the trainer's measured ones."""

    def __init__(self, env: JobEnvironment, statistics: Callable[[], GradientStats]):
        super().__init__(env)
        self._statistics = statistics

    def report(
        self,
        *,
        steps: int,
        local_bsz: int,
        accum_steps: int,
        round_index: int,
        noise: GradientNoise,
    ) -> MetricsReport | None:
        reported = _ReportedNoise(noise.init_batch_size, self._statistics())
        return super().report(
            steps=steps,
            local_bsz=local_bsz,
            accum_steps=accum_steps,
            round_index=round_index,
            noise=reported,
        )


def efficiency_progress(mode: str, app: str, target_samples: float) -> EfficiencyProgress | None:
    """The progress accounting ``--progress`` asks for; ``None`` means raw epochs."""
    if mode == "raw":
        return None
    try:
        stats = AppGradStats.load(default_traces_dir(), app)
    except GradStatsError as exc:
        if mode == "auto":
            logger.info("app %s has no validation traces (%s): counting raw epochs", app, exc)
            return None
        raise ProgressModeError(f"--progress efficiency: app {app!r}: {exc}") from None
    return EfficiencyProgress.for_target(stats, target_samples)


def train(argv: list[str] | None = None) -> None:
    options = parser(__doc__.splitlines()[0], epochs=20, dataset_size=4096, lr=0.02)
    options.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply the profiled step time by this"
    )
    options.add_argument(
        "--untimed-scale",
        type=float,
        default=1.0,
        help="make each step last this many times its emulated time, the excess after the step "
        "where the step timer does not see it (the simulator's calibration factor; >= 1)",
    )
    options.add_argument("--app", default="cifar10", help="with --local: the profiled app")
    options.add_argument("--profile-type", default="t4", help="with --local: the GPU type")
    options.add_argument(
        "--progress",
        choices=PROGRESS_MODES,
        default="auto",
        help="when the job is done: raw epochs, or M0-equivalent samples with the app's "
        "statistical efficiency (auto: efficiency if the app has traces; see the module doc)",
    )
    options.add_argument(
        "--target-samples",
        type=float,
        default=None,
        help="with efficiency progress: M0-equivalent samples to train "
        "(default: --epochs x --dataset-size)",
    )
    args = options.parse_args(argv)
    if not args.untimed_scale >= 1.0:
        options.error(f"--untimed-scale: expected a factor >= 1, got {args.untimed_scale!r}")
    env = setup(args)
    if args.local is not None:
        env = replace(env, app=args.app, profile_gpu_type=args.profile_type)
    profile = load_job_profile(env)
    target = args.target_samples
    if target is None:
        target = float(args.epochs * args.dataset_size)
    try:
        progress = efficiency_progress(args.progress, env.app, target)
    except ProgressModeError as exc:
        options.error(str(exc))
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    dataset = make_dataset(args.dataset_size, args.seed)
    reporter = None
    if progress is not None:  # the app's trace statistics at the trainer's current batch
        reporter = TraceStatsReporter(
            env, lambda: progress.statistics(trainer.batch.batch_size, env.init_batch_size)
        )
    trainer = ElasticTrainer(
        model,
        optimizer,
        dataset,
        env=env,
        lr_scaling=args.lr_scaling,
        fetch=bounded_fetch(dataset),
        reporter=reporter,
    )
    devspeed.exempt(trainer.job)  # the times below are already the type's
    times = StepTimes.for_job(profile, env)
    delay = SyncDelay()
    if trainer.replicas > 1:
        delay.install(trainer)
    logger.info(
        "EMULATED trainer: micro-batch times follow profile %s on %s (%s on %d GPUs; x%g, "
        "steps x%g with the untimed part); the GPUs are not used",
        profile.name,
        env.profile_gpu_type,
        "the traces" if times.truth is not None and trainer.replicas > 1 else "1-GPU profile",
        trainer.replicas,
        args.time_scale,
        args.untimed_scale,
    )
    pacing = Pacing(times, delay, Pacer())
    if progress is None:
        run_raw_epochs(trainer, args, pacing, env)
    else:
        logger.info(
            "EMULATED progress: done after %g M0-equivalent samples (app %s: %g samples x "
            "compression %g), statistical efficiency from its traces",
            target,
            progress.stats.app,
            progress.target,
            progress.compression,
        )
        run_to_target(trainer, args, pacing, env, progress)
    leave_process_group()


def leave_process_group() -> None:
    """Tear gloo down before exit: every rank completes at the same step, so they can meet
    once more. Without it a rank of a multi-node job once died at exit with "terminate called
    without an active exception" (SIGABRT), and Slurm recorded a trained job as FAILED."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


class Pacer:
    """Emulated micro-batches whose mean *measured* duration is the target, on a crowded
    machine too.

    Sleeping "for what is left" of each micro-batch makes every one at least as long as its
    target plus the process's wake-up latency, which on a crowded machine is several
    milliseconds (a 20 ms ncf step on a 2-core machine at load 12 measured 36 ms). So what a
    micro-batch took beyond its budget is taken off the next one's, and what it took less is
    added to it: the differences cancel out on average.

    The difference that counts is the one the job reports. The step's last micro-batch is timed
    by the trainer (from the handing out of its data to the end of its gradient sync,
    :attr:`ElasticJob.last_timing`), not over the pacer's own window: a process descheduled
    between the pacer's start and the trainer's (a few statements, but at load 16 a process
    waits 10-30 ms for the CPU wherever it is) slept its whole budget after the trainer began
    timing a shorter one, and the reports said 14-16 ms for a 20.3 ms profile (CI, and a
    loaded run here, 2026-11-28). :meth:`measured` carries that difference, either way;
    the other micro-batches (accumulation) carry how late their wake-up was.

    At most ``catch_up_s`` is carried, and at most the next micro-batch's whole target is
    taken off it: a stall (a first step's allocations, a quarter second descheduled) is not
    made up over the steps after it. Nothing between micro-batches is carried (a checkpoint,
    a rebatch, the untimed part of a step).
    """

    catch_up_s = 0.25

    def __init__(
        self,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._clock = clock
        self._sleep = sleep
        self._deadline: float | None = None
        self._budget = 0.0
        self._carry = 0.0  # seconds the last micro-batch took beyond its budget (< 0: less)

    def now(self) -> float:
        return self._clock()

    def start(self, target_s: float, now: float) -> None:
        """A micro-batch of ``target_s`` started at ``now`` (a time from :meth:`now`)."""
        self._budget = target_s - min(self._carry, target_s)
        self._deadline = now + self._budget
        self._carry = 0.0

    def pause(self, seconds: float) -> None:
        """Sleep ``seconds`` between steps, outside every micro-batch: no deadline is moved and
        nothing is carried (the untimed part of a step, ``--untimed-scale``)."""
        if seconds > 0:
            self._sleep(seconds)

    def wait(self) -> None:
        """Sleep until the current micro-batch's deadline (not at all if it has passed)."""
        assert self._deadline is not None, "start() first"
        delay = self._deadline - self._clock()
        if delay > 0:
            self._sleep(delay)
        self._carry = self._bounded(max(self._clock() - self._deadline, 0.0))

    def measured(self, seconds: float, sync_s: float = 0.0) -> None:
        """The trainer timed the micro-batch that just ended at ``seconds``, where its budget
        plus the emulated all-reduce wait ``sync_s`` was planned: carry the difference instead
        of the wake-up's lateness."""
        self._carry = self._bounded(seconds - (self._budget + sync_s))

    def _bounded(self, seconds: float) -> float:
        return min(max(seconds, -self.catch_up_s), self.catch_up_s)


def emulated_step(trainer: ElasticTrainer, step: Step, times: EmulatedTimes, pacer: Pacer) -> float:
    """Train one step's micro-batches, each ``times.compute_s`` long from the start of its
    fetch (the trainer's measured step starts there too); returns the mean loss. The pause
    comes before the backward pass: the measured step ends when DDP's gradient sync does,
    inside it. The step the trainer timed tells the pacer how long it really was."""
    losses = []
    batches = iter(step.micro_batches())
    while True:
        started = pacer.now()
        try:
            inputs, targets = next(batches)
        except StopIteration:
            break
        pacer.start(times.compute_s, started)
        loss = F.mse_loss(trainer.model(inputs).squeeze(1), targets)
        pacer.wait()
        step.backward(loss)
        losses.append(loss.item())
    step.finish()
    timing = trainer.job.last_timing
    if timing is not None:
        pacer.measured(timing[0], times.sync_s)
    return sum(losses) / max(len(losses), 1)


@dataclass(frozen=True)
class Pacing:
    """What times a run's steps: the emulated times, the all-reduce delay, the pacer."""

    times: StepTimes
    delay: SyncDelay
    pacer: Pacer


def paced_step(
    trainer: ElasticTrainer,
    step: Step,
    args: argparse.Namespace,
    pacing: Pacing,
    env: JobEnvironment,
) -> tuple[float, float]:
    """One emulated step at the micro-batch times x ``--time-scale`` (:class:`StepTimes`, at the
    run's shape), then its untimed part (``--untimed-scale``); returns the mean loss and the
    micro-batch compute time. The batch is read before the step: ``finish()`` may adopt the
    next round's."""
    times = pacing.times.at(
        env.profile_gpu_type, env.nodes, trainer.replicas, trainer.batch.local_bsz
    ).scaled(args.time_scale)
    pacing.delay.seconds = times.sync_s
    micro_batches = trainer.batch.accum_steps + 1
    loss = emulated_step(trainer, step, times, pacing.pacer)
    pacing.pacer.pause((args.untimed_scale - 1.0) * times.step_s(micro_batches))
    return loss, times.compute_s


def run_raw_epochs(
    trainer: ElasticTrainer, args: argparse.Namespace, pacing: Pacing, env: JobEnvironment
) -> None:
    """The original mode: done after ``--epochs`` raw passes over the dataset."""
    log = SampleLog(args.sample_log, trainer.rank)
    for _epoch in trainer.epochs(args.epochs, max_steps=args.max_steps):
        for step in trainer.steps():
            loss, target = paced_step(trainer, step, args, pacing, env)
            log.write(trainer, step, loss, emulated_s=target)


def run_to_target(
    trainer: ElasticTrainer,
    args: argparse.Namespace,
    pacing: Pacing,
    env: JobEnvironment,
    progress: EfficiencyProgress,
) -> None:
    """Efficiency mode: train until the app progress reaches its target. Every rank accounts
    the same steps at the same batch, so all agree on the last step without communicating;
    the progress is checkpointed with the trainer's user state."""
    log = SampleLog(args.sample_log, trainer.rank)
    for _epoch in trainer.epochs(sys.maxsize, max_steps=args.max_steps):
        progress.app_progress = float(trainer.user_state.get(USER_STATE_KEY, 0.0))
        if progress.done:  # restored from the checkpoint of the last step
            trainer.max_steps = trainer.step
        for step in trainer.steps():
            batch_size = trainer.batch.batch_size  # finish() may adopt the next round's batch
            loss, target = paced_step(trainer, step, args, pacing, env)
            progress.step(batch_size)
            trainer.user_state[USER_STATE_KEY] = progress.app_progress
            if progress.done:
                trainer.max_steps = trainer.step  # steps() ends, epochs() completes the job
            log.write(trainer, step, loss, emulated_s=target, m0_progress=progress.job_progress)


def main() -> None:
    train(sys.argv[1:])


if __name__ == "__main__":
    main()
