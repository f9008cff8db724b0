"""The per-job estimator: Sia's bootstrap across GPU types, shared gradient statistics, caching."""

from __future__ import annotations

import numpy as np
import pytest

from sia_slurm.core import Configuration, GoodputEstimator, GoodputRow
from sia_slurm.model.batch import BatchLimits, optimize_batch_size
from sia_slurm.model.efficiency import GradientStats, efficiency
from sia_slurm.model.estimator import JobGoodputEstimator, evaluate_jobs
from sia_slurm.model.fit import Observation
from sia_slurm.model.throughput import StackedParams, ThroughputParams, sync_time
from sia_slurm.protocol.profile import ProfileSet

LIMITS = BatchLimits(init_batch_size=128, max_batch_size=4096, min_local_bsz=32)
STATS = GradientStats(grad_sqr=1.0, grad_var=20.0)
# Ground truth used to generate measurements: type "b" is ~3x faster than type "a".
TRUE_A = ThroughputParams(0.06, 0.0018, 0.1, 0.01, 0.03, 0.004, 2.0)
TRUE_B = ThroughputParams(0.02, 0.0006, 0.05, 0.005, 0.01, 0.002, 2.0)
A_MULTI = [Configuration("a", 1, 2), Configuration("a", 1, 4), Configuration("a", 2, 8)]
B_MULTI = [Configuration("b", c.nodes, c.gpus) for c in A_MULTI]


def measured(params: ThroughputParams, nodes: int, gpus: int, m: int) -> Observation:
    step = float(sync_time(params, nodes, gpus, m))
    compute = params.alpha_c + params.beta_c * m
    return Observation(nodes, gpus, m, step, step - compute)


def one_gpu_seed(params: ThroughputParams) -> list[Observation]:
    return [measured(params, 1, 1, m) for m in (32, 64, 128, 256, 512)]


def make_estimator(**kwargs: object) -> JobGoodputEstimator:
    return JobGoodputEstimator(
        {"a": 512, "b": 512},
        LIMITS,
        seed={"a": one_gpu_seed(TRUE_A), "b": one_gpu_seed(TRUE_B)},
        grad_stats=STATS,
        **kwargs,  # type: ignore[arg-type]
    )


def add_multi_gpu_runs(est: JobGoodputEstimator, gpu_type: str, truth: ThroughputParams) -> None:
    for nodes, gpus in [(1, 2), (1, 4), (2, 8), (3, 12)]:
        for m in (64, 256):
            est.observe(gpu_type, measured(truth, nodes, gpus, m))


def test_implements_the_goodput_estimator_protocol() -> None:
    est: GoodputEstimator = make_estimator()
    row = est.evaluate([Configuration("a", 1, 1)])
    assert isinstance(row, GoodputRow)
    assert row.goodput.shape == (1,)


def test_only_one_gpu_data_everywhere_predicts_linear_scaling_per_type() -> None:
    est = make_estimator(fixed_batch_size=4096)
    assert est.reference_type() is None
    row = est.evaluate([Configuration("a", 1, 1), Configuration("a", 2, 8)], fixed_batch=True)
    # 4096 = 1 GPU x 512 x 8 micro-batches = 8 GPUs x 512: with no network cost, 8x faster.
    assert row.local_bsz.tolist() == [512, 512]
    assert row.throughput[1] == pytest.approx(8 * row.throughput[0], rel=1e-6)


def test_type_without_multi_gpu_data_is_projected_by_the_xput1_ratio() -> None:
    est = make_estimator()
    add_multi_gpu_runs(est, "b", TRUE_B)
    assert est.reference_type() == "b"
    model_a, model_b = est.type_model("a"), est.type_model("b")
    assert model_a is not None and model_b is not None
    assert not model_a.has_multi_gpu_data and model_b.has_multi_gpu_data
    # xput1 is the best measured 1-GPU throughput: m / step_time at the largest seed batch.
    assert model_a.xput1 == pytest.approx(512 / float(sync_time(TRUE_A, 1, 1, 512)))
    ratio = model_a.xput1 / model_b.xput1
    row_a = est.evaluate(A_MULTI)
    row_b = est.evaluate(B_MULTI)
    np.testing.assert_allclose(row_a.goodput, row_b.goodput * ratio, rtol=1e-12)
    np.testing.assert_allclose(row_a.efficiency, row_b.efficiency, rtol=1e-12)


