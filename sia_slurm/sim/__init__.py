"""Inputs of the trace-driven simulator: measured ground truth, workloads and cluster shapes.

* :mod:`.groundtruth` — measured step/sync times per (app, GPU type), interpolated;
* :mod:`.gradstats` — gradient statistics over training progress, and completion targets;
* :mod:`.restart` — per-app restart delays (charged, and assumed by policies);
* :mod:`.workload` — the Sia artifact's workload CSVs;
* :mod:`.clusterfile` — simulated cluster shapes (``etc/clusters/*.yaml``).

None of these modules runs the simulation; they only describe reality to it.
"""

from sia_slurm.sim.apps import APPS, DATA_PARALLEL_APPS, default_traces_dir, default_workloads_dir
from sia_slurm.sim.clusterfile import (
    ClusterError,
    ClusterGpuType,
    ClusterSpec,
    MissingGroundTruth,
    check_ground_truth,
    load_cluster,
)
from sia_slurm.sim.gradstats import MAX_EPOCHS, AppGradStats, GradStatsError
from sia_slurm.sim.groundtruth import GroundTruth, GroundTruthError, default_calibration
from sia_slurm.sim.restart import RestartDelay, restart_delay
from sia_slurm.sim.workload import (
    Workload,
    WorkloadError,
    WorkloadJob,
    load_workload,
    load_workloads,
)

__all__ = [
    "APPS",
    "DATA_PARALLEL_APPS",
    "MAX_EPOCHS",
    "AppGradStats",
    "ClusterError",
    "ClusterGpuType",
    "ClusterSpec",
    "GradStatsError",
    "GroundTruth",
    "GroundTruthError",
    "MissingGroundTruth",
    "RestartDelay",
    "Workload",
    "WorkloadError",
    "WorkloadJob",
    "check_ground_truth",
    "default_calibration",
    "default_traces_dir",
    "default_workloads_dir",
    "load_cluster",
    "load_workload",
    "load_workloads",
    "restart_delay",
]
