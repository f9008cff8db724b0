"""What the two DDP examples share and is not the user's change: the data, the model, the
command line and a per-step log for tests (``ddp_plain.py`` is the ordinary DDP script,
``ddp_elastic.py`` the same script made elastic; ``docs/protocol.md`` shows the diff)."""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import IO, Any

import torch
from torch import nn
from torch.utils.data import TensorDataset

CLASSES = 4
SIDE = 12


def options(description: str) -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(description=description)
    parse.add_argument("--epochs", type=int, default=10, help="epochs to train")
    parse.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    parse.add_argument("--dataset-size", type=int, default=2048, help="generated samples")
    parse.add_argument("--batch-size", type=int, default=32, help="global batch (plain DDP)")
    parse.add_argument("--lr", type=float, default=0.05, help="learning rate")
    parse.add_argument("--seed", type=int, default=0, help="seed of the data and the model")
    parse.add_argument("--workers", type=int, default=2, help="DataLoader worker processes")
    parse.add_argument("--growth-interval", type=int, default=2000, help="GradScaler's")
    parse.add_argument("--sample-log", type=Path, metavar="DIR", help="per-step JSON lines")
    return parse


def setup_logging() -> None:
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s rank{rank} %(name)s %(levelname)s %(message)s"
    )
    torch.set_num_threads(1)


def make_dataset(size: int, seed: int) -> TensorDataset:
    """Noisy copies of one fixed random 12x12 pattern per class (no download)."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(CLASSES, 1, SIDE, SIDE, generator=generator)
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    images = patterns[labels] + torch.randn(size, 1, SIDE, SIDE, generator=generator)
    return TensorDataset(images, labels, torch.arange(size))


def make_model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(16, CLASSES),
    )


class StepLog:
    """One JSON line per micro-batch (``samples-r<rank>.jsonl``): the indices trained, the
    loss, the loss scale; for tests of "no sample skipped or repeated" across moves."""

    def __init__(self, directory: Path | None, rank: int):
        self._handle: IO[str] | None = None
        if directory is not None:
            directory.mkdir(parents=True, exist_ok=True)
            self._handle = open(directory / f"samples-r{rank}.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def write(self, indices: torch.Tensor, loss: torch.Tensor, scale: float) -> None:
        if self._handle is None:
            return
        record = {
            **_elastic_position(),
            "indices": indices.tolist(),
            "loss": float(loss.detach()),
            "scale": scale,
        }
        self._handle.write(json.dumps(record) + "\n")
        self._handle.flush()


def _elastic_position() -> dict[str, Any]:
    """The elastic job's step, run and batch when the script made one (not in plain DDP)."""
    from sia_slurm.job.elastic import job

    return job._current.position() if job._current is not None else {}
