"""Gavel's hierarchical max-min fairness by water-filling (policy/gavel_fill.py).

Each case is one where the first LP alone (``water_filling=False``) leaves capacity out of
``X``: its optimum fixes only the lowest weighted level, so it fails the assertions about the
jobs above it.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import linprog

from sia_slurm.policy.gavel_fill import passed_down, water_fill
from sia_slurm.policy.gavel_lp import fill_program, normalised, shared_rows, solve_lp
from tests.estimators import gavel_instance


def levels(throughput, gpus, capacity, x):
    """Each job's normalised throughput ``N = sum_type T X / T_ref``."""
    return (normalised(throughput, gpus, capacity) * x).sum(axis=1)


def first_lp_minimum(throughput, gpus, capacity, weights):
    """The first LP's optimum, the lowest weighted level (unique, whatever vertex it returns)."""
    x = solve_lp(throughput, gpus, capacity, "max_min_fairness", weights, water_filling=False)
    runnable = (throughput > 0).any(axis=1)
    return (levels(throughput, gpus, capacity, x) / weights)[runnable].min()


def test_capacity_the_bottlenecked_job_cannot_use_goes_to_the_others():
    """Type A has 1 GPU, B 2. "stuck" runs only on A; "p" and "q" run on A at 1 step/s and on
    B at 3. stuck's level N = X_A is at most 1 (its whole time on A), which is the first LP's
    minimum; p and q (T_ref = (1 + 3) / 2, so N = (X_A + 3 X_B) / 2) can each have all of B:
    N = 1.5. The first LP stops them at its minimum, 1 (X_B = 2/3)."""
    throughput = np.array([[1.0, 0.0], [1.0, 3.0], [1.0, 3.0]])
    gpus, capacity, weights = np.ones(3), np.array([1.0, 2.0]), np.ones(3)
    x = solve_lp(throughput, gpus, capacity, "max_min_fairness")
    level = levels(throughput, gpus, capacity, x)
    assert level[0] == pytest.approx(first_lp_minimum(throughput, gpus, capacity, weights))
    assert level[0] == pytest.approx(1.0, abs=1e-5)
    assert x[1:, 1] == pytest.approx([1.0, 1.0], abs=1e-5)
    assert level[1:] == pytest.approx([1.5, 1.5], abs=1e-5)


def test_weights_split_the_level_of_jobs_bottlenecked_together():
    """Types A and B with 1 GPU each. "stuck" (weight 4) runs alone on A and is the first LP's
    bottleneck (weighted level N / 4 = 1.5 / 4 with all of A; T_ref is 2/3 of a GPU: 2 GPUs for
    3 jobs). "heavy" (weight 2) and "light" (weight 1) share B and are bottlenecked together in
    the second round: equal weighted levels give heavy twice light's N, and all of B is used
    (the first LP leaves them at 4 x its minimum / 4 of B)."""
    throughput = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    gpus, capacity, weights = np.ones(3), np.array([1.0, 1.0]), np.array([4.0, 2.0, 1.0])
    x = solve_lp(throughput, gpus, capacity, "max_min_fairness", weights)
    level = levels(throughput, gpus, capacity, x)
    assert level[0] / 4 == pytest.approx(first_lp_minimum(throughput, gpus, capacity, weights))
    assert x[1:, 1].sum() == pytest.approx(1.0, abs=1e-5)
    assert level[1] == pytest.approx(2 * level[2], rel=1e-4)
    assert x[1:, 1] == pytest.approx([2 / 3, 1 / 3], abs=1e-5)


