"""How the controller's memory is kept (sia_slurm/state/memory.py), with plain values only: no
controller is built here (tests/service/test_controller_memory.py restores one)."""

from __future__ import annotations

import base64
import os
import pickle
from types import MappingProxyType

import numpy as np
import pytest

from sia_slurm import __version__
from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot
from sia_slurm.core import NodeView
from sia_slurm.protocol import JobSpec, MetricsReport
from sia_slurm.state import MEMORY_FORMAT, ControllerMemory, JobMemory, RestoreNote, Store
from sia_slurm.state.memory import (
    controller_row,
    dump_pickle,
    load_pickle,
    profile_document,
    profiling_restarts,
    saved_allocation,
    saved_profilings,
    saved_usage,
    stored_reports,
    write_memory,
)

NODES = (NodeView("t4-1", "t4", 4, 4),)
# dump_allocation({"j1": MappingProxyType({"a100": 60.0}), "order": ("j1", "j2"), "n": 7}) as
# sia-slurm wrote it before issue 36 split the memory (sia_slurm/state/memory.py, which the
# pickle names for its mapping proxies): a database saved then must still load.
OLD_BLOB = base64.b64decode(
    "gAWVZAAAAAAAAAB9lCiMAmoxlIwWc2lhX3NsdXJtLnN0YXRlLm1lbW9yeZSMDl9tYXBwaW5nX3Byb3h5lJOUfZSMBGEx"
    "MDCUR0BOAAAAAAAAc4WUUpSMBW9yZGVylGgBjAJqMpSGlIwBbpRLB3Uu"
)


def report(sia_id: str, step: float, local_bsz: int = 128) -> MetricsReport:
    return MetricsReport(sia_id, 0.0, "t4", 1, 1, local_bsz, 0, step, 0.0, 1.0, 4.0)


def memory(jobs: dict[str, JobMemory], previous: object = None) -> ControllerMemory:
    return ControllerMemory(3, jobs, {"used": {}}, [{"key": "k"}], previous)


def recorded(store: Store, *ids: str) -> None:
    snapshot = ClusterSnapshot(
        0.0, NODES, tuple(JobSnapshot(JobSpec(i, "cifar10"), JobPhase.PENDING) for i in ids)
    )
    with store.transaction():
        store.record_jobs(snapshot)


def test_a_pickle_of_the_old_module_path_still_loads() -> None:
    assert b"sia_slurm.state.memory" in OLD_BLOB and b"_mapping_proxy" in OLD_BLOB
    loaded = load_pickle(OLD_BLOB)
    assert loaded == {"j1": {"a100": 60.0}, "order": ("j1", "j2"), "n": 7}
    assert isinstance(loaded["j1"], MappingProxyType)
    assert dump_pickle(loaded) == OLD_BLOB, "the same bytes as before the split"


def test_pickles_round_trip_and_refuse_foreign_callables() -> None:
    value = {"a": MappingProxyType({"b": np.array([[2, 0]])})}
    loaded = load_pickle(dump_pickle(value))
    assert np.array_equal(loaded["a"]["b"], value["a"]["b"])
    with pytest.raises(pickle.UnpicklingError, match="refusing to load"):
        load_pickle(pickle.dumps(os.system))


def test_memory_is_written_and_read_back_as_plain_values(store: Store) -> None:
    assert controller_row(store) is None
    recorded(store, "j1", "j2")
    jobs = {
        "j1": JobMemory(2, 5, 12.5, {"format": 1, "app": "mine"}, 1),
        "j2": JobMemory(0, 0, float("-inf"), None, 0),
    }
    reports = [report("j1", 0.3), report("j1", 0.4, 64), report("stranger", 0.3)]
    with store.transaction():
        write_memory(store, memory(jobs, {"state": 1}), "gavel", reports, 0, 9.0)
    row = controller_row(store)
    assert row is not None and row["round_index"] == 3 and row["format"] == MEMORY_FORMAT
    assert saved_usage(store) == {"used": {}} and saved_profilings(store) == [{"key": "k"}]
    assert profile_document(store, "j1") == {"format": 1, "app": "mine"}
    assert profile_document(store, "j2") is None
    assert (profiling_restarts(store, "j1"), profiling_restarts(store, "j2")) == (1, 0)
    (j1, j2) = store.jobs()
    assert (j1.remembered, j1.admitted_round, j1.max_gpus_seen, j1.reports_seen) == (True, 0, 2, 5)
    assert j1.last_report_time == 12.5 and j2.last_report_time is None
    notes: list[RestoreNote] = []
    kept = stored_reports(store, notes)
    assert notes == [] and set(kept) == {"j1"}
    assert [(r, m.local_bsz) for r, m in kept["j1"]] == [(0, 128), (0, 64)]
    saved, why = saved_allocation(store, row, "gavel")
    assert why == "" and saved is not None
    assert (saved.format, saved.document, saved.pickled) == (MEMORY_FORMAT, {"state": 1}, None)
    assert row["allocation"] == '{"state": 1}', "stored as the JSON text, not a pickle"
    assert saved_allocation(store, row, "sia") == (
        None, "saved by policy 'gavel', the configured policy is 'sia'"
    )  # fmt: skip
    with store.transaction():  # j1 forgotten: its reports and documents go
        write_memory(store, memory({"j2": jobs["j2"]}), "gavel", [], 1, 10.0)
    assert stored_reports(store, notes) == {} and profile_document(store, "j1") is None
    assert saved_allocation(store, controller_row(store), "gavel") == (None, "")


