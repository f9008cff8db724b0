"""The controller service: rounds against a cluster backend, journaled, logged and measured.

:func:`run_round` is one round (reconcile, snapshot, decide, journal, apply, mark, outputs);
:func:`run_service` takes the lock and runs one round (``--once``) or the aligned loop;
:func:`service_backend` turns the config's ``slurm.backend`` into a backend (built by
:func:`sia_slurm.slurm.backend.build_backend`, failures as :class:`ServiceError`).
"""

from sia_slurm.service.build import (
    BackendFactory,
    ServiceError,
    build_policy,
    estimator_factory,
    open_controller,
    service_backend,
)
from sia_slurm.service.journaled_round import ReconcileReport, RoundReport, reconcile, run_round
from sia_slurm.service.lock import EXIT_LOCKED, ControllerLock, LockHeldError
from sia_slurm.service.logs import JsonFormatter, configure_logging
from sia_slurm.service.loop import (
    ServiceOptions,
    install_stop_handlers,
    next_round_time,
    run_loop,
    run_service,
)

__all__ = [
    "EXIT_LOCKED",
    "BackendFactory",
    "ControllerLock",
    "JsonFormatter",
    "LockHeldError",
    "ReconcileReport",
    "RoundReport",
    "ServiceError",
    "ServiceOptions",
    "build_policy",
    "configure_logging",
    "estimator_factory",
    "install_stop_handlers",
    "next_round_time",
    "open_controller",
    "reconcile",
    "run_loop",
    "run_round",
    "run_service",
    "service_backend",
]
