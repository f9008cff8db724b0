"""Profiles at the requested size: what Gavel assumes it knows about a job before it runs it.

Gavel runs each job at the size the user asked for and weighs types by the job's throughput at
that size on each of them; its design assumes that throughput is measured (profiled) up front.
The Sia artifact's Gavel reads it straight from the simulator's measured traces. Our Gavel reads
the goodput model like every policy, and the model alone extrapolates a multi-GPU size from
1-GPU profiles (20-60% too fast for bert and cifar10 at 12-16 GPUs on Helios workload-1), which
costs Gavel 28% of average JCT there (docs/simulator.md).

So when :class:`~sia_slurm.sim.run.SimulationConfig` asks for it (by default for ``gavel``),
each job arriving in the simulator reports, with its first snapshot, one measured step per GPU
type at its requested GPU count and batch, packed on whole nodes: the production path then
learns it like any report. The per-GPU batch is the requested batch split over the GPUs, with
gradient accumulation where it exceeds the largest per-GPU batch the traces measured.
"""

from __future__ import annotations

import math

from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.sim.apptruth import AppTruth
from sia_slurm.sim.clusterfile import ClusterSpec


def requested_shape_reports(
    spec: JobSpec, truth: AppTruth, cluster: ClusterSpec, time: float
) -> tuple[MetricsReport, ...]:
    """One measured step per GPU type that can hold the job's requested GPUs."""
    gpus = spec.requested_gpus
    batch = spec.requested_batch_size or spec.init_batch_size or truth.init_batch_size
    job_m0 = spec.init_batch_size or truth.init_batch_size
    grad_sqr, grad_var = truth.stats.at(batch, 0.0)
    reports = []
    for gpu_type in cluster.gpu_types:
        if gpus > gpu_type.gpus:
            continue
        nodes = math.ceil(gpus / gpu_type.gpus_per_node)
        speed = truth.speed[gpu_type.name]
        local = math.ceil(batch / gpus)
        largest = speed.local_bsz_range(nodes, gpus)[1]
        accum = max(math.ceil(local / largest) - 1, 0)
        local = math.ceil(local / (accum + 1))
        step, sync = speed.step_time(nodes, gpus, local)
        reports.append(
            MetricsReport(
                sia_id=spec.sia_id,
                time=time,
                gpu_type=gpu_type.name,
                nodes=nodes,
                gpus=gpus,
                local_bsz=local,
                accum_steps=accum,
                step_time=float(step),
                sync_time=float(sync),
                grad_sqr=float(grad_sqr),
                grad_var=float(grad_var) * truth.init_batch_size / job_m0,
            )
        )
    return tuple(reports)
