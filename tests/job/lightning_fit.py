"""The Lightning module and fit of tests/job/test_lightning.py, in a module of their own that
the tests import when they run: Lightning's import (3.5 s of CPU) stays out of collection,
which every xdist worker repeats."""

from __future__ import annotations

from collections import Counter
from typing import Any

import lightning.pytorch as L
import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticDataLoader, ElasticJob
from sia_slurm.job.elastic.lightning import ElasticStrategy
from sia_slurm.job.jobenv import JobEnvironment

SIZE = 40


class Regression(L.LightningModule):
    """A linear model that records what it trained on; ``after(module)`` runs after each
    optimizer step (the job's step count moved)."""

    def __init__(self, job: ElasticJob, after: Any = None):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Linear(4, 1)
        self.job = job
        self.after = after
        self.seen: Counter[tuple[int, int]] = Counter()
        self.steps_seen = job.step
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(SIZE, 4, generator=gen)
        y = x @ torch.tensor([1.0, -2.0, 0.5, 3.0]) + 0.1 * torch.randn(SIZE, generator=gen)
        self.dataset = TensorDataset(x, y, torch.arange(SIZE))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y, indices = batch
        self.seen.update((self.current_epoch, int(i)) for i in indices)
        return F.mse_loss(self.net(x).squeeze(1), y)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.after is not None and self.job.step != self.steps_seen:
            self.steps_seen = self.job.step
            self.after(self)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.9)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def train_dataloader(self) -> ElasticDataLoader:
        return ElasticDataLoader(self.dataset, job=self.job)


def fit(
    env: JobEnvironment, epochs: int, after: Any = None, signals: bool = False
) -> tuple[ElasticJob, Regression]:
    job = ElasticJob(env, install_signal_handlers=signals, noise_decay=0.0, control_interval=1)
    module = Regression(job, after)
    trainer(job, epochs).fit(module)
    return job, module


def trainer(job: ElasticJob, epochs: int) -> L.Trainer:
    """A Lightning trainer of ``job`` on the CPU, quiet: no checkpoints, progress bar, summary
    or logger of Lightning's own (the job checkpoints)."""
    return L.Trainer(
        strategy=ElasticStrategy(job=job, lr_scaling="none"),
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        gradient_clip_val=100.0,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
