"""The controller: one round of observe -> estimate -> allocate -> place -> actions.

:class:`Controller` is shared by the Slurm controller loop and the simulator (one code path);
:class:`EstimatorFactory` builds each new job's goodput model from the site's profiles.
"""

from sia_slurm.controller.decide import Controller, Decision, RoundOutcome
from sia_slurm.controller.jobs import EstimatorFactory, JobRecord, UnknownAppError

__all__ = [
    "Controller",
    "Decision",
    "EstimatorFactory",
    "JobRecord",
    "RoundOutcome",
    "UnknownAppError",
]
