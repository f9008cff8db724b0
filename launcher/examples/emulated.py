"""EMULATED trainer for demos on fake GPUs: its step time follows the job's throughput profile.

On the dev cluster the GPUs are fake and everything runs on a CPU, so a real model would be
equally fast on every "GPU type". This trainer makes the difference visible: each micro-batch
trains a small linear-regression model for real (so the loss falls, the gradient statistics
are genuine and checkpoints hold real state) and then sleeps until it has taken as long as the
app's profile says one micro-batch of that size takes on the assigned GPU type
(``profiles/<app>/seed.csv``, 1-GPU measurements, linearly interpolated over the local batch;
``--time-scale`` shrinks or stretches it). The reported step times therefore look like the
profiled hardware; the all-reduce is the real one. It says so in its log, and it is not a
benchmark of anything.

    sia-sbatch --app cifar10 -- python -m launcher.examples.emulated --epochs 50
"""

from __future__ import annotations

import bisect
import logging
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from launcher.elastic import ElasticTrainer, JobEnvironment
from launcher.examples.common import SampleLog, parser, setup
from sia_slurm.model.profile import (
    GPU_TYPES_FILE,
    AppProfile,
    default_profiles_dir,
    load_app_profile,
    load_gpu_types,
)

logger = logging.getLogger("launcher.examples.emulated")
FEATURES = 16


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


def make_dataset(size: int, seed: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(seed)
    weights = torch.randn(FEATURES, generator=generator)
    inputs = torch.randn(size, FEATURES, generator=generator)
    targets = inputs @ weights + 0.5 * torch.randn(size, generator=generator)
    return TensorDataset(inputs, targets)


def train(argv: list[str] | None = None) -> None:
    options = parser(__doc__.splitlines()[0], epochs=20, dataset_size=4096, lr=0.02)
    options.add_argument(
        "--time-scale", type=float, default=1.0, help="multiply the profiled step time by this"
    )
    options.add_argument("--app", default="cifar10", help="with --local: the profiled app")
    options.add_argument("--profile-type", default="t4", help="with --local: the GPU type")
    args = options.parse_args(argv)
    env = setup(args)
    if args.local is not None:
        env = replace(env, app=args.app, profile_gpu_type=args.profile_type)
    profile = load_job_profile(env)
    model = nn.Linear(FEATURES, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    trainer = ElasticTrainer(
        model,
        optimizer,
        make_dataset(args.dataset_size, args.seed),
        env=env,
        lr_scaling=args.lr_scaling,
    )
    logger.info(
        "EMULATED trainer: micro-batch times follow profile %s on %s (x%g); the GPUs are not used",
        profile.name,
        env.profile_gpu_type,
        args.time_scale,
    )
    log = SampleLog(args.sample_log, trainer.rank)
    for _epoch in trainer.epochs(args.epochs, max_steps=args.max_steps):
        for step in trainer.steps():
            target = args.time_scale * micro_batch_seconds(
                profile, env.profile_gpu_type, trainer.batch.local_bsz
            )
            losses = []
            for inputs, targets in step.micro_batches():
                started = time.perf_counter()
                loss = F.mse_loss(model(inputs).squeeze(1), targets)
                step.backward(loss)
                losses.append(loss.item())
                time.sleep(max(0.0, target - (time.perf_counter() - started)))
            step.finish()
            log.write(trainer, step, sum(losses) / max(len(losses), 1), emulated_s=target)


def main() -> None:
    train(sys.argv[1:])


if __name__ == "__main__":
    main()
