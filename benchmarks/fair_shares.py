"""Fair shares in the simulator: two accounts with shares 1:1, one submitting 10x the jobs.

Run: ``python benchmarks/fair_shares.py [--seed 1] [--small-jobs 10] [--hours 4]``. Goals
(issue 20), on hetero64 (64 GPUs):

- while both accounts have demand, neither account's GPU-hours fall more than 10% short of
  what its share entitles it to;
- the cluster's average JCT is within 5% of share-blind Sia (the same workload with nobody's
  name on the jobs, so every job weighs 1).

Three runs: ``sia shares`` (shares 1:1 with the usage factor, the default), ``sia static``
(static weights only: ``usage_factor_limit: 1``) and ``sia blind``.

*Entitled* (owed) GPUs, per round: what the controller's usage factor measures too
(:func:`sia_slurm.policy.entitlement.entitlements`, the same policy solved on the round's input
with only that account's jobs): the larger of what they take alone on the account's half of the
cluster (every GPU type's usable GPUs halved, whole nodes first) and what they take alone on
what the other account's *solo* allocation (its jobs alone on the whole cluster) leaves, type
by type. GPUs that both would take beyond that are owed to no one: the policy puts them where
goodput gains most, so an account may hold more than it is owed, and only a shortfall is
unfair. *Both have demand* are the rounds where both accounts have live jobs whose solo
allocations are not empty.

The column ``by count`` is the small account against the earlier yardstick: the capacity split
1:1 by GPU count, water-filled by the whole-cluster solo allocations. It counts as demand the
GPUs a job takes alone for any gain at all (a job on 8 A100s asking for the other 8, across two
nodes, for 7.5% more goodput), which Sia by design does not hand out under contention; the
sharing-incentive yardstick above counts only what the account would use on its own half.

The workload is generated (seeded): jobs of both accounts draw their app from the same mix
(mostly cifar10, some yolov3, deepspeech2 and bert, as the Sia traces) and arrive uniformly over
``--hours``; only their number differs.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

import sia_slurm.controller.decide as controller_round
import sia_slurm.policy.sia as sia_policy
from sia_slurm.policy.base import Allocation, PolicyInput
from sia_slurm.policy.entitlement import Entitlement, entitlements, owed_gpus
from sia_slurm.policy.shares import SharesConfig
from sia_slurm.sim.inputs import load_inputs
from sia_slurm.sim.run import SimulationConfig, SimulationResult, simulate
from sia_slurm.sim.workload import Workload, WorkloadJob

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
ACCOUNTS = ("big", "small")
M0 = {"cifar10": 128, "yolov3": 8, "deepspeech2": 20, "bert": 12}
MIX = ("cifar10", "cifar10", "cifar10", "yolov3", "deepspeech2", "bert")
SPLIT_GOAL = 0.10
JCT_GOAL = 0.05


def workload(seed: int, small_jobs: int, hours: float) -> Workload:
    """``10 * small_jobs`` jobs of account ``big`` and ``small_jobs`` of ``small``; job names
    start with the account (the benchmark's own bookkeeping reads them)."""
    rng = random.Random(seed)
    rows = []
    for account, count, mix in (
        ("big", 10 * small_jobs, MIX),
        ("small", small_jobs, MIX),
    ):
        for i in range(count):
            app = rng.choice(mix)
            rows.append((round(rng.uniform(0, hours * 3600)), account, app, i))
    rows.sort()
    jobs = tuple(
        WorkloadJob(
            f"{account}-{app}-{i}", t, app, 1, M0[app], user=f"{account}-u", account=account
        )
        for t, account, app, i in rows
    )
    return Workload(Path(f"fair-shares-seed{seed}.csv"), jobs)


@dataclass
class RoundShares:
    """Per account, this round: GPUs allocated, and what its jobs take alone."""

    held: dict[str, int]
    entitled: dict[str, Entitlement]


def account_of(job_id: str) -> str:
    return job_id.split("-", 1)[0]


def instrument(log: list[RoundShares]) -> None:
    """Record each round's allocation per account and what each account is entitled to."""
    solve = sia_policy.SiaPolicy.solve
    inside = []  # non-empty while an account's entitlement is solved for

    def recording(self: sia_policy.SiaPolicy, policy_input: PolicyInput) -> Allocation:
        allocation = solve(self, policy_input)
        if inside:
            return allocation
        inside.append(True)
        try:
            owners = {j.job_id: account_of(j.job_id) for j in policy_input.jobs}
            parts = {a: 1 / len(ACCOUNTS) for a in ACCOUNTS if a in owners.values()}
            entitled = entitlements(self, policy_input, owners, parts)
        finally:
            inside.pop()
        log.append(RoundShares(gpus_by_account(allocation.jobs), entitled))
        return allocation

    def owing(*args: object, **kwargs: object) -> dict[str, int]:
        inside.append(True)
        try:
            return owed_gpus(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            inside.pop()

    sia_policy.SiaPolicy.solve = recording  # type: ignore[method-assign]
    controller_round.owed_gpus = owing  # type: ignore[assignment]


def gpus_by_account(jobs: Mapping[str, object]) -> dict[str, int]:
    held = dict.fromkeys(ACCOUNTS, 0)
    for job_id, share in jobs.items():
        held[account_of(job_id)] += share.config.gpus  # type: ignore[attr-defined]
    return held


def entitled_by_count(capacity: int, solo: Mapping[str, int]) -> dict[str, float]:
    """The earlier yardstick: the capacity split 1:1 by GPU count, water-filled by each
    account's whole-cluster ``solo`` (GPUs a job takes alone for any gain count as demand)."""
    small, big = solo.get("small", 0), solo.get("big", 0)
    half = capacity / 2
    if small < half:
        return {"small": small, "big": min(big, capacity - small)}
    if big < half:
        return {"big": big, "small": min(small, capacity - big)}
    return {"small": half, "big": half}


@dataclass(frozen=True)
class Split:
    rounds: int
    held: dict[str, float]  # GPU-rounds per account in the rounds where both have demand
    entitled: dict[str, float]
    by_count: dict[str, float]  # the earlier yardstick (entitled_by_count)

    def error(self, account: str) -> float:
        return self.held[account] / max(self.entitled[account], 1e-9) - 1

    def count_error(self, account: str) -> float:
        return self.held[account] / max(self.by_count[account], 1e-9) - 1


def split(log: list[RoundShares], capacity: int) -> Split:
    held = dict.fromkeys(ACCOUNTS, 0.0)
    owed = dict.fromkeys(ACCOUNTS, 0.0)
    by_count = dict.fromkeys(ACCOUNTS, 0.0)
    rounds = 0
    for entry in log:
        solo = {a: e.solo for a, e in entry.entitled.items()}
        if not all(solo.get(a, 0) > 0 for a in ACCOUNTS):
            continue
        rounds += 1
        count = entitled_by_count(capacity, solo)
        for account in ACCOUNTS:
            held[account] += entry.held[account]
            owed[account] += entry.entitled[account].owed
            by_count[account] += count[account]
    return Split(rounds, held, owed, by_count)


def avg_jct_h(result: SimulationResult) -> float:
    jcts = [job.jct for job in result.jobs if job.jct is not None]
    return sum(jcts) / len(jcts) / 3600


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--small-jobs", type=int, default=10)
    parser.add_argument("--hours", type=float, default=4.0)
    args = parser.parse_args()
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    inputs = load_inputs(CLUSTER)
    capacity = sum(t.gpus_per_node * t.nodes for t in inputs.cluster.gpu_types)
    shared = workload(args.seed, args.small_jobs, args.hours)
    blind = Workload(shared.path, tuple(replace(j, user="", account="") for j in shared.jobs))
    log: list[RoundShares] = []
    instrument(log)
    started = time.perf_counter()
    runs = {}
    for name, workload_, shares in (
        ("sia shares", shared, SharesConfig(accounts={"big": 1, "small": 1})),
        ("sia static", shared, SharesConfig(accounts={"big": 1, "small": 1}, usage_factor_limit=1)),
        ("sia blind", blind, SharesConfig()),
    ):
        log[:] = []
        result = simulate(workload_, inputs, SimulationConfig(shares=shares))
        runs[name] = (result, list(log))
    with_shares, without = runs["sia shares"][0], runs["sia blind"][0]
    wall = time.perf_counter() - started
    print(
        f"fair_shares: {len(shared)} jobs ({10 * args.small_jobs} big, {args.small_jobs} small), "
        f"seed {args.seed}, over {args.hours:g} h on {inputs.cluster.name} ({capacity} GPUs); "
        f"{wall:.0f} s wall"
    )
    print(
        f"{'run':12} {'rounds both':>11} {'big GPU-h':>9} {'owed':>6} {'small GPU-h':>11} "
        f"{'owed':>6} {'small err':>9} {'big err':>8} {'by count':>8} {'avg JCT h':>9}"
    )
    verdicts = {}
    for name, (result, entries) in runs.items():
        measured = split(entries, capacity)
        hours = result.round_length / 3600
        print(
            f"{name:12} {measured.rounds:11d} {measured.held['big'] * hours:9.1f} "
            f"{measured.entitled['big'] * hours:6.1f} {measured.held['small'] * hours:11.1f} "
            f"{measured.entitled['small'] * hours:6.1f} {measured.error('small'):+9.1%} "
            f"{measured.error('big'):+8.1%} {measured.count_error('small'):+8.1%} "
            f"{avg_jct_h(result):9.3f}"
        )
        verdicts[name] = measured
    worst = max(0.0, *(-verdicts["sia shares"].error(a) for a in ACCOUNTS))
    jct = avg_jct_h(with_shares) / avg_jct_h(without) - 1
    print(
        f"goal: GPU-hours at most {SPLIT_GOAL:.0%} short of the entitlement -> worst "
        f"{-worst:+.1%} "
        f"({'OK' if worst <= SPLIT_GOAL else 'MISSED'})"
    )
    print(
        f"goal: avg JCT within {JCT_GOAL:.0%} of share-blind Sia -> {jct:+.1%} "
        f"({'OK' if abs(jct) <= JCT_GOAL else 'MISSED'})"
    )


if __name__ == "__main__":
    main()
