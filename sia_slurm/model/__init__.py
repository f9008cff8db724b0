"""The goodput model: throughput, statistical efficiency, fitting, batch sizes, Sia's bootstrap.

Reference sections 2 and 3. A policy needs only :class:`JobGoodputEstimator` (it implements
:class:`sia_slurm.core.GoodputEstimator`); the simulator and controller also feed it
:class:`Observation` and :class:`GradientStats`. Profiles come from :func:`load_profiles`.
"""

from sia_slurm.model.batch import BatchLimits, optimize_batch_size
from sia_slurm.model.efficiency import GradientStats, efficiency, gain
from sia_slurm.model.estimator import JobGoodputEstimator, TypeModel, evaluate_jobs
from sia_slurm.model.fit import Observation, fit_observations, fit_throughput_params
from sia_slurm.model.profile import AppProfile, GpuType, ProfileError, ProfileSet, load_profiles
from sia_slurm.model.throughput import StackedParams, ThroughputParams

__all__ = [
    "AppProfile",
    "BatchLimits",
    "GpuType",
    "GradientStats",
    "JobGoodputEstimator",
    "Observation",
    "ProfileError",
    "ProfileSet",
    "StackedParams",
    "ThroughputParams",
    "TypeModel",
    "efficiency",
    "evaluate_jobs",
    "fit_observations",
    "fit_throughput_params",
    "gain",
    "load_profiles",
    "optimize_batch_size",
]
