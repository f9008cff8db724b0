"""The round program's solver: exact where it says so, within ``accept_gap`` of the optimum
where it says near-optimal, always feasible; checked against HiGHS on the whole program."""

from __future__ import annotations

import numpy as np
import pytest

from sia_slurm.policy import sia_dual, sia_milp, sia_solve
from sia_slurm.policy.sia_milp import CouplingRows, Program


def random_program(seed: int, jobs: int, types: int, extra: CouplingRows | None = None) -> Program:
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
    if extra is not None and extra.coupling.shape[1] != len(cost):
        extra = CouplingRows(extra.coupling[:, : len(cost)], extra.capacity)
    program, _ = Program.build(
        np.array(cost), np.array(gpus), np.array(gpu_type), np.array(job), capacity, jobs, extra
    )
    return program


def exact(program: Program) -> float:
    result = sia_milp.solve_exact(program, time_limit_s=30.0)
    assert result.status == "optimal" and result.chosen is not None
    return program.objective(result.chosen)


@pytest.mark.parametrize("seed", range(15))
def test_solve_with_accept_gap_zero_matches_the_full_program(seed):
    program = random_program(seed, jobs=int(5 + 7 * seed), types=1 + seed % 4)
    result = sia_solve.solve(program, time_limit_s=10.0, mip_rel_gap=0.0, accept_gap=0.0)
    assert result.status == "optimal"
    assert result.chosen is not None and program.feasible(result.chosen)
    assert program.objective(result.chosen) == pytest.approx(exact(program), abs=1e-9)


@pytest.mark.parametrize(
    "seed",
    [pytest.param(s, marks=pytest.mark.heavy) if s in (17, 25) else s for s in range(40)],
)
def test_default_solve_is_within_a_tenth_of_a_percent_of_the_optimum(seed):
    """Many random instances from 10 to 1,500 jobs: the certified gap holds against HiGHS."""
    rng = np.random.default_rng(1000 + seed)
    jobs = int(rng.choice([10, 40, 150, 600, 1500]))
    program = random_program(2000 + seed, jobs=jobs, types=int(rng.integers(1, 6)))
    result = sia_solve.solve(program, time_limit_s=10.0, mip_rel_gap=1e-4, accept_gap=1e-3)
    assert result.status in ("optimal", "near-optimal")
    assert result.chosen is not None and program.feasible(result.chosen)
    optimum = exact(program)
    assert program.objective(result.chosen) <= optimum + 1e-3 * abs(optimum) + 1e-9


def test_extra_coupling_rows_are_respected_and_priced():
    """A shared limit across types (e.g. an account's GPUs) binds; the solver still matches
    HiGHS on the whole program."""
    rng = np.random.default_rng(5)
    size = 2000
    coupling = np.zeros((1, size))
    coupling[0, rng.random(size) < 0.5] = 1.0  # half the columns count against a limit of 5
    program = random_program(11, jobs=60, types=3, extra=CouplingRows(coupling, np.array([5.0])))
    assert program.capacity.size == 4
    result = sia_solve.solve(program, 10.0, 0.0, accept_gap=0.0)
    assert result.chosen is not None and program.feasible(result.chosen)
    assert program.coupling[3, result.chosen].sum() <= 5.0
    assert program.objective(result.chosen) == pytest.approx(exact(program), abs=1e-9)
    assert sia_dual.lagrangian_prices(program)[3] > 0  # the limit binds, so it has a price


def test_lagrangian_bound_is_below_the_optimum_and_prices_raise_it():
    program = random_program(7, jobs=60, types=3)
    prices = sia_dual.lagrangian_prices(program)
    optimum = exact(program)
    assert sia_dual.lagrangian(program, prices) <= optimum + 1e-9
    assert sia_dual.lagrangian(program, prices) > sia_dual.lagrangian(program, 0 * prices)
    pricing = sia_dual.Pricing.at(program, prices)
    assert pricing.bound == pytest.approx(sia_dual.lagrangian(program, prices))
    assert (pricing.delta >= -1e-12).all() and (pricing.margin >= 0).all()


def test_fixing_that_overfills_a_row_frees_the_jobs_with_the_smallest_margins():
    # three jobs want 4 GPUs each of a 8-GPU type at zero prices: one must be freed
    program, _ = Program.build(
        np.array([-1.0, -0.9, -0.5]),
        np.array([4.0, 4.0, 4.0]),
        np.array([0, 0, 0]),
        np.array([0, 1, 2]),
        np.array([8.0]),
        3,
    )
    pricing = sia_dual.Pricing.at(program, np.zeros(1))
    chosen, free = sia_solve.fix_choice(program, pricing, np.zeros(3, dtype=bool))
    assert free.tolist() == [False, False, True]  # job 2 has the smallest margin (0.5)
    assert chosen.tolist() == [True, True, False]


def test_program_where_every_column_is_priced_out_returns_nothing():
    program, _ = Program.build(
        np.array([-0.5, -0.4]),
        np.array([4.0, 4.0]),
        np.array([0, 0]),
        np.array([0, 1]),
        np.array([0.0]),
        2,
    )
    result = sia_solve.solve(program, 1.0, 0.0)
    assert result.chosen is not None and not result.chosen.any()
