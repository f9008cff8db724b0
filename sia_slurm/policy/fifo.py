"""FIFO: what a Slurm site does without sia-slurm (reference section 5).

Jobs start in arrival order at their requested size on the first GPU type (in the cluster's
order) with room on its nodes (:class:`~sia_slurm.policy.ledger.NodeLedger`), and are never
preempted or resized. Without backfill a job that does not fit blocks the ones behind it, as
Slurm's main scheduler does; with ``backfill`` later jobs may start in the gaps.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sia_slurm.core import Configuration
from sia_slurm.policy.base import (
    Allocation,
    JobAllocation,
    JobView,
    PolicyInput,
    SolveInfo,
    allocation_from_row,
)
from sia_slurm.policy.configs import shape_for
from sia_slurm.policy.ledger import NodeLedger
from sia_slurm.policy.parameters import FifoPolicyConfig


def batch_for(job: JobView, config: Configuration) -> JobAllocation:
    """The job's fixed batch on ``config`` (one estimator call)."""
    return allocation_from_row(config, job.estimator.evaluate([config], fixed_batch=True), 0)


@dataclass(frozen=True)
class FifoPolicy:
    config: FifoPolicyConfig = field(default_factory=FifoPolicyConfig)

    def solve(self, policy_input: PolicyInput) -> Allocation:
        started = time.perf_counter()
        cluster = policy_input.cluster
        ledger = NodeLedger(cluster)
        chosen: dict[str, Configuration] = {}
        waiting = []
        for job in policy_input.jobs:
            current = job.current
            if current is not None and job.gpu_types is not None:
                current = current if current.gpu_type in job.gpu_types else None
            if current is not None and ledger.take(current, job.placement) is not None:
                chosen[job.job_id] = current
            else:
                waiting.append(job)
        for job in sorted(waiting, key=lambda j: (j.submit_time, j.job_id)):
            types = [job.requested_gpu_type] if job.requested_gpu_type else cluster.gpu_types
            if job.gpu_types is not None:
                types = [t for t in types if t in job.gpu_types]
            for gpu_type in types:
                view = cluster.types.get(gpu_type)
                shape = None if view is None else shape_for(view, job.requested_gpus)
                if shape is not None and ledger.take(shape) is not None:
                    chosen[job.job_id] = shape
                    break
            else:
                if not self.config.backfill:
                    break
        views = {job.job_id: job for job in policy_input.jobs}
        jobs = {job_id: batch_for(views[job_id], config) for job_id, config in chosen.items()}
        return Allocation(
            jobs=jobs,
            time=policy_input.now,
            round_index=policy_input.round_index,
            info=SolveInfo("heuristic", time.perf_counter() - started),
        )
