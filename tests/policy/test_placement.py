"""Placement: every placement is valid, no GPU is double-booked, unchanged jobs stay put."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sia_slurm.core import Configuration, JobKind
from sia_slurm.policy.base import (
    Allocation,
    ClusterView,
    JobAllocation,
    JobView,
    NodeShare,
    NodeView,
)
from sia_slurm.policy.configs import configuration_set, shape_for, type_configurations
from sia_slurm.policy.placement import Placement, place
from tests.estimators import TableEstimator, make_cluster

ESTIMATOR = TableEstimator()


def share(config: Configuration, goodput: float = 1.0) -> JobAllocation:
    return JobAllocation(config, batch_size=32, local_bsz=32, accum_steps=0, goodput=goodput)


def assert_valid(cluster: ClusterView, allocation: Allocation, placement: Placement) -> None:
    nodes = {node.name: node for node in cluster.nodes}
    used = dict.fromkeys(nodes, 0)
    for job_id, shares in placement.assignments.items():
        config = allocation.jobs[job_id].config
        assert len({s.node for s in shares}) == len(shares) == config.nodes
        assert sum(s.gpus for s in shares) == config.gpus
        for s in shares:
            assert nodes[s.node].gpu_type == config.gpu_type
            assert s.gpus >= 1
            used[s.node] += s.gpus
    for name, count in used.items():
        assert count <= nodes[name].usable_gpus, f"{name} double-booked"
    assert set(placement.assignments) | set(placement.unplaced) == set(allocation.jobs)
    assert not set(placement.assignments) & set(placement.unplaced)


@st.composite
def clusters(draw) -> ClusterView:
    nodes = []
    for t in range(draw(st.integers(1, 3))):
        gpus = draw(st.sampled_from([1, 2, 4, 6, 8]))
        for i in range(draw(st.integers(1, 4))):
            usable = draw(st.one_of(st.just(gpus), st.integers(0, gpus)))
            nodes.append(NodeView(f"t{t}-{i}", f"t{t}", gpus, usable))
    return ClusterView(tuple(nodes))


@st.composite
def scenarios(draw):
    """A cluster, random configurations (some jobs already running somewhere), job views."""
    cluster = draw(clusters())
    sets = [c for configs in configuration_set(cluster).values() for c in configs]
    allocation: dict[str, JobAllocation] = {}
    views = []
    for i in range(draw(st.integers(0, 12))) if sets else []:
        config = draw(st.sampled_from(sets))
        allocation[f"j{i}"] = share(config, draw(st.floats(0.1, 100)))
        placement: tuple[NodeShare, ...] = ()
        if draw(st.booleans()):
            candidates = [n.name for n in cluster.nodes if n.gpu_type == config.gpu_type]
            chosen = draw(st.permutations(candidates))[: config.nodes]
            if len(chosen) == config.nodes:
                base, extra = divmod(config.gpus, config.nodes)
                placement = tuple(NodeShare(n, base + (k < extra)) for k, n in enumerate(chosen))
        kind = draw(st.sampled_from([JobKind.ADAPTIVE, JobKind.PINNED]))
        views.append(
            JobView(
                f"j{i}", kind, ESTIMATOR, current=config if placement else None, placement=placement
            )
        )
    return cluster, Allocation(allocation), views


@pytest.mark.heavy
@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_every_placement_is_valid(scenario):
    cluster, allocation, views = scenario
    assert_valid(cluster, allocation, place(cluster, allocation, views))


@st.composite
def sia_shaped_allocations(draw):
    """Configurations from Sia's set whose GPU counts fit each type's capacity, on fully usable
    nodes with power-of-two GPU counts: the set's claim is that these always place."""
    spec = [
        (f"t{t}", draw(st.integers(1, 4)), draw(st.sampled_from([1, 2, 4, 8])))
        for t in range(draw(st.integers(1, 3)))
    ]
    cluster = make_cluster(spec)
    jobs: dict[str, JobAllocation] = {}
    for gpu_type, view in cluster.types.items():
        free = view.capacity
        for config in draw(st.lists(st.sampled_from(type_configurations(view)), max_size=10)):
            if config.gpus <= free:
                free -= config.gpus
                jobs[f"{gpu_type}-job{len(jobs)}"] = share(config)
    return cluster, Allocation(jobs)


@pytest.mark.heavy
@settings(max_examples=300, deadline=None)
@given(sia_shaped_allocations())
def test_sia_configuration_sets_always_place(scenario):
    cluster, allocation = scenario
    placement = place(cluster, allocation, [])
    assert_valid(cluster, allocation, placement)
    assert placement.unplaced == ()


