"""The DDP examples' model as a PyTorch Lightning module, elastic under sia-slurm
(``pip install 'sia-slurm[lightning]'``). The user change against an ordinary Lightning script
is two lines, marked below: ``strategy=ElasticStrategy()`` and an ``ElasticDataLoader``.

    sia-sbatch --app cifar10 --max-gpus 8 -- python -m sia_slurm.job.examples.lightning_elastic
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader

from sia_slurm.job.elastic import ElasticDataLoader
from sia_slurm.job.elastic.lightning import ElasticStrategy
from sia_slurm.job.examples.ddp_parts import (
    StepLog,
    make_dataset,
    make_model,
    options,
    setup_logging,
)


class Classifier(L.LightningModule):
    def __init__(self, args: Any, sample_log: Path | None):
        super().__init__()
        self.args = args
        self.net = make_model(args.seed)
        self.dataset = make_dataset(args.dataset_size, args.seed)
        self.sample_log = sample_log
        self.log_file: StepLog | None = None

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels, indices = batch
        loss = F.cross_entropy(self(images), labels)
        if self.log_file is None:
            self.log_file = StepLog(self.sample_log, self.global_rank)
        self.log_file.write(indices, loss, 1.0)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels, _ = batch
        self.log("val_loss", F.cross_entropy(self(images), labels), sync_dist=True)

    def val_dataloader(self) -> Any:  # an ordinary loader: Lightning shards it
        return DataLoader(make_dataset(64, self.args.seed + 1), batch_size=16)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.parameters(), lr=self.args.lr, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}

    def train_dataloader(self) -> Any:
        return ElasticDataLoader(self.dataset, num_workers=self.args.workers)  # the change


def main(argv: list[str] | None = None) -> None:
    args = options(__doc__.splitlines()[0]).parse_args(argv)
    setup_logging()
    trainer = L.Trainer(
        strategy=ElasticStrategy(),  # the change
        accelerator="auto",
        devices=1,  # per process: torchrun (sia-launch) starts one process per GPU
        max_epochs=args.epochs,
        gradient_clip_val=5.0,
        enable_checkpointing=False,  # the job's checkpoints are sia-slurm's
        enable_progress_bar=False,
        logger=False,
    )
    trainer.fit(Classifier(args, args.sample_log))


if __name__ == "__main__":
    main(sys.argv[1:])
