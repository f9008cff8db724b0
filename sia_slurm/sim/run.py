"""The simulation driver: the production controller round against the simulated cluster.

One simulated round is exactly one production round::

    snapshot = cluster.snapshot()            # jobs, reports since the last round
    outcome = controller.round(snapshot)     # observe -> estimate -> allocate -> place -> diff
    cluster.apply(outcome.actions)           # stops, moves, rebatches, starts
    cluster.advance(round_length)            # jobs train (and may finish) until the next round

until every job has completed. Rounds in which no job is submitted and unfinished are skipped
(the clock jumps to the first round boundary at or after the next submission), since the
controller would have nothing to decide. Two safety limits end a simulation early, leaving the
remaining jobs unfinished in the result: ``max_time`` simulated seconds, and ``stall_rounds``
consecutive rounds in which no job holds GPUs, none is left to arrive and the controller asks
for nothing (e.g. FIFO with a job larger than every GPU type).

Each round can be written as one JSON line (:func:`round_line`): time, actions, a summary of the
decisions, GPUs held per type, contention and the stage timings.

After each round's actions are applied, the round also counts the jobs that wait beside free GPUs
they could use and the allocations placement could not honour
(:mod:`sia_slurm.sim.waits_after_actions`, issue 38); :meth:`SimulationResult.metrics` sums
them. Once the run ends, every job's outcome gets its time alone on an equal share of the
cluster, for finish-time fairness (:mod:`sia_slurm.sim.finish_time_fairness`).
"""

from __future__ import annotations

import json
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any, TextIO

from sia_slurm.cluster import Action, ActionResult, Move, Rebatch, Start, Stop
from sia_slurm.controller import Controller, EstimatorFactory, RoundOutcome
from sia_slurm.controller.profiling import MemoryProfileBook, Profiler
from sia_slurm.policy.registry import config_type, make_policy
from sia_slurm.policy.shares import EQUAL_USERS, SharesConfig
from sia_slurm.sim.apptruth import AppTruth
from sia_slurm.sim.artifact_metrics import (
    JobOutcome,
    WaitTotals,
    WorkloadMetrics,
    workload_metrics,
)
from sia_slurm.sim.finish_time_fairness import with_independent_times
from sia_slurm.sim.inputs import SimulationInputs, job_specs, load_workload_truths
from sia_slurm.sim.progress import DEFAULT_MAX_SUBSTEP
from sia_slurm.sim.simulated_cluster import SimulatedCluster
from sia_slurm.sim.sweep import DEFAULT_NOISE
from sia_slurm.sim.waits_after_actions import RoundWaits, after_actions
from sia_slurm.sim.workload import Workload

DAY = 86400.0


PROFILED_POLICIES = frozenset({"gavel"})
"""Policies whose jobs, by default, report a profile at their requested size on arrival."""

PROFILING_MODES = ("off", "each", "shared")
"""Values of :attr:`SimulationConfig.profiling`."""


