"""One replica of a 2-process gloo job that trains a single step and records what its
gradient-noise estimate was built from (used by test_noise_distributed.py; not a test)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from sia_slurm.job.elastic import ElasticTrainer, JobEnvironment


def main(out_dir: Path) -> None:
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(64, 6, generator=gen)
    data = TensorDataset(x, x @ torch.arange(6.0) + torch.randn(64, generator=gen))
    torch.manual_seed(3)
    model = torch.nn.Linear(6, 1)
    initial = {k: v.tolist() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    trainer = ElasticTrainer(
        model,
        optimizer,
        data,
        env=JobEnvironment.from_env(),
        noise_decay=0.0,
        install_signal_handlers=False,
    )
    micro_batches: list[list[int]] = []
    for _ in trainer.epochs(1, max_steps=1):
        for step in trainer.steps():
            micro_batches = [list(m) for m in step.plan.micro_batches]
            for inputs, targets in step.micro_batches():
                step.backward(F.mse_loss(trainer.model(inputs).squeeze(1), targets))
            step.finish()
    record = {
        "rank": trainer.rank,
        "replicas": trainer.replicas,
        "micro_batches": micro_batches,
        "initial": initial,
        "grad_sqr": trainer.noise.grad_sqr,
        "grad_var": trainer.noise.grad_var,
        "weight_after": model.weight.detach().reshape(-1).tolist(),
    }
    (out_dir / f"rank{trainer.rank}.json").write_text(json.dumps(record))
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    os._exit(0)