def test_unchanged_jobs_keep_their_nodes_and_new_jobs_pack_fullest_first():
    cluster = make_cluster([("A", 3, 4)])
    running = Configuration("A", 1, 2)
    view = JobView(
        "old", JobKind.ADAPTIVE, ESTIMATOR, current=running, placement=(NodeShare("A-2", 2),)
    )
    allocation = Allocation({"old": share(running), "new": share(Configuration("A", 1, 2))})
    placement = place(cluster, allocation, [view])
    assert placement.assignments["old"] == (NodeShare("A-2", 2),)
    assert placement.assignments["new"] == (NodeShare("A-2", 2),)  # fullest node first


def test_fragmentation_evicts_the_lowest_goodput_job_and_moves_it():
    cluster = make_cluster([("A", 2, 4)])
    half = Configuration("A", 1, 2)
    views = [
        JobView("a", JobKind.ADAPTIVE, ESTIMATOR, current=half, placement=(NodeShare("A-0", 2),)),
        JobView("b", JobKind.ADAPTIVE, ESTIMATOR, current=half, placement=(NodeShare("A-1", 2),)),
    ]
    allocation = Allocation(
        {"a": share(half, 5.0), "b": share(half, 1.0), "c": share(Configuration("A", 1, 4))}
    )
    placement = place(cluster, allocation, views)
    assert_valid(cluster, allocation, placement)
    assert placement.moved == ("b",)
    assert placement.unplaced == ()
    assert placement.assignments["a"] == (NodeShare("A-0", 2),)
    assert placement.assignments["c"] == (NodeShare("A-1", 4),)


def test_an_eviction_that_strands_a_victim_moves_nothing():
    """Evicting ``b`` would make room for ``c`` but leave ``b`` nowhere to go: nothing moves,
    ``c`` waits (no cascade of evictions, no job pays a restart for nothing)."""
    cluster = make_cluster([("A", 2, 4)])
    three = Configuration("A", 1, 3)
    views = [
        JobView("a", JobKind.ADAPTIVE, ESTIMATOR, current=three, placement=(NodeShare("A-0", 3),)),
        JobView("b", JobKind.ADAPTIVE, ESTIMATOR, current=three, placement=(NodeShare("A-1", 3),)),
    ]
    allocation = Allocation(
        {"a": share(three, 5.0), "b": share(three, 1.0), "c": share(Configuration("A", 1, 4))}
    )
    placement = place(cluster, allocation, views)
    assert_valid(cluster, allocation, placement)
    assert placement.unplaced == ("c",)
    assert placement.moved == ()
    assert placement.assignments["a"] == (NodeShare("A-0", 3),)
    assert placement.assignments["b"] == (NodeShare("A-1", 3),)


def test_pinned_jobs_are_not_evicted():
    cluster = make_cluster([("A", 2, 4)])
    half = Configuration("A", 1, 2)
    views = [
        JobView("a", JobKind.PINNED, ESTIMATOR, current=half, placement=(NodeShare("A-0", 2),)),
        JobView("b", JobKind.PINNED, ESTIMATOR, current=half, placement=(NodeShare("A-1", 2),)),
    ]
    allocation = Allocation(
        {"a": share(half), "b": share(half), "c": share(Configuration("A", 1, 4))}
    )
    placement = place(cluster, allocation, views)
    assert placement.unplaced == ("c",)
    assert placement.moved == ()


def test_unusable_nodes_are_respected():
    cluster = ClusterView(
        (NodeView("n0", "A", 4, 0), NodeView("n1", "A", 4, 1), NodeView("n2", "A", 4, 4))
    )
    allocation = Allocation(
        {"x": share(Configuration("A", 1, 2)), "y": share(Configuration("A", 1, 1))}
    )
    placement = place(cluster, allocation, [])
    assert placement.assignments["x"] == (NodeShare("n2", 2),)
    assert placement.assignments["y"] == (NodeShare("n1", 1),)


def test_configuration_sets_follow_the_reference():
    cluster = make_cluster([("A", 3, 8), ("B", 2, 6)])
    sets = configuration_set(cluster)
    assert [(c.nodes, c.gpus) for c in sets["A"]] == [
        (1, 1),
        (1, 2),
        (1, 4),
        (1, 8),
        (2, 16),
        (3, 24),
    ]
    # 6 GPUs per node: three virtual nodes of 2 GPUs each
    assert [c.gpus for c in sets["B"]] == [1, 2, 4, 6, 8, 10, 12]
    assert all(c.nodes == 1 for c in sets["B"] if c.gpus <= 6)
    down = ClusterView((NodeView("a0", "A", 8, 8), NodeView("a1", "A", 8, 0)))
    assert max(c.gpus for c in configuration_set(down)["A"]) == 8
    assert shape_for(cluster.types["A"], 12) == Configuration("A", 2, 12)