@dataclass(frozen=True)
class SimulationConfig:
    """How to simulate: the policy, the round length, and the safety limits."""

    policy: str = "sia"
    round_length: float = 60.0
    seed: int = 0  # for policies with randomness (Pollux's genetic search)
    params: object | None = None  # the policy's own config object; None: defaults with ``seed``
    max_time: float = 30 * DAY  # simulated seconds
    stall_rounds: int = 1440
    max_substep: float = DEFAULT_MAX_SUBSTEP
    shares: SharesConfig = EQUAL_USERS  # the site's shares between the workload's owners
    # Arriving jobs report a measured step at their requested size on every GPU type
    # (sia_slurm/sim/requested_shape.py); None: on for the policies that run jobs at that size and
    # assume its throughput is known (Gavel, as the Sia artifact gives it), off for the others.
    profile_requested: bool | None = None
    # Sia's profiling of new models (docs/profiling.md; docs/simulator.md, "Profiling"):
    # "off": every job's model starts from its app's shipped profile (an oracle's 1-GPU
    # measurements); "each": every job is profiled on arrival, for itself alone, as the
    # paper's Sia does; "shared": the jobs of one app and account share one measured profile
    # (the first profiles, the others wait for it or reuse it), as sia-slurm does.
    profiling: str = "off"
    profile_noise: float = DEFAULT_NOISE  # sigma of the lognormal noise on measured step times

    @property
    def profiles_requested(self) -> bool:
        """Whether arriving jobs report their requested size (``profile_requested`` resolved)."""
        if self.profile_requested is not None:
            return self.profile_requested
        return self.policy in PROFILED_POLICIES

    def __post_init__(self) -> None:
        params_type = config_type(self.policy)  # raises, listing the valid policies
        if self.params is not None and not isinstance(self.params, params_type):
            raise TypeError(
                f"params: policy {self.policy!r} takes a {params_type.__name__}, "
                f"got {type(self.params).__name__}"
            )
        if not (math.isfinite(self.round_length) and self.round_length > 0):
            raise ValueError(f"round_length: expected seconds > 0, got {self.round_length!r}")
        if not self.max_time > 0 or self.stall_rounds < 1 or not self.max_substep > 0:
            raise ValueError("max_time, stall_rounds and max_substep must be positive")
        if self.profiling not in PROFILING_MODES:
            raise ValueError(
                f"profiling: expected one of {', '.join(PROFILING_MODES)}, got {self.profiling!r}"
            )
        if not (math.isfinite(self.profile_noise) and self.profile_noise >= 0):
            raise ValueError(f"profile_noise: expected a sigma >= 0, got {self.profile_noise!r}")


@dataclass(frozen=True)
class RoundRecord:
    """What one round did, compactly (for metrics and plots)."""

    index: int
    time: float
    contention: int  # active (submitted, unfinished) jobs
    gpus: Mapping[str, int]  # GPUs held per type after the round's actions
    policy_ms: float
    actions: int
    # Jobs that held no GPUs beside free GPUs they could use, per cause
    # (sim/waits_after_actions.py), and allocations placement left unplaced, once the round's
    # actions were applied.
    waits_beside_free_gpus: Mapping[str, int] = field(default_factory=dict)
    unplaced_allocations: int = 0

    @property
    def jobs_waiting_beside_free_gpus(self) -> int:
        return sum(self.waits_beside_free_gpus.values())


@dataclass(frozen=True)
class SimulationResult:
    """One workload simulated under one policy."""

    workload: str
    policy: str
    cluster: str
    round_length: float
    jobs: tuple[JobOutcome, ...]
    rounds: tuple[RoundRecord, ...]
    wall_s: float
    timings: Mapping[str, float]  # seconds per stage, summed over rounds
    stopped: str = ""  # why it ended before every job completed ("" if all did)

    @property
    def solve_ms(self) -> list[float]:
        """Policy-stage milliseconds of every round with at least one active job."""
        return [r.policy_ms for r in self.rounds if r.contention > 0]

    def wait_totals(self) -> WaitTotals:
        """Idle waits and unplaced allocations summed over the rounds."""
        causes: Counter[str] = Counter()
        for r in self.rounds:
            causes.update(r.waits_beside_free_gpus)
        return WaitTotals(
            job_rounds=sum(r.jobs_waiting_beside_free_gpus for r in self.rounds),
            rounds=sum(1 for r in self.rounds if r.jobs_waiting_beside_free_gpus),
            by_cause=dict(sorted(causes.items())),
            unplaced_allocations=sum(r.unplaced_allocations for r in self.rounds),
        )

    def metrics(self) -> WorkloadMetrics:
        return workload_metrics(
            self.jobs,
            contention=[r.contention for r in self.rounds],
            solve_ms=self.solve_ms,
            wall_s=self.wall_s,
            waits=self.wait_totals(),
        )


