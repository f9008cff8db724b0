"""A small CNN on generated images, made elastic with the sia-slurm training helpers.

The data are 12x12 one-channel images of four classes: each class is a fixed random pattern,
and every sample adds Gaussian noise to its class's pattern (no download). Submit it with::

    sia-sbatch --app cifar10 --max-gpus 8 -- python -m sia_slurm.job.examples.cnn --epochs 20

or try it by hand: ``python -m sia_slurm.job.examples.cnn --local /tmp/cnn --epochs 2``.

The user change, compared with a plain single-GPU script, is the marked block in
:func:`train`: build an :class:`~sia_slurm.job.elastic.ElasticTrainer`, loop over its epochs,
steps and micro-batches, call ``step.backward`` and ``step.finish``. The trainer restores the
newest checkpoint, follows the batch size the scheduler assigns, scales the learning rate,
reports metrics and checkpoints when the controller asks.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticTrainer
from sia_slurm.job.examples.common import SampleLog, parser, setup

CLASSES = 4
SIDE = 12


def make_dataset(size: int, seed: int) -> TensorDataset:
    """Noisy copies of one fixed random pattern per class."""
    generator = torch.Generator().manual_seed(seed)
    patterns = torch.randn(CLASSES, 1, SIDE, SIDE, generator=generator)
    labels = torch.randint(0, CLASSES, (size,), generator=generator)
    images = patterns[labels] + 1.0 * torch.randn(size, 1, SIDE, SIDE, generator=generator)
    return TensorDataset(images, labels)


class SmallCnn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.head(x.mean(dim=(2, 3)))


def train(argv: list[str] | None = None) -> None:
    args = parser(__doc__.splitlines()[0], epochs=10, dataset_size=2048, lr=0.1).parse_args(argv)
    env = setup(args)
    dataset = make_dataset(args.dataset_size, args.seed)
    model = SmallCnn()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    # ---- the user change: elastic loop -------------------------------------------------------
    trainer = ElasticTrainer(
        model, optimizer, dataset, scheduler=scheduler, env=env, lr_scaling=args.lr_scaling
    )
    log = SampleLog(args.sample_log, trainer.rank)
    for _epoch in trainer.epochs(args.epochs, max_steps=args.max_steps):
        for step in trainer.steps():
            losses = []
            for images, labels in step.micro_batches():
                loss = F.cross_entropy(trainer.model(images), labels)
                step.backward(loss)
                losses.append(loss.item())
            step.finish()
            log.write(trainer, step, sum(losses) / max(len(losses), 1))
        scheduler.step()
    # ------------------------------------------------------------------------------------------


def main() -> None:
    train(sys.argv[1:])


if __name__ == "__main__":
    main()