def _fragmented() -> tuple[ClusterView, list[JobView], Allocation]:
    """Two 4-GPU nodes: ``a`` keeps 3 on A-0, ``c`` keeps 2 on A-1, and ``b`` (1 GPU on A-1)
    is allocated 4: no node has 4 free, and neither eviction leaves its victim a place."""
    cluster = make_cluster([("A", 2, 4)])
    three, two, one = (Configuration("A", 1, n) for n in (3, 2, 1))
    views = [
        JobView("a", JobKind.ADAPTIVE, ESTIMATOR, current=three, placement=(NodeShare("A-0", 3),)),
        JobView("b", JobKind.ADAPTIVE, ESTIMATOR, current=one, placement=(NodeShare("A-1", 1),)),
        JobView("c", JobKind.ADAPTIVE, ESTIMATOR, current=two, placement=(NodeShare("A-1", 2),)),
    ]
    allocation = Allocation(
        {"a": share(three, 5.0), "b": share(Configuration("A", 1, 4)), "c": share(two, 5.0)}
    )
    return cluster, views, allocation


def test_a_job_with_no_room_and_no_fallback_is_left_unplaced():
    cluster, views, allocation = _fragmented()
    placement = place(cluster, allocation, views)
    assert placement.unplaced == ("b",)
    assert placement.replaced == {}


def test_a_job_with_no_room_takes_its_first_fallback_that_fits():
    """Sia's repair (``Allocation.fallbacks``): ``b`` cannot grow to 4, and its fallbacks are
    tried in order: 3 GPUs fit nowhere, its current 1 GPU fits where it is (no restart)."""
    cluster, views, allocation = _fragmented()
    current = share(Configuration("A", 1, 1))
    fallbacks = {"b": (share(Configuration("A", 1, 3)), current, share(Configuration("A", 1, 2)))}
    placement = place(cluster, replace(allocation, fallbacks=fallbacks), views)
    assert placement.unplaced == ()
    assert placement.replaced == {"b": current}
    assert placement.assignments["b"] == (NodeShare("A-1", 1),)
    assert placement.assignments["a"] == (NodeShare("A-0", 3),)
    assert placement.assignments["c"] == (NodeShare("A-1", 2),)


def test_a_shape_with_no_room_is_searched_once_though_its_jobs_take_fallbacks(monkeypatch):
    """Ten jobs asking for 4 GPUs of A, whose nodes have 1 free GPU each: the first search
    and eviction find no room; each job then takes its 1-GPU fallback, which only takes free
    GPUs, so the nine after it are not searched again (at 16,384 GPUs hundreds of such misses
    each searched and evicted again, 2 s a round), and the outcome is the same."""
    import sia_slurm.policy.placement as placement_module

    cluster = make_cluster([("A", 10, 1)])
    allocation = Allocation(
        {f"j{i}": share(Configuration("A", 1, 4)) for i in range(10)},
        fallbacks={f"j{i}": (share(Configuration("A", 1, 1)),) for i in range(10)},
    )
    calls = []
    plan = placement_module.eviction_plan

    def counted(*args, **kwargs):
        calls.append(args[1])
        return plan(*args, **kwargs)

    monkeypatch.setattr(placement_module, "eviction_plan", counted)
    placement = place(cluster, allocation, [])
    assert len(calls) == 1
    assert placement.unplaced == () and len(placement.replaced) == 10
    assert sorted(s.node for shares in placement.assignments.values() for s in shares) == sorted(
        node.name for node in cluster.nodes
    )


def test_a_fallback_that_is_not_the_current_configuration_is_packed():
    cluster, views, allocation = _fragmented()
    two = share(Configuration("A", 1, 2))
    placement = place(cluster, replace(allocation, fallbacks={"b": (two,)}), views)
    assert placement.replaced == {"b": two}
    assert placement.assignments["b"] == (NodeShare("A-1", 2),)  # A-0 has 1 free, A-1 has 2


def test_a_profiling_job_is_not_evicted():
    """A job measuring its profile on one GPU (``JobView.profiling``) keeps its node: evicted,
    it would start its sweep on that type again (seen in the simulator once jobs could grow
    4x: a profiling run moved between two A100 nodes and measured twice)."""
    cluster = make_cluster([("A", 2, 4)])
    one, three = Configuration("A", 1, 1), Configuration("A", 1, 3)
    # ``a`` is pinned: only ``p`` could make room for ``c``
    views = [
        JobView("p", JobKind.ADAPTIVE, ESTIMATOR, current=one,
                placement=(NodeShare("A-0", 1),), profiling=True),
        JobView("a", JobKind.PINNED, ESTIMATOR, current=three,
                placement=(NodeShare("A-1", 3),)),
    ]  # fmt: skip
    allocation = Allocation(
        {"p": share(one, 0.1), "a": share(three, 5.0), "c": share(Configuration("A", 1, 4))}
    )
    placement = place(cluster, allocation, views)
    assert placement.unplaced == ("c",) and placement.moved == ()
    unprofiled = [replace(views[0], profiling=False), views[1]]
    moved = place(cluster, allocation, unprofiled)
    assert moved.moved == ("p",) and moved.unplaced == ()
