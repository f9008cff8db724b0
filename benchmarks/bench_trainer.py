"""Per-step cost of the elastic DDP wrappers against the same loop in plain DDP, on CPU (gloo).

Run: ``python benchmarks/bench_trainer.py [--procs 2 4] [--steps 30] [--blocks 5]``. For each
process count it starts that many gloo processes; each alternates blocks of ``--steps`` steps
of (a) plain ``DistributedDataParallel`` with a ``DataLoader`` and ``DistributedSampler`` and
(b) the same model, optimizer and data through ``ElasticDataParallel`` and
``ElasticDataLoader`` (with the per-step control all-reduce, noise statistics and LR scaling),
ABAB..., so both see the same machine load; (a) runs twice per block, with DDP's default
``gradient_as_bucket_view=False`` and with ``True`` as the wrappers use it, so the wrappers'
own cost is the "vs bucket views" column; and a third time with torch's own Python
communication hook (``default_hooks.allreduce_hook``), the cost any Python hook pays. A
step's time is rank 0's wall time from one optimizer step to the next, and its process CPU
time over the same interval (all threads, gloo's included: less sensitive than wall time to
the other processes of a loaded machine);
the table gives each mode's median over all blocks' steps and the overhead of (b) over (a).
Goal (issue 17): < 5% at 2 and 4 processes.

Extra memory per parameter: the bytes of the tensors the wrappers keep across steps beyond
DDP's own (its buckets; with ``gradient_as_bucket_view`` the gradients are views of them),
counted from the wrappers' state after the last step, divided by the parameter count.
Plain DDP's default (``gradient_as_bucket_view=False``) holds a second copy of the gradients
in its buckets; the wrappers turn bucket views on, so they hold one fewer.

The model is an MLP of ~2.1 M parameters (four 724-wide layers) on random data, 32 samples
per process and step; the machine's load average is printed with the table (timings on a
shared 2-core machine are noisy: compare the two columns of one row, not rows).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sia_slurm.job.elastic import ElasticDataLoader, ElasticDataParallel, ElasticJob  # noqa: E402
from sia_slurm.job.jobenv import JobEnvironment  # noqa: E402

WIDTH = 724
LOCAL_BSZ = 32


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(4):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def make_data(size: int) -> TensorDataset:
    gen = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(size, WIDTH, generator=gen), torch.randn(size, WIDTH))


def timed_steps(
    model: torch.nn.Module, optimizer: Any, loader: Any, steps: int
) -> list[tuple[float, float]]:
    """``(wall, cpu)`` seconds of each step but the first (which starts the loader)."""
    times, last = [], (time.perf_counter(), time.process_time())
    for count, (x, y) in enumerate(loader):
        F.mse_loss(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
        now = (time.perf_counter(), time.process_time())
        times.append((now[0] - last[0], now[1] - last[1]))
        last = now
        if count + 1 >= steps:
            break
    return times[1:]


def worker(rank: int, world: int, port: int, args: argparse.Namespace, out: Path) -> None:
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    data = make_data(LOCAL_BSZ * world * (args.steps + 1) * 2)
    with tempfile.TemporaryDirectory() as work:
        env = JobEnvironment.standalone(Path(work), LOCAL_BSZ * world)
        env = JobEnvironment(
            **{**env.__dict__, "gpus": world, "local_bsz": LOCAL_BSZ, "poll_interval_s": 1.0}
        )
        job = ElasticJob(env, install_signal_handlers=False)
        plain: list[tuple[float, float]] = []
        views: list[tuple[float, float]] = []
        elastic: list[tuple[float, float]] = []
        hooked: list[tuple[float, float]] = []
        extra_bytes = 0
        for _ in range(args.blocks):
            for as_view, times in ((False, plain), (True, views), (True, hooked)):
                model = DistributedDataParallel(make_model(), gradient_as_bucket_view=as_view)
                if times is hooked:
                    model.register_comm_hook(None, default_hooks.allreduce_hook)
                optimizer = torch.optim.SGD(model.parameters(), lr=1e-4, momentum=0.9)
                sampler = DistributedSampler(data, seed=0)
                loader = DataLoader(data, LOCAL_BSZ, sampler=sampler)
                times += timed_steps(model, optimizer, loader, args.steps)
            module = make_model()
            optimizer = torch.optim.SGD(module.parameters(), lr=1e-4, momentum=0.9)
            wrapped = ElasticDataParallel(module, optimizer, job=job)
            job.sampler = None
            elastic_loader = ElasticDataLoader(data, job=job)
            elastic += timed_steps(wrapped, optimizer, elastic_loader, args.steps)
            extra_bytes = kept_bytes(job, wrapped)
        params = sum(p.numel() for p in make_model().parameters())
    if rank == 0:
        medians = [
            statistics.median(t[k] for t in times) * 1e3
            for k in (0, 1)
            for times in (plain, views, elastic, hooked)
        ]
        out.write_text(" ".join(map(str, [world, *medians, extra_bytes / params, params])))
    dist.barrier()
    dist.destroy_process_group()


def kept_bytes(job: ElasticJob, wrapped: ElasticDataParallel) -> int:
    """Bytes of tensors the job keeps between steps (noise sums, previous gradient copies)."""
    stats = job.stats
    tensors = [*stats.micro_sqr, *stats.global_sqr]
    tensors += [*stats.single_sqr, *stats.single_cross, *wrapped.previous_gradient.values()]
    unique = {t.data_ptr(): t.numel() * t.element_size() for t in tensors}
    return sum(unique.values())


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def main() -> None:
    parse = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parse.add_argument("--procs", type=int, nargs="+", default=[2, 4])
    parse.add_argument("--steps", type=int, default=30, help="steps per block")
    parse.add_argument("--blocks", type=int, default=5, help="blocks of each mode (ABAB...)")
    args = parse.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for world in args.procs:
            out = Path(work) / f"w{world}.txt"
            mp.spawn(worker, args=(world, free_port(), args, out), nprocs=world, join=True)
            rows.append(out.read_text().split())
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    print(
        "| processes | time | plain DDP ms/step | plain DDP, bucket views | elastic "
        "| elastic vs plain | vs bucket views | bucket views + torch's Python allreduce hook "
        "| extra B/param |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        world, values, extra = row[0], [float(v) for v in row[1:9]], float(row[9])
        for name, (plain, views, elastic, hooked) in (("wall", values[:4]), ("CPU", values[4:])):
            print(
                f"| {world} | {name} | {plain:.2f} | {views:.2f} | {elastic:.2f} "
                f"| {(elastic / plain - 1) * 100:+.1f}% | {(elastic / views - 1) * 100:+.1f}% "
                f"| {hooked:.2f} ({(hooked / views - 1) * 100:+.1f}%) | {extra:.2f} |"
            )
    print(f"parameters: {rows[0][10]}; {LOCAL_BSZ} samples per process and step")


if __name__ == "__main__":
    main()
