"""What the example scripts share that is *not* part of the user change: command-line options,
logging, a local (no-controller) mode, and an optional per-step sample log for tests and demos.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

import torch

from sia_slurm.job.elastic import LR_SCALING_RULES, ElasticTrainer, JobEnvironment, Step


def parser(
    description: str, *, epochs: int, dataset_size: int, lr: float
) -> argparse.ArgumentParser:
    """Options every example takes."""
    parse = argparse.ArgumentParser(description=description)
    parse.add_argument("--epochs", type=int, default=epochs, help="epochs to train")
    parse.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parse.add_argument("--dataset-size", type=int, default=dataset_size, help="generated samples")
    parse.add_argument("--lr", type=float, default=lr, help="learning rate at the initial batch")
    parse.add_argument("--seed", type=int, default=0, help="seed of the data and the model")
    parse.add_argument(
        "--lr-scaling", choices=LR_SCALING_RULES, default="adascale", help="batch-size LR rule"
    )
    parse.add_argument(
        "--local",
        type=Path,
        metavar="DIR",
        help="run by hand in one process (no sia-launch): checkpoints and reports go under DIR",
    )
    parse.add_argument("--batch-size", type=int, default=32, help="global batch with --local")
    parse.add_argument(
        "--sample-log",
        type=Path,
        metavar="DIR",
        help="append one JSON line per step per rank (indices, loss) to DIR/samples-r<rank>.jsonl",
    )
    return parse


def setup(args: argparse.Namespace) -> JobEnvironment:
    """Logging, one thread per process (these are small CPU demos), and the job environment."""
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s",
    )
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    if args.local is not None:
        return JobEnvironment.standalone(args.local, args.batch_size)
    return JobEnvironment.from_env()


class SampleLog:
    """Per-step record of what a rank trained on; lets tests check "no sample skipped or
    repeated" and "loss keeps decreasing" across restarts."""

    def __init__(self, directory: Path | None, rank: int):
        self._handle: IO[str] | None = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._handle = open(directory / f"samples-r{rank}.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def write(self, trainer: ElasticTrainer, step: Step, loss: float, **extra: Any) -> None:
        """Record ``step`` (call after ``step.finish()``: only applied steps are logged)."""
        if self._handle is None:
            return
        record = {
            "step": trainer.step - 1,
            "epoch": step.epoch,
            "round": trainer.round,
            "restarts": trainer.env.restarts,
            "gpu_type": trainer.env.gpu_type,
            "replicas": trainer.replicas,
            "batch_size": trainer.batch.batch_size,
            "local_bsz": trainer.batch.local_bsz,
            "accum_steps": trainer.batch.accum_steps,
            "micro_batches": [list(m) for m in step.plan.micro_batches],
            "loss": loss,
            **extra,
        }
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()