def can_rise(throughput, gpus, capacity, weights, level, m, tolerance=1e-6):
    """Whether job ``m``'s N can exceed ``level[m]`` by 0.1% while every job at or below its
    weighted level keeps its own and none above falls below it: then the sorted weighted
    levels would improve, so ``level`` was not max-min fair (leximin). An LP of its own."""
    n_jobs, n_types = throughput.shape
    a_ub, b_ub, bounds = shared_rows(throughput, gpus, capacity)
    rows = np.zeros((n_jobs, n_jobs * n_types))
    for j in range(n_jobs):
        rows[j, j * n_types : (j + 1) * n_types] = normalised(throughput, gpus, capacity)[j]
    weighted = level / weights
    others = [j for j in range(n_jobs) if j != m and level[j] > 0]
    keep = np.minimum(weighted[others], weighted[m]) * weights[others]
    result = linprog(
        -rows[m],
        A_ub=np.vstack([a_ub.toarray(), -rows[others]]),
        b_ub=np.r_[b_ub, -keep * (1 - tolerance)],
        bounds=bounds,
        method="highs",
    )
    # The solver holds frozen levels to 1e-6 (relative), and a 1-GPU job can take what that
    # frees from many 8-GPU jobs: allow it 1e-3 (absolute) beyond 0.1%.
    return -result.fun > level[m] * (1 + 1e-3) + 1e-3


def test_water_filled_shares_are_max_min_fair_and_feasible():
    """20 jobs on 3 types: X keeps every constraint, the lowest weighted level is the first
    LP's, and no job's level can rise by 0.1% without lowering one at or below its weighted
    level or pushing one above below it (the first LP's X fails this for most jobs)."""
    throughput, gpus, capacity, weights = gavel_instance(7, 20)
    x = solve_lp(throughput, gpus, capacity, "max_min_fairness", weights)
    assert np.all(x >= 0) and np.all(x[throughput == 0] == 0)
    assert np.all(x.sum(axis=1) <= 1 + 1e-5)
    assert np.all((x * gpus[:, None]).sum(axis=0) <= capacity + 1e-4)
    level = levels(throughput, gpus, capacity, x)
    runnable = (throughput > 0).any(axis=1)
    assert (level / weights)[runnable].min() == pytest.approx(
        first_lp_minimum(throughput, gpus, capacity, weights), rel=1e-4
    )
    # The solver's own levels: X rounded to 5 decimals may leave a GPU's 1e-5 to take
    filled = water_fill(fill_program(throughput, gpus, capacity), weights, runnable)
    assert filled is not None
    assert filled.levels == pytest.approx(level, rel=1e-3)
    risers = [
        m for m in range(20) if can_rise(throughput, gpus, capacity, weights, filled.levels, m)
    ]
    assert risers == []


def test_twins_the_duals_miss_are_found_by_the_bottleneck_lp():
    """Five jobs, each twice: a max-min LP's dual may prove one twin bottlenecked and not the
    other, whose next round then stalls and goes to the bottleneck LP. The result is still
    max-min fair (a bottleneck LP that froze every candidate would leave 8 of 10 able to rise)
    and twins end alike."""
    throughput, gpus, capacity, weights = gavel_instance(0, 5)
    throughput, gpus, weights = (np.repeat(a, 2, axis=0) for a in (throughput, gpus, weights))
    runnable = (throughput > 0).any(axis=1)
    filled = water_fill(fill_program(throughput, gpus, capacity), weights, runnable)
    assert filled is not None
    assert filled.solves > filled.rounds  # the bottleneck LP ran
    risers = [
        m for m in range(10) if can_rise(throughput, gpus, capacity, weights, filled.levels, m)
    ]
    assert risers == []
    assert filled.levels[0::2] == pytest.approx(filled.levels[1::2], rel=1e-4)


def test_rounds_end_with_every_job_frozen():
    """Jobs 0 and 1 alone on a type each (weights 4 and 1), jobs 2 and 3 (weight 1) sharing a
    third: weighted levels N/4, N/2 and N take three rounds, each freezing one level; jobs
    that all share one type are all bottlenecked at once: one round."""
    throughput = np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.0, 1.0]])
    gpus, capacity = np.ones(4), np.array([1.0, 1.0, 1.0])
    program = fill_program(throughput, gpus, capacity)
    filled = water_fill(program, np.array([4.0, 1.0, 1.0, 1.0]), np.ones(4, dtype=bool))
    assert filled is not None
    assert filled.rounds == 3
    assert filled.levels / filled.levels[0] == pytest.approx([1.0, 1.0, 0.5, 0.5], abs=1e-5)

    shared = np.ones((5, 1))
    program = fill_program(shared, np.ones(5), np.array([2.0]))
    filled = water_fill(program, np.ones(5), np.ones(5, dtype=bool))
    assert filled is not None
    assert filled.rounds == 1
    assert filled.x == pytest.approx([0.4] * 5, abs=1e-5)


