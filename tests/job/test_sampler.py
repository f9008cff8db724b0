"""The elastic sampler: every sample exactly once per epoch, whatever the world size does."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_slurm.job.elastic.sampler import ElasticSampler, SamplerError


def run_step(sampler: ElasticSampler, replicas: int, local_bsz: int, accum: int) -> list[int]:
    """One step on every replica (each builds its plan; all advance); the indices trained."""
    batch = replicas * local_bsz * (accum + 1)
    plans = [
        sampler.plan(
            batch_size=batch, local_bsz=local_bsz, accum_steps=accum, rank=r, replicas=replicas
        )
        for r in range(replicas)
    ]
    assert all(p is not None for p in plans)
    for plan in plans:  # all replicas agree on the step
        assert plan is not None and (plan.epoch, plan.position, plan.size) == (
            plans[0].epoch,  # type: ignore[union-attr]
            plans[0].position,  # type: ignore[union-attr]
            plans[0].size,  # type: ignore[union-attr]
        )
        for micro in plan.micro_batches:
            assert len(micro) <= local_bsz
    trained = [i for plan in plans for micro in plan.micro_batches for i in micro]  # type: ignore[union-attr]
    assert len(trained) == plans[0].size  # type: ignore[union-attr]
    sampler.advance(plans[0])  # type: ignore[arg-type]
    return trained


def test_order_depends_on_seed_and_epoch_only() -> None:
    a, b = ElasticSampler(50, seed=3), ElasticSampler(50, seed=3)
    assert list(a.order(0)) == list(b.order(0))
    assert sorted(a.order(0)) == list(range(50))
    assert list(a.order(0)) != list(a.order(1))
    assert list(ElasticSampler(50, seed=4).order(0)) != list(a.order(0))
    assert list(ElasticSampler(5, shuffle=False).order(7)) == [0, 1, 2, 3, 4]


def test_full_step_splits_consecutive_slots_over_replicas_and_micro_batches() -> None:
    sampler = ElasticSampler(100, shuffle=False)
    plan0 = sampler.plan(batch_size=12, local_bsz=3, accum_steps=1, rank=0, replicas=2)
    plan1 = sampler.plan(batch_size=12, local_bsz=3, accum_steps=1, rank=1, replicas=2)
    assert plan0 is not None and plan1 is not None
    # slot = micro * replicas + rank, 3 samples each
    assert plan0.micro_batches == ((0, 1, 2), (6, 7, 8))
    assert plan1.micro_batches == ((3, 4, 5), (9, 10, 11))
    assert plan0.uniform and plan0.size == 12 and plan0.local_size == 6


def test_epoch_tail_is_spread_evenly_within_the_local_batch() -> None:
    sampler = ElasticSampler(23, shuffle=False)
    trained = run_step(sampler, replicas=2, local_bsz=4, accum=1)  # 16 of 23
    assert sorted(trained) == list(range(16))
    plans = [
        sampler.plan(batch_size=16, local_bsz=4, accum_steps=1, rank=r, replicas=2)
        for r in range(2)
    ]
    assert all(p is not None and not p.uniform for p in plans)
    sizes = [len(m) for p in plans for m in p.micro_batches]  # type: ignore[union-attr]
    assert sum(sizes) == 7 and max(sizes) <= 4 and max(sizes) - min(sizes) <= 1
    assert len(plans[0].micro_batches) == 1  # 7 samples need one micro-batch of 4 per replica
    sampler.advance(plans[0])  # type: ignore[arg-type]
    assert sampler.epoch_done
    assert sampler.plan(batch_size=16, local_bsz=4, accum_steps=1, rank=0, replicas=2) is None


def test_fewer_samples_than_replicas_leaves_some_replicas_empty() -> None:
    sampler = ElasticSampler(10, shuffle=False)
    run_step(sampler, replicas=4, local_bsz=2, accum=0)  # 8
    plans = [
        sampler.plan(batch_size=8, local_bsz=2, accum_steps=0, rank=r, replicas=4) for r in range(4)
    ]
    assert [p.micro_batches for p in plans] == [((8,),), ((9,),), ((),), ((),)]  # type: ignore[union-attr]


def test_resume_with_another_world_size_skips_and_repeats_nothing() -> None:
    first = ElasticSampler(1000, seed=11)
    seen = Counter[int]()
    for _ in range(7):
        seen.update(run_step(first, replicas=2, local_bsz=8, accum=0))
    state = first.state_dict()
    resumed = ElasticSampler(1000, seed=11)
    resumed.load_state_dict(state)
    while not resumed.epoch_done:
        seen.update(run_step(resumed, replicas=8, local_bsz=5, accum=2))
    assert sorted(seen) == list(range(1000)) and set(seen.values()) == {1}
    # ... and the epoch is the same one an uninterrupted run would have seen, in order
    assert resumed.epoch == 0


@settings(max_examples=40, deadline=None)
@given(
    size=st.integers(1, 300),
    shapes=st.lists(
        st.tuples(st.integers(1, 6), st.integers(1, 9), st.integers(0, 3), st.integers(1, 8)),
        min_size=1,
        max_size=6,
    ),
)
def test_any_sequence_of_reconfigurations_covers_each_epoch_exactly_once(
    size: int, shapes: list[tuple[int, int, int, int]]
) -> None:
    sampler = ElasticSampler(size, seed=1)
    epochs: dict[int, Counter[int]] = {}
    for replicas, local_bsz, accum, steps in shapes:
        restored = ElasticSampler(size, seed=1)
        restored.load_state_dict(sampler.state_dict())  # a restart between configurations
        sampler = restored
        for _ in range(steps):
            if sampler.epoch_done:
                sampler.next_epoch()
            epoch = sampler.epoch
            epochs.setdefault(epoch, Counter()).update(
                run_step(sampler, replicas, local_bsz, accum)
            )
    for epoch, counts in epochs.items():
        assert set(counts.values()) == {1}, f"epoch {epoch} repeated a sample"
        if epoch < sampler.epoch or sampler.epoch_done:
            assert sorted(counts) == list(range(size)), f"epoch {epoch} skipped a sample"


def test_bad_requests_and_foreign_states_are_refused() -> None:
    sampler = ElasticSampler(10)
    with pytest.raises(SamplerError, match="batch_size: 9 != replicas"):
        sampler.plan(batch_size=9, local_bsz=4, accum_steps=0, rank=0, replicas=2)
    with pytest.raises(SamplerError, match="rank"):
        sampler.plan(batch_size=8, local_bsz=4, accum_steps=0, rank=2, replicas=2)
    with pytest.raises(SamplerError, match="not finished"):
        sampler.next_epoch()
    other = ElasticSampler(11).state_dict()
    with pytest.raises(SamplerError, match="dataset_size=11"):
        sampler.load_state_dict(other)
    with pytest.raises(SamplerError, match="dataset_size"):
        ElasticSampler(0)
    plan = sampler.plan(batch_size=4, local_bsz=4, accum_steps=0, rank=0, replicas=1)
    assert plan is not None
    sampler.advance(plan)
    with pytest.raises(SamplerError, match="does not continue"):
        sampler.advance(plan)
