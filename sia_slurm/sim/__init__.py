"""The trace-driven simulator: the production controller round against a simulated cluster.

Inputs (they only describe reality):

* :mod:`.groundtruth` — measured step/sync times per (app, GPU type), interpolated;
* :mod:`.gradstats` — gradient statistics over training progress, and completion targets;
* :mod:`.restart` — per-app restart delays (charged, and assumed by policies);
* :mod:`.workload` — the Sia artifact's workload CSVs;
* :mod:`.clusterfile` — simulated cluster shapes (``etc/clusters/*.yaml``);
* :mod:`.apptruth`, :mod:`.inputs` — all of the above loaded and cross-checked per simulation.

The simulation (docs/simulator.md):

* :mod:`.progress` — true statistical efficiency integrated over time, for all jobs at once;
* :mod:`.cluster` — :class:`SimulatedCluster`, the simulated ``ClusterBackend``;
* :mod:`.run` — the driver (:func:`simulate`): snapshot -> controller round -> apply -> advance;
* :mod:`.artifact_metrics` — JCT, makespan, GPU-hours, restarts, contention, as the artifact
  computes them;
* :mod:`.workload_pool` — many workloads in worker processes; :mod:`.plots` — figures (matplotlib).

The re-exported names below are imported on first use (:mod:`sia_slurm.lazy`): the emulated
trainer reads the traces on every start and must not import the whole simulator to do so.
"""

from typing import TYPE_CHECKING

from sia_slurm.lazy import lazy_exports

if TYPE_CHECKING:
    from sia_slurm.sim.apps import (
        APPS,
        DATA_PARALLEL_APPS,
        default_traces_dir,
        default_workloads_dir,
    )
    from sia_slurm.sim.apptruth import AppTruth, SimInputError, load_truths
    from sia_slurm.sim.artifact_metrics import (
        JobOutcome,
        PooledMetrics,
        WorkloadMetrics,
        pooled_metrics,
        workload_metrics,
    )
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
    from sia_slurm.sim.inputs import SimulationInputs, job_specs, load_inputs, load_sim_workloads
    from sia_slurm.sim.restart import RestartDelay, restart_delay
    from sia_slurm.sim.run import SimulationConfig, SimulationResult, simulate
    from sia_slurm.sim.simulated_cluster import SimJobSpec, SimulatedCluster
    from sia_slurm.sim.workload import (
        Workload,
        WorkloadError,
        WorkloadJob,
        load_workload,
        load_workloads,
    )
    from sia_slurm.sim.workload_pool import WorkloadTask, pool_results, run_tasks

_MODULE_OF = {
    "APPS": "apps",
    "DATA_PARALLEL_APPS": "apps",
    "default_traces_dir": "apps",
    "default_workloads_dir": "apps",
    "AppTruth": "apptruth",
    "SimInputError": "apptruth",
    "load_truths": "apptruth",
    "SimJobSpec": "simulated_cluster",
    "SimulatedCluster": "simulated_cluster",
    "ClusterError": "clusterfile",
    "ClusterGpuType": "clusterfile",
    "ClusterSpec": "clusterfile",
    "MissingGroundTruth": "clusterfile",
    "check_ground_truth": "clusterfile",
    "load_cluster": "clusterfile",
    "MAX_EPOCHS": "gradstats",
    "AppGradStats": "gradstats",
    "GradStatsError": "gradstats",
    "GroundTruth": "groundtruth",
    "GroundTruthError": "groundtruth",
    "default_calibration": "groundtruth",
    "SimulationInputs": "inputs",
    "job_specs": "inputs",
    "load_inputs": "inputs",
    "load_sim_workloads": "inputs",
    "JobOutcome": "artifact_metrics",
    "PooledMetrics": "artifact_metrics",
    "WorkloadMetrics": "artifact_metrics",
    "pooled_metrics": "artifact_metrics",
    "workload_metrics": "artifact_metrics",
    "WorkloadTask": "workload_pool",
    "pool_results": "workload_pool",
    "run_tasks": "workload_pool",
    "RestartDelay": "restart",
    "restart_delay": "restart",
    "SimulationConfig": "run",
    "SimulationResult": "run",
    "simulate": "run",
    "Workload": "workload",
    "WorkloadError": "workload",
    "WorkloadJob": "workload",
    "load_workload": "workload",
    "load_workloads": "workload",
}

__all__ = [
    "APPS",
    "DATA_PARALLEL_APPS",
    "MAX_EPOCHS",
    "AppGradStats",
    "AppTruth",
    "ClusterError",
    "ClusterGpuType",
    "ClusterSpec",
    "GradStatsError",
    "GroundTruth",
    "GroundTruthError",
    "JobOutcome",
    "MissingGroundTruth",
    "PooledMetrics",
    "RestartDelay",
    "SimInputError",
    "SimJobSpec",
    "SimulatedCluster",
    "SimulationConfig",
    "SimulationInputs",
    "SimulationResult",
    "Workload",
    "WorkloadError",
    "WorkloadJob",
    "WorkloadMetrics",
    "WorkloadTask",
    "check_ground_truth",
    "default_calibration",
    "default_traces_dir",
    "default_workloads_dir",
    "job_specs",
    "load_cluster",
    "load_inputs",
    "load_sim_workloads",
    "load_truths",
    "load_workload",
    "load_workloads",
    "pool_results",
    "pooled_metrics",
    "restart_delay",
    "run_tasks",
    "simulate",
    "workload_metrics",
]

__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals())
