"""Joining the job's process group: the backend from the device, and timeouts that end a step
whose peer died instead of hanging it.

``torchrun`` (started by ``sia-launch``) exports ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and
the rendezvous address; the rendezvous port is reserved host-wide by ``sia-launch`` for the
run's life (``sia_slurm/job/runs.py``), so no other job's store is joined. The backend is ``nccl``
when the process has a CUDA device and NCCL is built in, ``gloo`` otherwise (CPU, tests).

The GPU path, which cannot be run on this project's CI (no GPU), is these few lines:

- ``torch.cuda.set_device(LOCAL_RANK)`` before the group is made, and ``device_id`` passed
  to it, so NCCL binds each rank to its GPU at once;
- ``TORCH_NCCL_ASYNC_ERROR_HANDLING=1`` (tear down the process on a collective's timeout or
  error: a dead peer ends the step with an exception, not a hang) and
  ``TORCH_NCCL_BLOCKING_WAIT=0``, set only where the user has not set them;
- the group's ``timeout`` (``SIA_COLLECTIVE_TIMEOUT_S``, default 300 s): the longest a
  collective waits for a peer. It bounds how long a surviving rank hangs when another died
  (gloo honours it as well).

A run by hand (``WORLD_SIZE`` unset or 1) gets a one-process group of the same backend on an
in-memory store, so ``DistributedDataParallel`` can wrap the model in every case: one code
path. (No GPU was available to this project's tests: the CUDA lines above are written from
PyTorch's documentation.)
"""

from __future__ import annotations

import datetime
import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)
DEFAULT_TIMEOUT_S = 300.0
TIMEOUT_VARIABLE = "SIA_COLLECTIVE_TIMEOUT_S"
_NCCL_DEFAULTS = {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1", "TORCH_NCCL_BLOCKING_WAIT": "0"}


class DistributedError(RuntimeError):
    """The process group cannot be made as the environment describes it."""


def choose_backend(cuda_available: bool, nccl_available: bool) -> str:
    """``nccl`` for a process with a GPU and an NCCL build, ``gloo`` otherwise."""
    return "nccl" if cuda_available and nccl_available else "gloo"


def collective_timeout(environ: dict[str, str] | os._Environ[str] = os.environ) -> float:
    """Seconds a collective may wait for a peer (``SIA_COLLECTIVE_TIMEOUT_S``)."""
    raw = environ.get(TIMEOUT_VARIABLE)
    if raw is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise DistributedError(f"{TIMEOUT_VARIABLE}: expected seconds > 0, got {raw!r}")
    return value


def init_process_group() -> tuple[int, int, torch.device]:
    """``(rank, world size, device)``, joining torchrun's group (or making a one-process one).

    An existing group (the script made its own) is used as it is.
    """
    device = _device()
    if dist.is_initialized():
        return dist.get_rank(), dist.get_world_size(), device
    world = int(os.environ.get("WORLD_SIZE", "1"))
    timeout = datetime.timedelta(seconds=collective_timeout())
    backend = choose_backend(device.type == "cuda", dist.is_nccl_available())
    if world <= 1:
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        return 0, 1, device
    if backend == "nccl":
        for name, value in _NCCL_DEFAULTS.items():
            os.environ.setdefault(name, value)
        dist.init_process_group(backend, timeout=timeout, device_id=device)
    else:
        dist.init_process_group(backend, timeout=timeout)
    logger.debug("process group: %s, %d ranks, timeout %s", backend, world, timeout)
    return dist.get_rank(), dist.get_world_size(), device


def _device() -> torch.device:
    if not torch.cuda.is_available():
        return torch.device("cpu")
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    return torch.device("cuda", local_rank)