def test_one_gpu_configuration_always_uses_the_own_model() -> None:
    est = make_estimator()
    add_multi_gpu_runs(est, "b", TRUE_B)
    model_a = est.type_model("a")
    assert model_a is not None
    expected = optimize_batch_size(
        StackedParams.stack([model_a.params], (1, 1)), [1], [1], [512], LIMITS, STATS
    )
    row = est.evaluate([Configuration("a", 1, 1)])
    assert row.goodput[0] == pytest.approx(expected.goodput[0])


def test_after_a_multi_gpu_run_on_a_its_own_model_is_used() -> None:
    est = make_estimator()
    add_multi_gpu_runs(est, "b", TRUE_B)
    projected = est.evaluate(A_MULTI).goodput
    est.observe("a", measured(TRUE_A, 1, 2, 64))
    model_a = est.type_model("a")
    assert model_a is not None and model_a.has_multi_gpu_data
    own = optimize_batch_size(
        StackedParams.stack([model_a.params] * 3, (3, 1)),
        [c.nodes for c in A_MULTI],
        [c.gpus for c in A_MULTI],
        [512] * 3,
        LIMITS,
        STATS,
    )
    row = est.evaluate(A_MULTI)
    np.testing.assert_allclose(row.goodput, own.goodput, rtol=1e-12)
    assert not np.allclose(row.goodput, projected)


def test_projected_batches_are_split_for_the_target_types_memory() -> None:
    est = JobGoodputEstimator(
        {"a": 64, "b": 1024},
        LIMITS,
        seed={"a": [measured(TRUE_A, 1, 1, m) for m in (32, 64)], "b": one_gpu_seed(TRUE_B)},
        grad_stats=GradientStats(0.0, 1.0),  # pure noise: largest batch wins
    )
    add_multi_gpu_runs(est, "b", TRUE_B)
    row = est.evaluate([Configuration("a", 1, 4)])
    assert row.batch_size[0] == 4096
    assert (row.local_bsz[0], row.accum_steps[0]) == (64, 15)


def test_gradient_statistics_are_shared_by_all_types() -> None:
    est = make_estimator()
    configs = [Configuration("a", 1, 1), Configuration("b", 1, 1)]
    before = est.evaluate(configs)
    est.update_grad_stats(GradientStats(grad_sqr=1.0, grad_var=200.0))
    after = est.evaluate(configs)
    # Noisier gradients favour larger batches on every type at once.
    assert np.all(after.batch_size >= before.batch_size)
    assert np.any(after.batch_size > before.batch_size)
    for i in range(2):
        assert after.efficiency[i] == pytest.approx(
            float(efficiency(est.grad_stats, 128, after.batch_size[i]))
        )


def test_unknown_or_unmeasured_types_are_infeasible() -> None:
    est = JobGoodputEstimator({"a": 512, "b": 512}, LIMITS, seed={"a": one_gpu_seed(TRUE_A)})
    row = est.evaluate(
        [Configuration("a", 1, 1), Configuration("b", 1, 1), Configuration("z", 1, 1)]
    )
    assert row.goodput[0] > 0
    assert row.goodput[1:].tolist() == [0.0, 0.0]
    with pytest.raises(ValueError, match="gpu_type: expected one of a, b, got 'z'"):
        est.observe("z", measured(TRUE_A, 1, 1, 32))


def test_fixed_batch_mode() -> None:
    est = make_estimator(fixed_batch_size=1024)
    row = est.evaluate([Configuration("a", 1, 1), Configuration("b", 2, 8)], fixed_batch=True)
    assert row.batch_size.tolist() == [1024, 1024]
    assert row.local_bsz.tolist() == [512, 128]
    assert row.accum_steps.tolist() == [1, 0]


