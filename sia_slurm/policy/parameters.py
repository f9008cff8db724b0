"""Each policy's parameters: the frozen dataclasses that ``policy:`` in the config file fills.

They live apart from the policies because the job side (``sia-launch``) and the config loader
read them on every job start: importing the policies themselves would pull in scipy and the MILP
stack, about half a CPU-second per start, which a many-GPU dev cluster on a few cores pays on
every restart. Nothing here imports more than the standard library.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

WORKER_RULES = ("even", "any")
"""How Gavel spreads a job over a type's nodes (:mod:`sia_slurm.policy.workers`)."""

OBJECTIVES = ("max_sum_throughput", "max_min_fairness", "max_total_throughput")
"""Gavel's objectives (:mod:`sia_slurm.policy.gavel_lp`): the Sia artifact's raw throughput sum
(our default), Gavel's paper default, and the normalised sum."""


@dataclass(frozen=True)
class SiaPolicyConfig:
    """Sia's knobs (reference section 4), validated on construction.

    ``p`` is the fairness power (< 0: minimise ``G^p``, favouring the worst-off jobs);
    ``lambda_n`` the no-allocation penalty, ``lambda_a`` the allocation-change penalty (0 in
    the simulator, 0.01 on the physical cluster); ``growth_factor`` caps a job at that multiple of
    the most GPUs it has run on (``None`` disables the cap); ``default_restart_cost`` is S for
    jobs without a measured restart cost; ``max_normalised_goodput`` clips normalised goodput
    (the artifact's 3000) so ``G^p`` stays well scaled. ``accept_gap``: a solution within this
    relative distance of the LP bound is taken without proving it optimal (0: always prove;
    :mod:`sia_slurm.policy.sia_solve`); ``mip_rel_gap`` is HiGHS's own gap where it searches.
    """

    # The paper's -0.5 (sia-paper); -0.25 gives lower average and p99 JCT and fairer finish
    # times over the artifact's 18 workloads (issue 38, docs/concepts/policies.md).
    p: float = -0.25
    lambda_n: float = 1.1
    lambda_a: float = 0.0
    # The paper's 2x (sia-paper); 4x reaches a job's size in fewer restarts (issue 38's
    # ablation, docs/concepts/policies.md).
    growth_factor: float | None = 4.0
    # first_gpus: the growth cap before a job's first run (the paper's 1).
    first_gpus: int = 1
    default_restart_cost: float = 30.0
    max_normalised_goodput: float | None = 3000.0
    time_limit_s: float = 5.0
    mip_rel_gap: float = 1e-4
    accept_gap: float = 1e-3
    # Beyond the paper (issue 38, docs/concepts/policies.md); `sia-paper` turns both off.
    # charge_waiting: the restart factor discounts a job that holds no GPUs too (the paper's
    # rule: a job Slurm requeued, or one stopped, counts its restarts against every start).
    charge_waiting: bool = False
    # charge_requeues: the restart factor counts the restarts the cluster made on its own too
    # (JobView.requeues: Slurm requeued the job after a node failure or a preemption).
    charge_requeues: bool = False
    # repair_placement: an allocation placement cannot honour falls back, in the same round, to
    # the job's best other configuration that fits (its current one first where it runs).
    repair_placement: bool = True

    def __post_init__(self) -> None:
        for error in validate_sia_config(self):
            raise ValueError(error)


@dataclass(frozen=True)
class SiaPaperPolicyConfig(SiaPolicyConfig):
    """The paper's Sia, exactly (``policy.name: sia-paper``): the fidelity checks against the
    artifact run it. The same knobs as :class:`SiaPolicyConfig`, with the additions off."""

    p: float = -0.5
    growth_factor: float | None = 2.0
    charge_waiting: bool = True
    charge_requeues: bool = True
    repair_placement: bool = False


