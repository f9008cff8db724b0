"""GPU limits the site sets in Slurm (association and QOS ``GrpTRES``, ``MaxTRESPerUser``,
``MaxTRESPerJob`` on ``gres/gpu``) as constraints of the policies' programs.

A :class:`GpuLimit` is a set of jobs and the most GPUs they may hold together: an account's
``GrpTRES=gres/gpu=4`` is one limit over the account's live jobs, a QOS's ``MaxTRESPerUser`` one
limit per user over that user's jobs in the QOS, ``MaxTRESPerJob`` one limit per job. Granting
more would only leave jobs pending in Slurm (``AssocGrpGRES``) while the GPUs stay idle, so
the controller never grants it. Sia adds one coupling row per limit to its program
(:func:`coupling_rows`); jobs the limit already binds while they keep their configuration
(pinned, restoring) use up part of it first.

A limit on one GPU type (``GrpTRES=gres/gpu:a100=2``) has ``gpu_type`` set: it counts only
the GPUs of its jobs' configurations on that type, so the jobs may still take other types.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class GpuLimit:
    """At most ``gpus`` GPUs over the jobs ``job_ids``; ``name`` says where it comes from
    (``account biology GrpTRES``), for logs and ``explain``."""

    name: str
    job_ids: frozenset[str]
    gpus: int
    gpu_type: str | None = None  # None: every GPU type counts (``gres/gpu=N``)

    def __post_init__(self) -> None:
        if self.gpus < 0:
            raise ValueError(f"limit {self.name}: gpus must be >= 0, got {self.gpus}")


def coupling_rows(
    limits: Sequence[GpuLimit],
    job_ids: Sequence[str],
    owner: np.ndarray,
    gpus: np.ndarray,
    fixed_gpus: dict[int, int],
    types: np.ndarray | None = None,
    fixed_types: dict[int, str] | None = None,
) -> tuple[np.ndarray, np.ndarray] | None:
    """The program's extra rows for ``limits``: ``(usage, capacity)`` with ``usage[j, r]`` the
    GPUs of column ``j`` (owned by job ``owner[j]``, an index into ``job_ids``) if its job is
    under limit ``r``, and ``capacity[r]`` the limit less the GPUs of fixed jobs under it
    (``fixed_gpus``: job index -> GPUs; never below 0). None when no limit touches a job.

    A typed limit counts only the columns whose GPU type (``types``, per column) is its type,
    and only the fixed jobs on it (``fixed_types``: job index -> GPU type); without ``types``
    a typed limit is an error (it would count every type)."""
    index = {job_id: i for i, job_id in enumerate(job_ids)}
    rows = [
        (limit, np.array(sorted(index[j] for j in limit.job_ids if j in index), dtype=np.intp))
        for limit in limits
    ]
    rows = [(limit, members) for limit, members in rows if members.size]
    if not rows:
        return None
    usage = np.zeros((owner.size, len(rows)))
    capacity = np.zeros(len(rows))
    for r, (limit, members) in enumerate(rows):
        under = np.isin(owner, members)
        counted = members
        if limit.gpu_type is not None:
            if types is None:
                raise ValueError(f"limit {limit.name}: a typed limit needs the columns' types")
            under &= types == limit.gpu_type
            kinds = fixed_types or {}
            counted = [i for i in members if kinds.get(int(i)) == limit.gpu_type]
        usage[under, r] = gpus[under]
        held = sum(fixed_gpus.get(int(i), 0) for i in counted)
        capacity[r] = max(limit.gpus - held, 0)
    return usage, capacity
