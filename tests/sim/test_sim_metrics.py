"""Simulation metrics on fixed numbers, computed as reference section 6 defines them."""

from __future__ import annotations

import math
import statistics

import pytest

from sia_slurm.sim.artifact_metrics import (
    JobOutcome,
    percentile_index,
    pooled_metrics,
    workload_metrics,
)

H = 3600.0


def job(
    name: str,
    submit_h: float,
    jct_h: float | None,
    gpu_h: float,
    restarts: int = 0,
    contention: float = 1.0,
) -> JobOutcome:
    finish = None if jct_h is None else (submit_h + jct_h) * H
    return JobOutcome(name, "app", submit_h * H, finish, gpu_h * H, restarts, contention)


def test_p99_is_the_artifacts_index_rule() -> None:
    values = list(range(1, 101))  # 1..100
    assert percentile_index(values, 0.99) == 100  # sorted(v)[int(0.99 * 100)] = v[99]
    assert percentile_index([5.0, 1.0, 3.0], 0.99) == 5.0  # int(2.97) = 2
    assert percentile_index(list(range(10)), 0.5) == 5
    assert math.isnan(percentile_index([], 0.99))


def test_workload_metrics_on_a_hand_checked_case() -> None:
    jobs = [
        job("a", 0.0, 1.0, gpu_h=4.0, restarts=2, contention=2.0),
        job("b", 0.5, 2.0, gpu_h=2.0, restarts=0, contention=1.0),
        job("c", 1.0, 0.5, gpu_h=0.0, restarts=1, contention=3.0),
    ]
    m = workload_metrics(jobs, contention=[1, 3, 2, 0], solve_ms=[4.0, 1.0, 2.0, 3.0], wall_s=7.5)
    assert m.jobs == m.completed == 3
    assert m.avg_jct_h == pytest.approx((1.0 + 2.0 + 0.5) / 3)
    assert m.p99_jct_h == pytest.approx(2.0)  # sorted [0.5, 1, 2][int(2.97)]
    assert m.makespan_h == pytest.approx(2.5)  # b ends at 2.5 h, a submitted at 0
    assert m.gpu_hours_per_job == pytest.approx(2.0)
    assert m.restarts_per_job == pytest.approx(1.0)
    assert m.contention_mean == pytest.approx(2.0)
    assert m.contention_max == 3
    assert m.solve_ms_median == pytest.approx(2.5)
    assert m.solve_ms_p95 == 4.0  # sorted [1, 2, 3, 4][int(3.8)]
    assert m.wall_s == 7.5
    assert m.jct_h == pytest.approx({"a": 1.0, "b": 2.0, "c": 0.5})


def test_unfinished_jobs_count_for_resources_not_for_jct() -> None:
    jobs = [job("a", 0.0, 1.0, gpu_h=1.0), job("b", 0.0, None, gpu_h=3.0, restarts=4)]
    m = workload_metrics(jobs, contention=[2], solve_ms=[], wall_s=0.0)
    assert (m.jobs, m.completed) == (2, 1)
    assert m.avg_jct_h == pytest.approx(1.0)
    assert m.gpu_hours_per_job == pytest.approx(2.0)
    assert m.restarts_per_job == pytest.approx(2.0)
    assert math.isnan(m.solve_ms_median)
    assert m.jct_h == {"a": pytest.approx(1.0)}


def test_pooled_metrics_pool_jobs_and_average_makespans() -> None:
    first = [job("a", 0.0, 1.0, gpu_h=1.0), job("b", 0.0, 3.0, gpu_h=3.0, restarts=2)]
    second = [job("c", 1.0, 4.0, gpu_h=8.0, restarts=1, contention=5.0)]
    solve = [[1.0, 2.0], [10.0]]
    per = [
        workload_metrics(first, contention=[2, 2], solve_ms=solve[0], wall_s=1.0),
        workload_metrics(second, contention=[1, 7], solve_ms=solve[1], wall_s=2.0),
    ]
    pooled = pooled_metrics(per, [first, second], solve)
    assert pooled.workloads == 2 and pooled.jobs == pooled.completed == 3
    assert pooled.avg_jct_h == pytest.approx((1 + 3 + 4) / 3)  # over all jobs, not workloads
    assert pooled.avg_jct_std_h == pytest.approx(statistics.pstdev([2.0, 4.0]))
    assert pooled.p99_jct_h == pytest.approx(4.0)
    assert pooled.makespan_h == pytest.approx((3.0 + 4.0) / 2)
    assert pooled.gpu_hours_per_job == pytest.approx(12.0 / 3)
    assert pooled.restarts_per_job == pytest.approx(1.0)
    assert pooled.contention_mean == pytest.approx((1 + 1 + 5) / 3)
    assert pooled.contention_max == 7
    assert pooled.solve_ms_median == pytest.approx(2.0)
    assert pooled.solve_ms_p95 == 10.0
    assert (pooled.wall_s, pooled.wall_max_s) == (3.0, 2.0)
