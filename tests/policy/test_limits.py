"""Slurm's GPU limits as coupling rows of Sia's program (issue 20): a limited set of jobs never
gets more GPUs than its limit, forced jobs use part of it, and the solve stays optimal (checked
against brute force on small instances)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from sia_slurm.core import JobKind
from sia_slurm.policy.base import JobView, PolicyInput
from sia_slurm.policy.limits import GpuLimit, coupling_rows
from sia_slurm.policy.sia import (
    SiaPolicy,
    assemble,
    build_columns,
    limit_rows,
    release_forced,
)
from tests.estimators import SyntheticEstimator, make_cluster


def job(name: str, seen: int = 8, **kwargs: object) -> JobView:
    return JobView(
        name,
        kind=JobKind.ADAPTIVE,
        estimator=SyntheticEstimator({"a100": 100.0, "t4": 30.0}, serial=0.02),
        age=10.0,
        max_gpus_seen=seen,
        **kwargs,  # type: ignore[arg-type]
    )


def held(allocation: object, jobs: set[str]) -> int:
    return sum(s.config.gpus for k, s in allocation.jobs.items() if k in jobs)  # type: ignore[attr-defined]


def test_a_limited_account_gets_no_more_than_its_limit() -> None:
    cluster = make_cluster([("a100", 2, 8)])
    jobs = tuple(job(n) for n in ("b1", "b2", "b3", "p1"))
    policy = SiaPolicy()
    free = policy.solve(PolicyInput(cluster, jobs))
    biology = {"b1", "b2", "b3"}
    assert held(free, biology) > 4  # without the limit they would take more
    limit = GpuLimit("account biology GrpTRES", frozenset(biology), 4)
    capped = policy.solve(PolicyInput(cluster, jobs, limits=(limit,)))
    assert held(capped, biology) <= 4
    assert held(capped, biology) == 4  # and it still uses what it may
    assert held(capped, {"p1"}) >= 8  # the rest goes to the others


def test_a_zero_limit_starts_nothing_and_per_job_limits_cap_each_job() -> None:
    cluster = make_cluster([("a100", 1, 8)])
    jobs = (job("a"), job("b"))
    policy = SiaPolicy()
    none = policy.solve(PolicyInput(cluster, jobs, limits=(GpuLimit("x", frozenset({"a"}), 0),)))
    assert "a" not in none.jobs
    per_job = tuple(GpuLimit(f"job {j.job_id}", frozenset({j.job_id}), 2) for j in jobs)
    each = policy.solve(PolicyInput(cluster, jobs, limits=per_job))
    assert all(s.config.gpus <= 2 for s in each.jobs.values()) and each.jobs


def test_forced_jobs_use_up_their_limit_first() -> None:
    usage_capacity = coupling_rows(
        [GpuLimit("acct", frozenset({"a", "b"}), 6)],
        ["a", "b", "c"],
        owner=np.array([1, 1, 2]),
        gpus=np.array([2.0, 4.0, 8.0]),
        fixed_gpus={0: 4},
    )
    assert usage_capacity is not None
    usage, capacity = usage_capacity
    assert usage[:, 0].tolist() == [2.0, 4.0, 0.0]
    assert capacity.tolist() == [2.0]  # 6 less the 4 that job a keeps
    assert (
        coupling_rows([GpuLimit("n", frozenset({"z"}), 1)], ["a"], np.zeros(0), np.zeros(0), {})
        is None
    )


def test_a_typed_limit_caps_its_type_only() -> None:
    cluster = make_cluster([("a100", 1, 8), ("t4", 1, 8)])
    jobs = tuple(job(n) for n in ("b1", "b2", "b3"))
    a100 = GpuLimit("account biology GrpTRES a100", frozenset({"b1", "b2", "b3"}), 2, "a100")
    allocation = SiaPolicy().solve(PolicyInput(cluster, jobs, limits=(a100,)))
    on = {t: sum(s.config.gpus for s in allocation.jobs.values() if s.config.gpu_type == t)
          for t in ("a100", "t4")}  # fmt: skip
    assert on["a100"] == 2  # capped, yet uses what it may
    assert on["t4"] >= 1  # the other type stays open to the same jobs


def test_typed_rows_count_their_type_and_forced_jobs_on_it() -> None:
    usage, capacity = coupling_rows(  # type: ignore[misc]
        [GpuLimit("acct a100", frozenset({"a", "b"}), 6, "a100")],
        ["a", "b"],
        owner=np.array([0, 0, 1, 1]),
        gpus=np.array([2.0, 4.0, 2.0, 4.0]),
        fixed_gpus={0: 4, 1: 2},
        types=np.array(["a100", "t4", "t4", "a100"], dtype=object),
        fixed_types={0: "a100", 1: "t4"},
    )
    assert usage[:, 0].tolist() == [2.0, 0.0, 0.0, 4.0]
    assert capacity.tolist() == [2.0]  # 6 less job a's 4 A100s; b's T4s do not count
    with pytest.raises(ValueError, match="typed limit"):
        coupling_rows([GpuLimit("x", frozenset({"a"}), 1, "a100")], ["a"], np.zeros(1),
                      np.ones(1), {})  # fmt: skip


@pytest.mark.parametrize(("seed", "gpu_type"), [(s, t) for s in range(6) for t in (None, "a100")])
def test_limited_solve_is_optimal_by_brute_force(seed: int, gpu_type: str | None) -> None:
    rng = np.random.default_rng(seed)
    cluster = make_cluster([("a100", 1, 4), ("t4", 1, 4)])
    jobs = tuple(job(f"j{i}", seen=int(rng.choice([1, 2, 4]))) for i in range(4))
    limit = GpuLimit("acct", frozenset({"j0", "j1", "j2"}), int(rng.integers(1, 5)), gpu_type)
    policy_input = PolicyInput(cluster, jobs, limits=(limit,))
    allocation = SiaPolicy().solve(policy_input)
    columns = release_forced(build_columns(policy_input, SiaPolicy().config), cluster, 0)
    best = 0.0
    options = [[None, *range(len(c.configs))] for c in columns]
    for choice in itertools.product(*options):
        used: dict[str, int] = {}
        limited = 0
        cost = 0.0
        for cols, k in zip(columns, choice, strict=True):
            if k is None or not np.isfinite(cols.cost[k]):
                continue
            config = cols.configs[k]
            used[config.gpu_type] = used.get(config.gpu_type, 0) + config.gpus
            counts = gpu_type is None or config.gpu_type == gpu_type
            limited += config.gpus if cols.job.job_id in limit.job_ids and counts else 0
            cost += cols.cost[k]
        fits = all(used[t] <= cluster.types[t].capacity for t in used)
        if fits and limited <= limit.gpus:
            best = min(best, cost)
    got = 0.0
    for cols in columns:
        share = allocation.get(cols.job.job_id)
        if share is not None:
            k = cols.configs.index(share.config)
            got += cols.cost[k]
    assert (
        sum(
            s.config.gpus
            for k, s in allocation.jobs.items()
            if k in limit.job_ids and gpu_type in (None, s.config.gpu_type)
        )
        <= limit.gpus
    )
    assert got == pytest.approx(best, rel=1e-6, abs=1e-9)
    program = assemble(columns, cluster, limit_rows(columns, (limit,))).program
    assert program.capacity.size == len(cluster.gpu_types) + 1  # one row per type, the limit
