"""Policy name -> factory, so the controller and the simulator pick a policy from config.

Every policy takes the same :class:`~sia_slurm.policy.base.PolicyInput`, so callers never
dispatch on the name beyond this table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sia_slurm.policy.base import Policy
from sia_slurm.policy.fifo import FifoPolicy
from sia_slurm.policy.gavel import GavelPolicy
from sia_slurm.policy.parameters import POLICY_PARAMS, SiaPaperPolicyConfig
from sia_slurm.policy.pollux import PolluxPolicy
from sia_slurm.policy.sia import SiaPolicy


@dataclass(frozen=True)
class PolicyEntry:
    config_type: type
    factory: Callable[..., Policy]


def sia_paper(config: SiaPaperPolicyConfig | None = None) -> SiaPolicy:
    """The paper's Sia: :class:`SiaPolicy` with :class:`SiaPaperPolicyConfig`."""
    return SiaPolicy(SiaPaperPolicyConfig() if config is None else config)


_FACTORIES: dict[str, Callable[..., Policy]] = {
    "sia": SiaPolicy,
    "sia-paper": sia_paper,
    "pollux": PolluxPolicy,
    "gavel": GavelPolicy,
    "fifo": FifoPolicy,
}

POLICIES: dict[str, PolicyEntry] = {
    name: PolicyEntry(POLICY_PARAMS[name], factory) for name, factory in _FACTORIES.items()
}


def config_type(name: str) -> type:
    """The frozen config dataclass a policy takes (for the YAML loader)."""
    return entry(name).config_type


def entry(name: str) -> PolicyEntry:
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; valid policies: {', '.join(sorted(POLICIES))}")
    return POLICIES[name]


def make_policy(name: str, config: object | None = None) -> Policy:
    """A policy by name, with its default config or ``config`` (which must be its config type)."""
    chosen = entry(name)
    if config is None:
        return chosen.factory()
    if not isinstance(config, chosen.config_type):
        raise TypeError(
            f"policy {name!r} takes a {chosen.config_type.__name__}, got {type(config).__name__}"
        )
    return chosen.factory(config)
