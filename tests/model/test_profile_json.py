"""A job's own profile as one bounded document (``profile.json``): every shipped profile
survives the round trip, and every hostile value is refused naming the file and the field."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sia_slurm.protocol import ProtocolError
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.protocol.profile_json import profile_from_json, profile_to_json

PROFILES = load_profiles()
TYPES = tuple(PROFILES.gpu_types)


@pytest.mark.parametrize("app", sorted(PROFILES.apps))
def test_every_shipped_profile_round_trips(app: str) -> None:
    profile = PROFILES.app(app)
    assert profile_from_json(profile_to_json(profile), "p.json", TYPES) == profile


def _doc(**changes: Any) -> dict[str, Any]:
    document = copy.deepcopy(profile_to_json(PROFILES.app("cifar10")))
    for path, value in changes.items():
        target = document
        *parents, last = path.split("__")
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is ...:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return document


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        ({"format": 2}, "format: this sia-slurm reads format 1"),
        ({"extra": 1}, "unknown field(s) extra"),
        ({"init_batch_size": 0}, "init_batch_size: expected an integer 1..16777216"),
        ({"max_batch_size": 2**40}, "max_batch_size: expected an integer"),
        ({"min_local_bsz": 10**6}, "init_batch_size: expected min_local_bsz"),
        ({"max_local_bsz": {}}, "max_local_bsz: expected an object"),
        ({"max_local_bsz": {"h100": 8}}, "max_local_bsz.h100: expected a GPU type"),
        ({"max_local_bsz__t4": -3}, "max_local_bsz.t4: expected an integer"),
        ({"seed": []}, "seed: expected a list"),
        ({"seed__0__step_time": -1.0}, "seed[0].step_time: expected seconds > 0"),
        ({"seed__0__step_time": 1e6}, "seed[0].step_time: expected seconds > 0 and <= 86400"),
        ({"seed__0__step_time": True}, "seed[0].step_time"),
        ({"seed__0__sync_time": 99.0}, "seed[0].sync_time: expected less than step_time"),
        ({"seed__0__placement": "0"}, "seed[0].placement: expected digits 1-9"),
        ({"seed__0__placement": 4}, "seed[0].placement"),
        ({"seed__0__local_bsz": 10**7}, "seed[0].local_bsz: expected an integer 1.."),
        ({"seed__0__gpu_type": "../t4"}, "seed[0].gpu_type: expected a GPU type"),
        ({"seed__0__extra": 1}, "seed[0]: expected an object of gpu_type"),
        ({"description": 3}, "description: expected text"),
    ],
    ids=lambda v: str(v)[:40],
)
def test_a_hostile_profile_is_refused_naming_the_field(changes: dict[str, Any], said: str) -> None:
    with pytest.raises(ProtocolError) as excinfo:
        profile_from_json(_doc(**changes), "jobs/x/profile.json", TYPES)
    assert str(excinfo.value).startswith("jobs/x/profile.json: ")
    assert said in str(excinfo.value)


def test_a_measured_profile_needs_every_type_and_step_times_that_grow() -> None:
    from dataclasses import replace

    from sia_slurm.protocol.observation import Observation
    from sia_slurm.protocol.profile_json import measured_problems

    for app in PROFILES.apps:  # the shipped profiles are measured ones, and sound
        assert measured_problems(PROFILES.app(app), PROFILES.app(app).gpu_types) == [], app
    profile = PROFILES.app("cifar10")
    missing = measured_problems(profile, (*profile.gpu_types, "h100"))
    assert missing == ["h100: not measured"]
    t4 = profile.gpu_types[0]
    points = sorted(profile.seed[t4], key=lambda o: o.local_bsz)
    faster = Observation(1, 1, points[-1].local_bsz * 2, points[0].step_time / 2, 0.0)
    broken = replace(
        profile,
        seed={**profile.seed, t4: (*points, faster)},
        max_local_bsz={**profile.max_local_bsz, t4: faster.local_bsz},
    )
    (said,) = measured_problems(broken, profile.gpu_types)
    assert said.startswith(f"{t4}: ") and said.endswith("step times must grow with the batch")


def test_a_measured_step_under_half_a_smaller_batchs_is_refused() -> None:
    from sia_slurm.protocol.profile_json import _shrinking

    points = [(8, 0.10), (16, 0.20), (32, 0.05), (64, 0.40)]
    assert "0.05 s at a per-GPU batch of 32, under half the 0.2 s" in _shrinking(points)
    assert _shrinking([(8, 0.10), (16, 0.20), (32, 0.12), (64, 0.40)]) == ""  # noise: kept


def test_the_batches_a_larger_one_undercuts_are_those_the_rule_refuses() -> None:
    """The demo's transformer on t4 under the load of ten jobs (2026-12-02): its sweep's first
    batch 35.6 ms, the next 17.0 ms, refused. Without the undercut batch the rest passes;
    a point within the noise, or a larger batch merely slower, is kept; a larger batch that
    undercuts several smaller ones drops each of them."""
    from sia_slurm.protocol.profile_json import _shrinking, undercut_batches

    demo = [(2, 0.03557), (4, 0.01698), (8, 0.0190), (16, 0.0231)]
    assert _shrinking(demo) != ""
    assert undercut_batches(demo) == {2}
    assert _shrinking([p for p in demo if p[0] not in undercut_batches(demo)]) == ""
    assert undercut_batches([(1, 0.005043), (4, 0.002433), (8, 0.002737)]) == set()  # noise
    assert undercut_batches([(8, 0.10), (16, 0.20), (32, 0.12)]) == set()
    spike = [(8, 0.30), (16, 0.32), (32, 0.10), (64, 0.15)]
    assert undercut_batches(spike) == {8, 16}
    assert _shrinking([p for p in spike if p[0] not in undercut_batches(spike)]) == ""
    assert undercut_batches([]) == set()


@given(st.lists(st.floats(0.0005, 2.0), min_size=1, max_size=12))
def test_what_the_job_side_keeps_always_passes_the_controllers_rule(times: list[float]) -> None:
    """Any sweep's step times (per batch 1, 2, 4, ...): the points left after the undercut
    batches are dropped pass the growth rule, the largest batch is never dropped, and a
    sweep the rule already passes loses nothing."""
    from sia_slurm.protocol.profile_json import _shrinking, undercut_batches

    points = [(2**i, t) for i, t in enumerate(times)]
    dropped = undercut_batches(points)
    assert _shrinking([p for p in points if p[0] not in dropped]) == ""
    assert points[-1][0] not in dropped
    if _shrinking(points) == "":
        assert dropped == set()


def test_steps_of_a_few_milliseconds_may_shrink_by_the_timing_noise() -> None:
    """A transformer's sweep on a100 at load 20 (a live test's run): half of batch 1's step at
    batch 4, but 2.6 ms apart, within a busy machine's timing noise: kept. Halved 12 ms
    apart is not noise."""
    from sia_slurm.protocol.profile_json import _shrinking

    measured = [(1, 0.005043), (2, 0.004995), (4, 0.002433), (8, 0.002737), (16, 0.007866)]
    assert _shrinking(measured) == ""
    assert "0.01 s at a per-GPU batch of 4, under half the 0.022 s" in _shrinking(
        [(1, 0.022), (4, 0.010)]
    )