def validate_sia_config(config: SiaPolicyConfig) -> list[str]:
    """Every rule ``config`` breaks, as messages naming the fields and values."""
    errors = []
    if not math.isfinite(config.p) or config.p == 0:
        errors.append(f"SiaPolicyConfig.p: expected a finite non-zero number, got {config.p}")
    elif math.copysign(1, config.lambda_n) == math.copysign(1, config.p) or not (
        abs(config.lambda_n) > 1
    ):
        errors.append(
            f"SiaPolicyConfig: lambda_n={config.lambda_n} with p={config.p} breaks the sign "
            "rules sign(lambda_n) != sign(p) and |lambda_n| > 1; use e.g. "
            f"lambda_n={-math.copysign(1.1, config.p)}"
        )
    if not config.lambda_a >= 0:
        errors.append(f"SiaPolicyConfig.lambda_a: expected >= 0, got {config.lambda_a}")
    first = config.first_gpus
    if isinstance(first, bool) or not isinstance(first, int) or not first >= 1:
        errors.append(f"SiaPolicyConfig.first_gpus: expected an integer >= 1, got {first!r}")
    if config.growth_factor is not None and not config.growth_factor >= 1:
        errors.append(
            f"SiaPolicyConfig.growth_factor: expected >= 1 or None, got {config.growth_factor}"
        )
    if not config.default_restart_cost >= 0:
        errors.append(
            "SiaPolicyConfig.default_restart_cost: expected >= 0 seconds, "
            f"got {config.default_restart_cost}"
        )
    if config.max_normalised_goodput is not None and not config.max_normalised_goodput > 1:
        errors.append(
            "SiaPolicyConfig.max_normalised_goodput: expected > 1 or None, "
            f"got {config.max_normalised_goodput}"
        )
    if not config.time_limit_s > 0 or not config.mip_rel_gap >= 0:
        errors.append(
            "SiaPolicyConfig: expected time_limit_s > 0 and mip_rel_gap >= 0, got "
            f"time_limit_s={config.time_limit_s} mip_rel_gap={config.mip_rel_gap}"
        )
    if not 0 <= config.accept_gap < 1:
        errors.append(f"SiaPolicyConfig.accept_gap: expected 0 <= gap < 1, got {config.accept_gap}")
    return errors


@dataclass(frozen=True)
class PolluxPolicyConfig:
    p: float = -1.0
    restart_cost: float = 30.0
    population: int = 100
    generations: int = 100
    max_nodes_per_job: int = 16
    growth_factor: float | None = 2.0
    mutation_rate: float = 0.1
    seed: int = 0
    reference_type: str | None = None

    def __post_init__(self) -> None:
        if self.p == 0 or self.population < 2 or self.generations < 0:
            raise ValueError(
                "PolluxPolicyConfig: expected p != 0, population >= 2, generations >= 0, got "
                f"p={self.p} population={self.population} generations={self.generations}"
            )


@dataclass(frozen=True)
class GavelPolicyConfig:
    """``objective``: one of :data:`OBJECTIVES`; ``max_sum_throughput`` is how the Sia artifact
    runs Gavel for Sia's evaluation, ``max_min_fairness`` Gavel's own paper default.
    ``round_duration``: seconds between Gavel's decisions (the artifact's 360).
    ``workers``: ``even`` (the same GPUs on every node a job spans, which is what one Slurm job
    can ask for) or ``any`` (free GPUs anywhere on the type, as the artifact's simulator runs
    Gavel; the simulator's default).
    ``water_filling``: ``max_min_fairness`` water-fills as Gavel's hierarchical policy does
    (re-solving to raise the jobs the first LP does not bottleneck; :mod:`.gavel_fill`);
    ``false`` keeps only its first LP, the weighted max-min, for comparison."""

    objective: str = "max_sum_throughput"
    round_duration: float = 360.0
    workers: str = "even"
    water_filling: bool = True

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ValueError(
                f"GavelPolicyConfig.objective: expected one of {OBJECTIVES}, got {self.objective!r}"
            )
        if self.workers not in WORKER_RULES:
            raise ValueError(
                f"GavelPolicyConfig.workers: expected one of {WORKER_RULES}, got {self.workers!r}"
            )
        if not self.round_duration > 0:
            raise ValueError(
                f"GavelPolicyConfig.round_duration: expected > 0 seconds, got {self.round_duration}"
            )


@dataclass(frozen=True)
class FifoPolicyConfig:
    """``backfill``: let later jobs start when an earlier one does not fit."""

    backfill: bool = False


POLICY_PARAMS: dict[str, type] = {
    "sia": SiaPolicyConfig,
    "sia-paper": SiaPaperPolicyConfig,
    "pollux": PolluxPolicyConfig,
    "gavel": GavelPolicyConfig,
    "fifo": FifoPolicyConfig,
}
"""Policy name -> its parameters' dataclass; :mod:`.registry` pairs each with its factory."""
