"""The exact column reduction before HiGHS: same optimum as solving the whole program."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import Bounds, LinearConstraint, milp

from sia_slurm.policy import sia_milp
from sia_slurm.policy.sia_milp import Program


def random_program(seed: int, jobs: int, types: int) -> Program:
    rng = np.random.default_rng(seed)
    job, gpus, gpu_type, cost = [], [], [], []
    for j in range(jobs):
        for t in range(types):
            for k in range(int(rng.integers(0, 5))):
                job.append(j)
                gpus.append(2.0**k)
                gpu_type.append(t)
                cost.append(-rng.uniform(0.05, 1.0) * (1 + 0.3 * k))
    capacity = rng.integers(1, 3 * jobs // types + 2, types).astype(float)
    program, _ = Program.build(
        np.array(cost), np.array(gpus), np.array(gpu_type), np.array(job), capacity, jobs
    )
    return program


def direct(program: Program) -> float:
    result = milp(
        program.cost,
        integrality=np.ones(program.size),
        bounds=Bounds(0, 1),
        constraints=LinearConstraint(
            program.matrix(), -np.inf, np.r_[np.ones(program.n_jobs), program.capacity]
        ),
        options={"mip_rel_gap": 0.0},
    )
    return float(result.fun)


@pytest.mark.parametrize("seed", range(15))
def test_reduced_solve_matches_the_full_program(seed):
    program = random_program(seed, jobs=int(5 + 7 * seed), types=1 + seed % 4)
    result = sia_milp.solve(program, time_limit_s=10.0, mip_rel_gap=0.0)
    assert result.status == "optimal"
    chosen = result.chosen
    assert np.bincount(program.job[chosen], minlength=program.n_jobs).max(initial=0) <= 1
    usage = np.bincount(
        program.gpu_type[chosen], weights=program.gpus[chosen], minlength=program.capacity.size
    )
    assert (usage <= program.capacity + 1e-9).all()
    assert program.cost[chosen].sum() == pytest.approx(direct(program), abs=1e-9)


def test_lagrangian_bound_is_below_the_optimum_and_greedy_is_feasible():
    program = random_program(7, jobs=60, types=3)
    prices = sia_milp.lagrangian_prices(program)
    optimum = direct(program)
    assert sia_milp.lagrangian(program, prices) <= optimum + 1e-9
    assert sia_milp.lagrangian(program, prices) > sia_milp.lagrangian(program, 0 * prices)
    greedy = sia_milp.greedy_incumbent(program, prices)
    usage = np.bincount(program.gpu_type[greedy], weights=program.gpus[greedy], minlength=3)
    assert (usage <= program.capacity).all()
    assert program.cost[greedy].sum() >= optimum - 1e-9


def test_program_where_every_column_is_priced_out_returns_nothing():
    program, _ = Program.build(
        np.array([-0.5, -0.4]),
        np.array([4.0, 4.0]),
        np.array([0, 0]),
        np.array([0, 1]),
        np.array([0.0]),
        2,
    )
    result = sia_milp.solve(program, 1.0, 0.0)
    assert result.chosen is not None and not result.chosen.any()