@dataclass
class _Loop:
    """Mutable state of one simulation loop."""

    rounds: list[RoundRecord] = field(default_factory=list)
    timings: Counter[str] = field(default_factory=Counter)
    quiet_rounds: int = 0


def policy_params(name: str, seed: int) -> object | None:
    """The policy's default parameters, with ``seed`` where the policy takes one; Gavel spreads
    jobs over any free GPUs of a type, as the Sia artifact simulates it (the simulated cluster
    runs uneven splits; one Slurm job cannot, so its own default is ``even``)."""
    params_type = config_type(name)
    if name == "gavel":
        return params_type(workers="any")
    if any(f.name == "seed" for f in fields(params_type)):
        return params_type(seed=seed)
    return None


def build_controller(inputs: SimulationInputs, config: SimulationConfig) -> Controller:
    """The production controller with the named policy and the site's profiles.

    With profiling on, the controller knows the profiles' GPU types but none of their apps, so
    every job is profiled (or reuses a profile measured here), and measured profiles are kept
    in memory for the simulation's length."""
    params = config.params or policy_params(config.policy, config.seed)
    policy = make_policy(config.policy, params)
    if config.profiling == "off":
        factory = EstimatorFactory(inputs.profiles, inputs.type_aliases)
        return Controller(policy, factory, config.shares)
    unknown = EstimatorFactory(replace(inputs.profiles, apps={}), inputs.type_aliases)
    profiler = Profiler(MemoryProfileBook(), unknown)
    return Controller(policy, unknown, config.shares, profiler=profiler)


def simulate(
    workload: Workload,
    inputs: SimulationInputs,
    config: SimulationConfig,
    *,
    truths: Mapping[str, AppTruth] | None = None,
    log: TextIO | None = None,
    on_round: Callable[[SimulatedCluster], None] | None = None,
) -> SimulationResult:
    """Simulate ``workload`` on ``inputs.cluster`` under ``config.policy`` until all jobs finish.

    ``truths`` (default: loaded for the workload's apps) lets callers share loaded traces;
    ``log`` receives one JSON line per round; ``on_round`` is called after each round.
    """
    started = time.perf_counter()
    truths = truths if truths is not None else load_workload_truths([workload], inputs)
    specs = job_specs(workload, truths, profiling=config.profiling)
    cluster = SimulatedCluster(
        inputs.cluster,
        specs,
        max_substep=config.max_substep,
        profile_requested=config.profiles_requested,
        profile_noise=config.profile_noise,
        seed=config.seed,
    )
    controller = build_controller(inputs, config)
    loop = _Loop()
    stopped = ""
    while not cluster.all_done:
        if cluster.idle():
            _skip_idle(cluster, config.round_length)
        if cluster.time > config.max_time:
            stopped = f"simulated time limit reached ({config.max_time:g} s)"
            break
        _one_round(cluster, controller, config, loop, log)
        if on_round is not None:
            on_round(cluster)
        if loop.quiet_rounds >= config.stall_rounds:
            stopped = (
                f"stalled: for {config.stall_rounds} rounds no job held GPUs and the policy "
                "started none (do some jobs ask for more GPUs than any GPU type has?)"
            )
            break
    return SimulationResult(
        workload=workload.name,
        policy=config.policy,
        cluster=inputs.cluster.name,
        round_length=config.round_length,
        jobs=tuple(with_independent_times(cluster.outcomes(), specs, inputs.cluster)),
        rounds=tuple(loop.rounds),
        wall_s=time.perf_counter() - started,
        timings=dict(loop.timings),
        stopped=stopped,
    )


def _skip_idle(cluster: SimulatedCluster, round_length: float) -> None:
    """Jump the clock to the first round boundary at or after the next submission."""
    upcoming = cluster.next_submit_time
    if upcoming is None or upcoming <= cluster.time:
        return
    rounds = math.ceil((upcoming - cluster.time) / round_length - 1e-9)
    cluster.advance(rounds * round_length)