# Gavel's hierarchical reweighting: a frozen job's weight passes to its group's active jobs


def test_a_frozen_jobs_weight_passes_to_its_user_then_its_account():
    """Account A: user u1 with jobs 0 and 1 (0.5 each), user u2 with job 2 (1); account B:
    job 3 (2). While all are active each keeps its weight; job 0 frozen: u1's 1 goes to job
    1; u1 all frozen: A's 2 goes to u2; A all frozen: B keeps its own 2 (only ratios count)."""
    weights = np.array([0.5, 0.5, 1.0, 2.0])
    groups = [np.array(["A", "A", "A", "B"]), np.array(["u1", "u1", "u2", "u3"])]
    cases = {
        (1, 1, 1, 1): [0.5, 0.5, 1.0, 2.0],
        (0, 1, 1, 1): [0.0, 1.0, 1.0, 2.0],
        (0, 0, 1, 1): [0.0, 0.0, 2.0, 2.0],
        (1, 1, 0, 1): [1.0, 1.0, 0.0, 2.0],
        (0, 0, 0, 1): [0.0, 0.0, 0.0, 2.0],
    }
    for active, expected in cases.items():
        rates = passed_down(weights, groups, np.array(active, dtype=bool))
        assert rates == pytest.approx(expected), active
    # without groups each active job keeps its own weight
    assert passed_down(weights, (), np.array([0, 1, 1, 1], dtype=bool)) == pytest.approx(
        [0.0, 0.5, 1.0, 2.0]
    )


def test_an_account_keeps_its_share_of_what_is_left_when_one_of_its_jobs_is_frozen():
    """Type X (4 GPUs): a1 (account A, weight 1) and c1 (C, 3) with 4 GPUs each, time-sharing
    it; type Y (1 GPU): a2 (A, 1) and b1 (B, 2). Every N is 2 X (T_ref: half a GPU's time).
    Round 1: a1 and c1 freeze at weighted level 0.5 (X = 1/4, 3/4); a2 and b1 are at N = 0.5
    and 1 with a quarter of Y left. Gavel passes a1's weight to a2, so A and B (2 each) split
    the rest equally: X = 3/8, 5/8. With the weights alone, 1:2 all along: 1/3, 2/3."""
    throughput = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    gpus, capacity = np.array([4.0, 1.0, 1.0, 4.0]), np.array([4.0, 1.0])
    weights = np.array([1.0, 1.0, 2.0, 3.0])
    accounts = [np.array(["A", "A", "B", "C"])]
    x = solve_lp(throughput, gpus, capacity, "max_min_fairness", weights, groups=accounts)
    assert x[:, 0] == pytest.approx([0.25, 0.0, 0.0, 0.75], abs=1e-5)
    assert x[1:3, 1] == pytest.approx([3 / 8, 5 / 8], abs=1e-5)
    alone = solve_lp(throughput, gpus, capacity, "max_min_fairness", weights)
    assert alone[1:3, 1] == pytest.approx([1 / 3, 2 / 3], abs=1e-5)


def test_jobs_alike_but_in_different_accounts_are_not_averaged():
    """The case above with b1 at weight 1, as a2: alike but for their accounts, and after a1
    freezes a2 rises at A's weight 2, b1 at 1. Averaging them as interchangeable (the shares
    of tied jobs) would undo that: a2 keeps more of Y than b1."""
    throughput = np.array([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    gpus, capacity = np.array([4.0, 1.0, 1.0, 4.0]), np.array([4.0, 1.0])
    weights = np.array([1.0, 1.0, 1.0, 3.0])
    accounts = [np.array(["A", "A", "B", "C"])]
    x = solve_lp(throughput, gpus, capacity, "max_min_fairness", weights, groups=accounts)
    assert x[1, 1] > x[2, 1] + 0.05
    assert x[1:3, 1].sum() == pytest.approx(1.0, abs=1e-5)