def test_site_type_names_map_to_profile_types() -> None:
    est = make_estimator(type_aliases={"t4-site": "a"})
    row = est.evaluate([Configuration("t4-site", 1, 1), Configuration("a", 1, 1)])
    assert row.goodput[0] == row.goodput[1] > 0


def test_repeated_measurements_average_and_refit_only_on_material_change() -> None:
    est = make_estimator()
    est.observe("b", measured(TRUE_B, 1, 4, 64))
    first = est.type_model("b")
    est.observe("b", measured(TRUE_B, 1, 4, 64))  # same shape, same time: nothing changes
    assert est.type_model("b") is first
    slow = measured(TRUE_B, 1, 4, 64)
    est.observe("b", Observation(1, 4, 64, slow.step_time * 1.5, slow.sync_time))
    assert est.type_model("b") is not first


def test_cached_rows_are_invalidated_by_new_measurements() -> None:
    est = make_estimator()
    before = est.evaluate(A_MULTI).goodput.copy()
    np.testing.assert_array_equal(est.evaluate(A_MULTI).goodput, before)
    add_multi_gpu_runs(est, "b", TRUE_B)
    assert not np.allclose(est.evaluate(A_MULTI).goodput, before)


def test_from_profile_uses_the_apps_defaults_and_job_overrides(profiles: ProfileSet) -> None:
    app = profiles.app("cifar10")
    est = JobGoodputEstimator.from_profile(app, init_batch_size=256, grad_stats=STATS)
    assert est.limits == BatchLimits(256, app.max_batch_size, app.min_local_bsz)
    configs = [Configuration(t, 1, 1) for t in app.gpu_types]
    row = est.evaluate(configs)
    assert np.all(row.goodput > 0)
    assert np.all(row.batch_size >= 256)
    # The A100 ("dgx") profile is the fastest 1-GPU type for cifar10.
    assert configs[int(np.argmax(row.goodput))].gpu_type == "dgx"


@pytest.mark.parametrize("fixed_batch", [False, True])
def test_evaluate_jobs_matches_per_job_evaluation(profiles: ProfileSet, fixed_batch: bool) -> None:
    configs = [Configuration(t, 1, k) for t in ("t4", "rtx", "dgx") for k in (1, 2, 4)]
    configs += [
        Configuration("t4", 3, 12),
        Configuration("rtx", 2, 16),
        Configuration("h100", 1, 1),
    ]

    def jobs() -> list[JobGoodputEstimator]:
        made = []
        for i, app in enumerate(profiles.apps.values()):
            job = JobGoodputEstimator.from_profile(
                app,
                grad_stats=GradientStats(1.0, 7.0 * i),
                fixed_batch_size=app.init_batch_size * 4,
            )
            if i % 2:
                seed = app.seed["rtx"][-1]
                job.observe("rtx", Observation(1, 4, seed.local_bsz, seed.step_time * 1.3, 0.01))
            made.append(job)
        return made

    separate, batched = jobs(), jobs()
    batched[0].evaluate(configs, fixed_batch=fixed_batch)  # one job already cached
    expected = [job.evaluate(configs, fixed_batch=fixed_batch) for job in separate]
    got = evaluate_jobs(batched, configs, fixed_batch=fixed_batch)
    assert len(got) == len(expected) == 6
    for mine, theirs in zip(got, expected, strict=True):
        for name in ("goodput", "throughput", "efficiency"):
            np.testing.assert_allclose(getattr(mine, name), getattr(theirs, name), rtol=1e-12)
        for name in ("batch_size", "local_bsz", "accum_steps"):
            np.testing.assert_array_equal(getattr(mine, name), getattr(theirs, name))
        assert mine.goodput[-1] == 0.0  # h100: no profile
    # Warm second call (all cached) gives the same rows again.
    again = evaluate_jobs(batched, configs, fixed_batch=fixed_batch)
    np.testing.assert_array_equal(again[3].goodput, got[3].goodput)


