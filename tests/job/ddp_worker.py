"""One replica of a 2-process gloo job trained with the DDP wrappers for one step; records
what the gradient-noise estimate saw (used by test_elastic_ddp.py; not a test)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from torch.nn import functional as F
from torch.utils.data import TensorDataset

import sia_slurm.job.elastic as elastic


def dataset(size: int = 64) -> TensorDataset:
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(size, 6, generator=gen)
    y = x @ torch.arange(6.0) + torch.randn(size, generator=gen)
    return TensorDataset(x, y, torch.arange(size))


def main(out_dir: Path, amp: bool, size: int, steps: int) -> None:
    torch.set_num_threads(1)
    job = elastic.init(noise_decay=0.0, control_interval=1, install_signal_handlers=False)
    torch.manual_seed(3)
    model = torch.nn.Linear(6, 1)
    initial = {k: v.tolist() for k, v in model.state_dict().items()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, enabled=amp)
    ddp = elastic.ElasticDataParallel(model, optimizer, scaler=scaler)
    loader = elastic.ElasticDataLoader(dataset(size), num_workers=1)
    micro_batches: list[list[int]] = []
    for _ in job.remaining_epochs(1, max_steps=steps):
        for inputs, targets, indices in loader:
            micro_batches.append(indices.tolist())
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = F.mse_loss(ddp(inputs).squeeze(1), targets)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
    record = {
        "rank": job.rank,
        "replicas": job.replicas,
        "micro_batches": micro_batches,
        "initial": initial,
        "sample": job.last_noise_sample,
        "grad_sqr": job.noise.grad_sqr,
        "grad_var": job.noise.grad_var,
        "weight_after": model.weight.detach().reshape(-1).tolist(),
        "bias_after": model.bias.detach().reshape(-1).tolist(),
    }
    (out_dir / f"rank{job.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2] == "amp", int(sys.argv[3]), int(sys.argv[4]))
    os._exit(0)
