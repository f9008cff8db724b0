"""The DDP script of ddp_plain.py made elastic under sia-slurm (``diff ddp_plain.py
ddp_elastic.py``: docs/protocol.md shows it; tests/job/test_elastic_ddp.py counts it).

    sia-sbatch --app cifar10 --max-gpus 8 -- python -m sia_slurm.job.examples.ddp_elastic
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.nn import functional as F

import sia_slurm.job.elastic as elastic
from sia_slurm.job.examples.ddp_parts import (
    StepLog,
    make_dataset,
    make_model,
    options,
    setup_logging,
)


def main(argv: list[str] | None = None) -> None:
    args = options(__doc__.splitlines()[0]).parse_args(argv)
    setup_logging()
    job = elastic.init(seed=args.seed)
    dataset = make_dataset(args.dataset_size, args.seed)
    model = make_model(args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", growth_interval=args.growth_interval)
    model = elastic.ElasticDataParallel(model, optimizer, scheduler=scheduler, scaler=scaler)
    loader = elastic.ElasticDataLoader(dataset, num_workers=args.workers)
    log = StepLog(args.sample_log, dist.get_rank())
    for _epoch in job.remaining_epochs(args.epochs, max_steps=args.max_steps):
        for images, labels, indices in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            model.clip_grad_norm_(5.0)
            log.write(indices, loss, scaler.get_scale())
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        scheduler.step()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
