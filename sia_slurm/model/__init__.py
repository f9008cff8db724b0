"""The goodput model: throughput, statistical efficiency, fitting, batch sizes, Sia's bootstrap.

Reference sections 2 and 3. A policy needs only :class:`JobGoodputEstimator` (it implements
:class:`sia_slurm.core.GoodputEstimator`); the simulator and controller also feed it
measured steps (:class:`sia_slurm.protocol.observation.Observation`) and
:class:`GradientStats`. Its inputs are read elsewhere: the throughput profiles, which the job
side reads too, by :mod:`sia_slurm.protocol.profile`, so nothing here touches a file.

The names below are imported on first use (PEP 562): a process that needs one light module
(the emulated trainer and the simulator's readers take gradient statistics from
:mod:`.efficiency` on every start) must not pay for the fitting stack (scipy.optimize, about a
quarter of a CPU-second) that only the controller and the simulator use. The function
``efficiency`` is not re-exported: lazily, the submodule of the same name would shadow it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from sia_slurm.lazy import lazy_exports

if TYPE_CHECKING:
    from sia_slurm.model.batch import BatchLimits, optimize_batch_size
    from sia_slurm.model.efficiency import GradientStats, gain
    from sia_slurm.model.estimator import JobGoodputEstimator, TypeModel, evaluate_jobs
    from sia_slurm.model.fit import fit_observations, fit_throughput_params
    from sia_slurm.model.throughput import StackedParams, ThroughputParams

_MODULE_OF = {
    "BatchLimits": "batch",
    "optimize_batch_size": "batch",
    "GradientStats": "efficiency",
    "gain": "efficiency",
    "JobGoodputEstimator": "estimator",
    "TypeModel": "estimator",
    "evaluate_jobs": "estimator",
    "fit_observations": "fit",
    "fit_throughput_params": "fit",
    "StackedParams": "throughput",
    "ThroughputParams": "throughput",
}

__all__ = [
    "BatchLimits",
    "GradientStats",
    "JobGoodputEstimator",
    "StackedParams",
    "ThroughputParams",
    "TypeModel",
    "evaluate_jobs",
    "fit_observations",
    "fit_throughput_params",
    "gain",
    "optimize_batch_size",
]

__getattr__, __dir__ = lazy_exports(__name__, _MODULE_OF, globals())
