"""The previous allocation as a JSON document (memory format 3, policy/allocation_json.py): every
policy's allocation round-trips through the text, the decoded one steers the policy's
next round exactly as the original does, and a damaged document is refused by field name."""

from __future__ import annotations

import copy
import dataclasses
import json
from types import MappingProxyType
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_slurm.core import Configuration
from sia_slurm.policy.allocation_json import (
    FORMAT,
    allocation_from_json,
    allocation_to_json,
    legacy_document,
    state_from_json,
    state_to_json,
)
from sia_slurm.policy.base import (
    Allocation,
    JobAllocation,
    NodeShare,
    PolicyInput,
    SolveInfo,
)
from sia_slurm.policy.gavel import GavelState
from sia_slurm.policy.pollux import PolluxPolicyConfig, PolluxState
from sia_slurm.policy.registry import POLICIES, make_policy
from sia_slurm.state import MEMORY_FORMAT
from sia_slurm.state.memory import dump_pickle, load_pickle
from tests.estimators import make_cluster
from tests.policy.test_baselines import pollux_jobs

CLUSTER = make_cluster([("A", 2, 4), ("B", 1, 8)])


def through_text(allocation: Allocation) -> Allocation:
    """What a later process reads: the document written as JSON text and parsed back."""
    text = json.dumps(allocation_to_json(allocation))
    return allocation_from_json(json.loads(text))


def assert_same(loaded: Allocation, original: Allocation) -> None:
    assert loaded.jobs == original.jobs and loaded.node_hints == original.node_hints
    assert list(loaded.jobs) == list(original.jobs), "in the allocation's order"
    assert (loaded.time, loaded.round_index, loaded.info, loaded.hints_move_jobs) == (
        original.time, original.round_index, original.info, original.hints_move_jobs,
    )  # fmt: skip
    assert type(loaded.state) is type(original.state)
    if isinstance(original.state, PolluxState):
        assert isinstance(loaded.state, PolluxState)
        assert loaded.state.job_ids == original.state.job_ids
        assert loaded.state.node_names == original.state.node_names
        assert loaded.state.replicas.dtype == original.state.replicas.dtype
        assert np.array_equal(loaded.state.replicas, original.state.replicas)
    else:
        assert loaded.state == original.state


def test_the_codec_writes_the_memory_format_the_store_records() -> None:
    assert FORMAT == MEMORY_FORMAT == 3


def rounds(name: str, count: int = 3) -> list[tuple[PolicyInput, Allocation]]:
    """``count`` rounds of policy ``name`` on a small cluster, each fed the previous one."""
    policy = make_policy(name, PolluxPolicyConfig(generations=10) if name == "pollux" else None)
    jobs = tuple(dataclasses.replace(j, requested_gpus=2) for j in pollux_jobs(6, 2))
    previous: Allocation | None = None
    made = []
    for index in range(count):
        policy_input = PolicyInput(CLUSTER, jobs[: 4 + index], previous, 60.0 * index, index)
        previous = policy.solve(policy_input)
        made.append((policy_input, previous))
    return made


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policys_real_allocation_round_trips_and_steers_alike(name: str) -> None:
    """Each policy's own allocations, round after round: the decoded one equals the original,
    and the next round fed the decoded one decides exactly as fed the original."""
    made = rounds(name)
    for _, allocation in made:
        assert_same(through_text(allocation), allocation)
    policy = make_policy(name, PolluxPolicyConfig(generations=10) if name == "pollux" else None)
    last_input, last = made[-1]
    jobs = (*last_input.jobs, *pollux_jobs(7, 2)[6:])
    following = [PolicyInput(CLUSTER, jobs, prev, 240.0, 4) for prev in (last, through_text(last))]
    original, decoded = (policy.solve(p) for p in following)
    assert original.jobs == decoded.jobs and original.node_hints == decoded.node_hints
    assert allocation_to_json(original)["state"] == allocation_to_json(decoded)["state"]
    kinds = {allocation_to_json(a)["state"]["kind"] for _, a in made}
    assert kinds == {{"gavel": "gavel", "pollux": "pollux"}.get(name, "none")}


def share(gpu_type: str = "a100", nodes: int = 1, gpus: int = 2) -> JobAllocation:
    return JobAllocation(Configuration(gpu_type, nodes, gpus), 256, 128, 1, 1234.5, 1500.25)


STATES: dict[str, Any] = {
    "none": None,
    "gavel": GavelState(
        MappingProxyType({"j1": MappingProxyType({"a100": 60.0, "t4": 30.5})}),
        120.0,
        MappingProxyType({"a100": 600.0, "t4": 30.5}),
    ),
    "pollux": PolluxState(("j1", "j2"), ("a100-1", "t4-1"), np.array([[2, 0], [0, 4]])),
}


@pytest.mark.parametrize("kind", sorted(STATES))
def test_hand_built_allocations_of_every_state_kind_round_trip(kind: str) -> None:
    original = Allocation(
        {"j1": share(), "j2": share("t4", 1, 4)}, 60.0, 7, STATES[kind],
        SolveInfo("time-limit", 0.25, "HiGHS: time limit"),
        {"j1": (NodeShare("a100-1", 2),), "j2": (NodeShare("t4-1", 4),)}, kind == "gavel",
    )  # fmt: skip
    loaded = through_text(original)
    assert_same(loaded, original)
    assert allocation_to_json(original)["state"]["kind"] == kind
    if isinstance(loaded.state, GavelState):  # read-only, as the live policy's
        assert isinstance(loaded.state.received, MappingProxyType)
        assert isinstance(loaded.state.received["j1"], MappingProxyType)
        assert isinstance(loaded.state.type_time, MappingProxyType)


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=8)
seconds = st.floats(allow_nan=False, allow_infinity=False, width=64)


