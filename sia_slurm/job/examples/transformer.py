"""A small causal transformer language model on generated sequences, made elastic.

The data are token sequences drawn from a fixed random Markov chain over a 16-token
vocabulary (no download); the model learns to predict the next token, so its loss falls
towards the chain's entropy. Submit it with::

    sia-sbatch --app bert --max-gpus 8 -- python -m sia_slurm.job.examples.transformer --epochs 5

or try it by hand: ``python -m sia_slurm.job.examples.transformer --local /tmp/lm --epochs 2``.

The user change is the marked block in :func:`train`, the same four calls as in
:mod:`sia_slurm.job.examples.cnn`.
"""

from __future__ import annotations

import sys

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticTrainer
from sia_slurm.job.examples.common import SampleLog, parser, setup

VOCAB = 16
LENGTH = 16
WIDTH = 32


def make_dataset(size: int, seed: int) -> TensorDataset:
    """Sequences of a random Markov chain with peaked transitions (learnable, not trivial)."""
    generator = torch.Generator().manual_seed(seed)
    transitions = torch.softmax(3.0 * torch.randn(VOCAB, VOCAB, generator=generator), dim=1)
    tokens = torch.empty(size, LENGTH + 1, dtype=torch.long)
    tokens[:, 0] = torch.randint(0, VOCAB, (size,), generator=generator)
    for position in range(1, LENGTH + 1):
        tokens[:, position] = torch.multinomial(
            transitions[tokens[:, position - 1]], 1, generator=generator
        ).squeeze(1)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


class TinyLanguageModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.position = nn.Parameter(torch.zeros(LENGTH, WIDTH))
        layer = nn.TransformerEncoderLayer(
            WIDTH, nhead=2, dim_feedforward=64, dropout=0.0, batch_first=True
        )
        self.encoder = nn.TransformerEncoder(layer, num_layers=1, enable_nested_tensor=False)
        self.head = nn.Linear(WIDTH, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        hidden = self.embed(tokens) + self.position
        return self.head(self.encoder(hidden, mask=self.mask, is_causal=True))


def train(argv: list[str] | None = None) -> None:
    args = parser(__doc__.splitlines()[0], epochs=5, dataset_size=2048, lr=3e-3).parse_args(argv)
    env = setup(args)
    dataset = make_dataset(args.dataset_size, args.seed)
    model = TinyLanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    # ---- the user change: elastic loop -------------------------------------------------------
    trainer = ElasticTrainer(model, optimizer, dataset, env=env, lr_scaling=args.lr_scaling)
    log = SampleLog(args.sample_log, trainer.rank)
    for _epoch in trainer.epochs(args.epochs, max_steps=args.max_steps):
        for step in trainer.steps():
            losses = []
            for inputs, targets in step.micro_batches():
                logits = trainer.model(inputs)
                loss = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))
                step.backward(loss)
                losses.append(loss.item())
            step.finish()
            log.write(trainer, step, sum(losses) / max(len(losses), 1))
    # ------------------------------------------------------------------------------------------


def main() -> None:
    train(sys.argv[1:])


if __name__ == "__main__":
    main()
