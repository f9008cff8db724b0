"""Building the service's parts from the configuration: backend, policy, estimators, controller.

Kept apart from the loop so that the CLI, the tests and the lead's end-to-end test can build
the same parts and swap one (a fake backend, a profiles directory) without patching anything.
The Slurm backend is imported lazily: it lives in :mod:`sia_slurm.slurm.backend`, which not
every build or test needs.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sia_slurm.cluster import ClusterBackend
from sia_slurm.config import SiaConfig
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller.profiling import Profiler
from sia_slurm.policy.base import Policy
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol.profile import ProfileError, load_profiles
from sia_slurm.service.controller_memory import load_memory
from sia_slurm.state import RestoreNote, Store
from sia_slurm.state.profiles import ProfileStore

BackendFactory = Callable[[SiaConfig], ClusterBackend]


class ServiceError(RuntimeError):
    """The service cannot be built from this configuration (the message says what to fix)."""


def service_backend(config: SiaConfig) -> ClusterBackend:
    """The cluster backend the config names (``slurm.backend``: ``cli`` or ``pyslurm``), built by
    :func:`sia_slurm.slurm.backend.build_backend` (the one place that builds it); any failure to
    build it (the module missing, pyslurm absent or built for another Slurm) becomes a
    :class:`ServiceError` naming the key. The service's default :data:`BackendFactory`."""
    where = f"{config.path}: slurm.backend" if config.path else "slurm.backend"
    try:
        from sia_slurm.slurm import backend as slurm_backend
    except ImportError as exc:
        raise ServiceError(
            f"{where}: {config.slurm.backend}: the Slurm backend (sia_slurm.slurm.backend) cannot "
            f"be imported here ({exc})"
        ) from None
    try:
        return slurm_backend.build_backend(config)
    except (ImportError, RuntimeError, OSError, ValueError) as exc:
        raise ServiceError(f"{where}: {config.slurm.backend}: {exc}") from None


def build_policy(config: SiaConfig) -> Policy:
    return make_policy(config.policy.name, config.policy.params)


def estimator_factory(config: SiaConfig, profiles_dir: Path | None = None) -> EstimatorFactory:
    """Goodput models from the profiles directory, with the config's GPU type names mapped to
    the profiles' (``gpu_types.<name>.profile``)."""
    try:
        profiles = load_profiles(profiles_dir)
    except (OSError, ProfileError, ValueError) as exc:
        raise ServiceError(f"profiles: {exc}") from None
    aliases = {gpu.name: gpu.profile for gpu in config.gpu_types if gpu.profile != gpu.name}
    return EstimatorFactory(profiles, aliases)


def open_controller(
    config: SiaConfig, store: Store, profiles_dir: Path | None = None
) -> tuple[Controller, list[RestoreNote]]:
    """The controller with the config's shares and the memory saved in ``store`` (fresh on
    the first run)."""
    factory = estimator_factory(config, profiles_dir)
    profiler = Profiler(ProfileStore(config.state_dir), factory)
    return load_memory(
        store, build_policy(config), config.policy.name, factory, config.shares, profiler
    )