def test_an_unreadable_report_is_noted_and_left_out(store: Store) -> None:
    recorded(store, "j1")
    with store.transaction():
        write_memory(
            store,
            memory({"j1": JobMemory(1, 1, 0.0, None, 0)}),
            "gavel",
            [report("j1", 0.3)],
            0,
            0.0,
        )
    store.conn.execute("UPDATE reports SET report = '{}'")
    notes: list[RestoreNote] = []
    assert stored_reports(store, notes) == {}
    assert [n.what for n in notes] == ["report of j1"]


def test_a_format_3_document_outlives_a_version_change(store: Store) -> None:
    """The JSON document is read whatever sia-slurm wrote it (only the policy must match)."""
    recorded(store, "j1")
    with store.transaction():
        write_memory(store, memory({}, {"state": 1}), "gavel", [], 0, 0.0)
    store.conn.execute("UPDATE controller SET sia_version = '0.0.1'")
    saved, why = saved_allocation(store, controller_row(store), "gavel")
    assert why == "" and saved is not None and saved.document == {"state": 1}
    assert saved.sia_version == "0.0.1"
    store.conn.execute("UPDATE controller SET allocation = '{\"state\": '")
    saved, why = saved_allocation(store, controller_row(store), "gavel")
    assert saved is None and why.startswith("cannot be read (memory format 3: Expecting value")


def format_2_row(store: Store, blob: bytes, version: str = "0.0.1") -> None:
    """The controller row as sia-slurm wrote it in memory format 2: the pickle in the BLOB."""
    recorded(store, "j1")
    with store.transaction():
        write_memory(store, memory({}, {"state": 1}), "gavel", [], 0, 0.0)
    store.conn.execute(
        "UPDATE controller SET format = 2, sia_version = ?, allocation = ?", (version, blob)
    )


def test_a_format_2_pickle_is_read_whatever_version_wrote_it(store: Store) -> None:
    format_2_row(store, dump_pickle({"state": 1}))
    saved, why = saved_allocation(store, controller_row(store), "gavel")
    assert why == "" and saved is not None and saved.document is None
    assert saved.pickled is not None and load_pickle(saved.pickled) == {"state": 1}
    assert (saved.format, saved.sia_version) == (2, "0.0.1")


def test_a_format_2_pickle_is_not_read_from_a_file_others_may_write(store: Store) -> None:
    format_2_row(store, b"junk")
    os.chmod(store.path, 0o664)
    saved, why = saved_allocation(store, controller_row(store), "gavel")
    assert saved is None and why.endswith("is writable by group or others (chmod 600 it)")


def test_format_1_and_newer_formats_are_not_read(store: Store) -> None:
    format_2_row(store, b"junk")
    store.conn.execute("UPDATE controller SET format = 1")
    saved, why = saved_allocation(store, controller_row(store), "gavel")
    assert saved is None and why == (
        "saved in memory format 1 by sia-slurm 0.0.1, which is not converted (its Gavel state "
        "counted time run, not time credited); the policy starts fresh"
    )
    store.conn.execute(
        "UPDATE controller SET format = ?, sia_version = '9.0'", (MEMORY_FORMAT + 1,)
    )
    saved, why = saved_allocation(store, controller_row(store), "sia")  # before the policy
    assert saved is None and why == (
        f"saved in memory format {MEMORY_FORMAT + 1} by a newer sia-slurm (9.0); this one "
        f"({__version__}) reads up to {MEMORY_FORMAT}, so the policy starts fresh. To keep it, "
        "run that release, or restore the database copy taken before the upgrade "
        "(docs/operations.md, Upgrading)"
    )
