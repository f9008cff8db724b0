"""An ordinary DDP training script (torchrun, DataLoader workers, bf16 autocast, GradScaler,
clipping): the baseline that ddp_elastic.py changes in a few lines.

    torchrun --nproc-per-node 2 -m sia_slurm.job.examples.ddp_plain --epochs 2
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

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
    dist.init_process_group("gloo")
    dataset = make_dataset(args.dataset_size, args.seed)
    model = make_model(args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", growth_interval=args.growth_interval)
    model = DistributedDataParallel(model)
    sampler = DistributedSampler(dataset, seed=args.seed)
    local_bsz = args.batch_size // dist.get_world_size()
    loader = DataLoader(dataset, local_bsz, sampler=sampler, num_workers=args.workers)
    log = StepLog(args.sample_log, dist.get_rank())
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for images, labels, indices in loader:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            log.write(indices, loss, scaler.get_scale())
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        scheduler.step()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