def _one_round(
    cluster: SimulatedCluster,
    controller: Controller,
    config: SimulationConfig,
    loop: _Loop,
    log: TextIO | None,
) -> None:
    t0 = time.perf_counter()
    snapshot = cluster.snapshot()
    t1 = time.perf_counter()
    outcome = controller.round(snapshot)
    t2 = time.perf_counter()
    results = cluster.apply(outcome.actions)
    t3 = time.perf_counter()
    waits = after_actions(snapshot, outcome, cluster)
    t_waits = time.perf_counter()
    held = cluster.gpus_held()
    contention = sum(1 for job in snapshot.jobs if not job.phase.finished)
    finished = cluster.advance(config.round_length)
    t4 = time.perf_counter()
    record = RoundRecord(
        index=outcome.round_index,
        time=snapshot.time,
        contention=contention,
        gpus=held,
        policy_ms=outcome.timings["policy_s"] * 1000,
        actions=len(outcome.actions),
        waits_beside_free_gpus=waits.by_cause(),
        unplaced_allocations=len(waits.unplaced),
    )
    loop.rounds.append(record)
    idle = not any(held.values()) and cluster.next_submit_time is None
    loop.quiet_rounds = loop.quiet_rounds + 1 if idle and not outcome.actions else 0
    if log is not None:
        log.write(json.dumps(round_line(record, outcome, results, finished, waits)) + "\n")
    t5 = time.perf_counter()
    timings = loop.timings
    timings["snapshot_s"] += t1 - t0
    timings["controller_s"] += t2 - t1
    for stage, seconds in outcome.timings.items():
        timings[f"controller.{stage}"] += seconds
    timings["apply_s"] += t3 - t2
    timings["waits_s"] += t_waits - t3
    timings["advance_s"] += t4 - t_waits
    timings["log_s"] += t5 - t4


def round_line(
    record: RoundRecord,
    outcome: RoundOutcome,
    results: Sequence[ActionResult],
    finished: Sequence[str],
    waits: RoundWaits | None = None,
) -> dict[str, Any]:
    """The JSON object of one round's log line (with ``waits``: each job waiting beside free
    GPUs it could use, and why, and the allocations placement left unplaced)."""
    decisions = Counter(decision.action for decision in outcome.decisions)
    line: dict[str, Any] = {
        "round": record.index,
        "time": record.time,
        "contention": record.contention,
        "gpus": dict(record.gpus),
        "actions": [_action_json(result.action) for result in results],
        "failed": [
            f"{type(r.action).__name__.lower()} {r.action.sia_id}: {r.message}"
            for r in results
            if not r.ok
        ],
        "decisions": dict(sorted(decisions.items())),
        # Predicted goodput per job given GPUs (for the dashboard's job table; additive).
        "goodput": {d.sia_id: round(d.goodput, 3) for d in outcome.decisions if d.goodput > 0},
        "finished": list(finished),
        "policy_status": outcome.allocation.info.status,
        "timings_ms": {k.removesuffix("_s"): round(v * 1e3, 3) for k, v in outcome.timings.items()},
        "rejected": list(outcome.rejected),
    }
    if waits is not None:
        line["waits_beside_free_gpus"] = {job: cause.value for job, cause in waits.waits.items()}
        line["unplaced"] = list(waits.unplaced)
    return line


def _action_json(action: Action) -> dict[str, Any]:
    if isinstance(action, Stop):
        return {"action": "stop", "job": action.sia_id}
    payload: dict[str, Any] = {
        "action": type(action).__name__.lower(),
        "job": action.sia_id,
        "batch": action.batch.batch_size,
        "local_bsz": action.batch.local_bsz,
        "accum_steps": action.batch.accum_steps,
    }
    if isinstance(action, Start | Move):
        payload["config"] = str(action.config)
        payload["nodes"] = {share.node: share.gpus for share in action.placement}
        if action.profile_sweep:
            payload["profile_sweep"] = list(action.profile_sweep)
    assert isinstance(action, Start | Move | Rebatch)
    return payload