@settings(max_examples=60, deadline=None)
@given(
    received=st.dictionaries(names, st.dictionaries(names, seconds, max_size=3), max_size=4),
    type_time=st.dictionaries(names, seconds, max_size=3),
    round_start=seconds,
)
def test_any_gavel_state_round_trips(
    received: dict[str, dict[str, float]], type_time: dict[str, float], round_start: float
) -> None:
    state = GavelState(received, round_start, type_time)
    text = json.dumps(state_to_json(state))
    assert state_from_json(json.loads(text)) == state


@settings(max_examples=60, deadline=None)
@given(
    shape=st.tuples(st.integers(0, 5), st.integers(0, 5)),
    seed=st.integers(0, 2**32 - 1),
)
def test_any_pollux_state_round_trips(shape: tuple[int, int], seed: int) -> None:
    replicas = np.random.default_rng(seed).integers(0, 9, shape).astype(np.int64)
    state = PolluxState(
        tuple(f"j{i}" for i in range(shape[0])), tuple(f"n{i}" for i in range(shape[1])), replicas
    )
    loaded = state_from_json(json.loads(json.dumps(state_to_json(state))))
    assert isinstance(loaded, PolluxState) and loaded.job_ids == state.job_ids
    assert loaded.replicas.shape == shape and np.array_equal(loaded.replicas, replicas)


def document() -> dict[str, Any]:
    pollux = STATES["pollux"]
    allocation = Allocation(
        {"j1": share()}, 60.0, 7, pollux, node_hints={"j1": (NodeShare("a", 2),)}
    )
    return allocation_to_json(allocation)


def _set(path: str, value: Any) -> dict[str, Any]:
    data = document()
    *parents, last = path.split(".")
    target = data
    for key in parents:
        target = target[int(key)] if isinstance(target, list) else target[key]
    if value is KeyError:
        del target[last]
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], r"^allocation: expected an object, got \[\]"),
        (_set("time", KeyError), r"^allocation: missing time$"),
        (_set("colour", "red"), r"^allocation: unexpected colour; expected time, round_index"),
        (_set("round_index", 7.5), r"^allocation.round_index: expected an integer, got 7.5"),
        (_set("round_index", True), r"^allocation.round_index: expected an integer, got True"),
        (_set("time", "noon"), r"^allocation.time: expected a number, got 'noon'"),
        (_set("jobs.j1.gpus", "two"), r"^allocation.jobs.j1.gpus: expected an integer, got 'two'"),
        (
            _set("jobs.j1.nodes", 3),
            r"^allocation.jobs.j1: expected 1 <= nodes <= gpus, got nodes=3",
        ),
        (_set("jobs.j1.throughput", KeyError), r"^allocation.jobs.j1: missing throughput$"),
        (_set("info.status", None), r"^allocation.info.status: expected a string, got None"),
        (_set("node_hints.j1", [["a"]]), r"^allocation.node_hints.j1\[0\]: expected a \[node"),
        (_set("node_hints.j1.0.1", "2"), r"^allocation.node_hints.j1\[0\]\[1\]: expected an int"),
        (_set("hints_move_jobs", 0), r"^allocation.hints_move_jobs: expected true or false"),
        (_set("state", None), r"^allocation.state: expected an object with a kind, got None"),
        (_set("state.kind", "sia"), r"^allocation.state.kind: expected one of 'none', 'gavel'"),
        (_set("state.extra", 1), r"^allocation.state: unexpected extra; expected kind, job_ids"),
        (_set("state.replicas", [[2, 0]]), r"^allocation.state.replicas: expected 2 rows"),
        (_set("state.replicas.1", [0]), r"^allocation.state.replicas\[1\]: expected 2 GPU counts"),
        (_set("state.replicas.1.1", -1), r"^allocation.state.replicas\[1\]\[1\]: expected >= 0"),
        (_set("state.node_names.0", 5), r"^allocation.state.node_names\[0\]: expected a string"),
    ],
)
def test_a_damaged_document_is_refused_naming_the_field(data: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        allocation_from_json(data)


def test_gavel_state_fields_are_checked() -> None:
    data = state_to_json(STATES["gavel"])
    data["received"]["j1"]["a100"] = "a lot"
    with pytest.raises(ValueError, match=r"^state.received.j1.a100: expected a number"):
        state_from_json(data)


def test_a_state_of_unknown_kind_is_not_written() -> None:
    with pytest.raises(TypeError, match="no JSON encoding for policy state dict"):
        state_to_json({"credits": 1})


def test_a_format_2_pickle_converts_to_the_same_allocation() -> None:
    """What memory format 2 stored (the allocation pickled) reads back as the document of the
    same allocation; one pickled before a field existed reads that field's default."""
    for kind, state in STATES.items():
        original = Allocation({"j1": share()}, 60.0, 7, state, hints_move_jobs=kind == "gavel")
        unpickled = load_pickle(dump_pickle(original))
        assert_same(allocation_from_json(legacy_document(unpickled)), original)
    older = load_pickle(dump_pickle(Allocation({"j1": share()})))
    del older.__dict__["hints_move_jobs"]  # as a pickle made before the field was added
    del older.jobs["j1"].__dict__["throughput"]
    converted = allocation_from_json(legacy_document(older))
    assert converted.hints_move_jobs is False and converted.jobs["j1"].throughput == 0.0
    bare = copy.copy(older)
    del bare.__dict__["jobs"]
    with pytest.raises(ValueError, match=r"^Allocation.jobs: missing from the pickled allocation"):
        legacy_document(bare)
    with pytest.raises(ValueError, match="expected a pickled Allocation, got dict"):
        legacy_document({"jobs": {}})