def mixed_jobs(profiles: ProfileSet, count: int) -> list[JobGoodputEstimator]:
    """Jobs covering every kind of row: own multi-GPU models, projection, aliases, limits."""
    apps = list(profiles.apps.values())
    made = []
    for i in range(count):
        app = apps[i % len(apps)]
        job = JobGoodputEstimator.from_profile(
            app,
            init_batch_size=app.init_batch_size * (1 + i % 2),
            fixed_batch_size=app.init_batch_size * (1 + i % 7),
            grad_stats=GradientStats(float(i % 3), 5.0 * i),
            type_aliases={"quad": "t4"} if i % 5 == 0 else None,
        )
        if i % 3:  # rtx becomes the reference type B; others are projected from it
            seed = app.seed["rtx"][-1]
            job.observe("rtx", Observation(1, 4, seed.local_bsz, seed.step_time * 1.3, 0.01))
        if i % 4 == 1:  # a second type with its own multi-node model
            seed = app.seed["dgx"][-1]
            job.observe("dgx", Observation(2, 16, seed.local_bsz, seed.step_time * 2, 0.05))
        made.append(job)
    return made


@pytest.mark.parametrize("fixed_batch", [False, True])
def test_evaluate_jobs_is_bit_identical_to_per_job_evaluation(
    profiles: ProfileSet, fixed_batch: bool
) -> None:
    # Enough jobs for several slices of evaluate_jobs (large grids take different code paths
    # than one job's small grid), some of them already cached.
    configs = [Configuration(t, 1, k) for t in ("t4", "rtx", "dgx", "quad") for k in (1, 2, 3, 4)]
    configs += [Configuration("t4", 3, 12), Configuration("rtx", 2, 16)]
    configs += [
        Configuration("dgx", 2, 16),
        Configuration("dgx", 4, 32),
        Configuration("h100", 1, 1),
    ]
    separate, batched = mixed_jobs(profiles, 90), mixed_jobs(profiles, 90)
    for job in batched[5:40:3]:
        job.evaluate(configs, fixed_batch=fixed_batch)
    expected = [job.evaluate(configs, fixed_batch=fixed_batch) for job in separate]
    got = evaluate_jobs(batched, configs, fixed_batch=fixed_batch)
    names = ("goodput", "throughput", "efficiency", "batch_size", "local_bsz", "accum_steps")
    for name in names:
        mine = np.stack([getattr(row, name) for row in got])
        theirs = np.stack([getattr(row, name) for row in expected])
        assert mine.dtype == theirs.dtype
        np.testing.assert_array_equal(mine, theirs, err_msg=name)
    # The rows exercised what they should: accumulation, infeasible and projected configurations.
    assert any(row.accum_steps.max() > 0 for row in expected)
    assert all(row.goodput[-1] == 0.0 for row in expected)  # h100: no profile
    assert any(job.reference_type() == "rtx" for job in separate)
    # Cached grids are reused by the per-job path with the same results.
    again = [job.evaluate(configs, fixed_batch=fixed_batch) for job in batched]
    for mine, theirs in zip(again, expected, strict=True):
        np.testing.assert_array_equal(mine.goodput, theirs.goodput)


def test_evaluate_many_gives_each_job_its_own_rows_across_candidate_counts(
    profiles: ProfileSet,
) -> None:
    """The policy's batched path (``evaluate_many``) splits jobs by candidate count and returns
    rows in the jobs' order, the same as one ``evaluate`` per job."""
    configs = [Configuration(t, 1, k) for t in ("t4", "rtx", "dgx") for k in (1, 2, 4)]

    def jobs() -> list[JobGoodputEstimator]:
        return [
            JobGoodputEstimator.from_profile(
                app, grad_stats=GradientStats(1.0, 3.0 * i), num_candidates=20 + 10 * (i % 2)
            )
            for i, app in enumerate(profiles.apps.values())
        ]

    separate, batched = jobs(), jobs()
    expected = [job.evaluate(configs) for job in separate]
    got = JobGoodputEstimator.evaluate_many(batched, configs)
    assert len(got) == len(expected) == len(profiles.apps)
    for mine, theirs in zip(got, expected, strict=True):
        np.testing.assert_array_equal(mine.goodput, theirs.goodput)
        np.testing.assert_array_equal(mine.batch_size, theirs.batch_size)
