"""Databases written by earlier releases, kept as files (tests/fixtures/state/, made by
make_fixture.py there against each release's own code; README.md says which commit made
which), open with today's code: the schema is migrated in place, the jobs and their rows read
back, and the controller continues where that release left it, its previous allocation
included wherever the format can be converted.

Why kept files and not schema text: a database rebuilt from an old ``CREATE TABLE`` shows only
what today's code believes an old release wrote; these are what it did write (its pickles,
its column defaults, its rows).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest

from sia_slurm.config import SiaConfig, load_config
from sia_slurm.policy.allocation_json import allocation_to_json
from sia_slurm.policy.gavel import GavelState
from sia_slurm.policy.pollux import PolluxState
from sia_slurm.service import open_controller
from sia_slurm.service.controller_memory import save_memory
from sia_slurm.state import MEMORY_FORMAT, SCHEMA_VERSION, Store, StoreError
from sia_slurm.state.memory import controller_row
from tests.service.fakes import write_config

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "state"
# name -> (schema version, memory format, policy), as the file says before it is opened.
KEPT = {
    "schema1-memory1-gavel": (1, 1, "gavel"),
    "schema1-memory2-gavel": (1, 2, "gavel"),
    "schema2-memory2-gavel": (2, 2, "gavel"),
    "schema3-memory2-gavel": (3, 2, "gavel"),
    "schema3-memory2-pollux": (3, 2, "pollux"),
    "schema3-memory3-gavel": (3, 3, "gavel"),
    "schema3-memory3-pollux": (3, 3, "pollux"),
    "schema4-memory3-gavel": (4, 3, "gavel"),
    "schema4-memory3-pollux": (4, 3, "pollux"),
}
# make_fixture.py's jobs: the first finished within the rounds, the others run on.
OWNERS = {"fx-short": ("alice", "bio"), "fx-ncf": ("bob", "phys"), "fx-cifar": ("alice", "bio")}
RUNNING = {"fx-ncf", "fx-cifar"}
ROUNDS = 5
STATE = {"gavel": GavelState, "pollux": PolluxState}


def test_every_kept_database_is_listed_and_todays_formats_are_kept() -> None:
    """A release that bumps the schema or the memory format keeps a database of its own here,
    so the next release's test has it."""
    assert {p.stem for p in FIXTURES.glob("*.sqlite")} == set(KEPT)
    assert (SCHEMA_VERSION, MEMORY_FORMAT) in {(s, m) for s, m, _ in KEPT.values()}
    assert {s for s, _, _ in KEPT.values()} == set(range(1, SCHEMA_VERSION + 1))
    assert {m for _, m, _ in KEPT.values()} == set(range(1, MEMORY_FORMAT + 1))


def copied(name: str, tmp_path: Path, policy: str) -> SiaConfig:
    """The fixture copied where a config for ``policy`` keeps its database, owner-only."""
    config = load_config(write_config(tmp_path, policy=policy))
    config.db_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(FIXTURES / f"{name}.sqlite", config.db_path)
    config.db_path.chmod(0o600)
    return config


@pytest.mark.parametrize("name", sorted(KEPT))
def test_a_kept_database_opens_migrated_and_restores_the_controller(
    name: str, tmp_path: Path
) -> None:
    schema, memory_format, policy = KEPT[name]
    config = copied(name, tmp_path, policy)
    with sqlite3.connect(config.db_path) as raw:  # the file is what its name says
        assert raw.execute("PRAGMA user_version").fetchone()[0] == schema
        assert raw.execute("SELECT format, policy FROM controller").fetchone() == (
            memory_format, policy,
        )  # fmt: skip
    raw.close()
    with Store.open(config.db_path) as store:
        assert store.schema_version == SCHEMA_VERSION
        rows = {row.sia_id: row for row in store.jobs()}
        assert set(rows) == set(OWNERS)
        for sia_id, row in rows.items():  # jobs before schema 3 read '' until seen again
            assert (row.user, row.account) == (OWNERS[sia_id] if schema >= 3 else ("", ""))
            assert row.phase == ("running" if sia_id in RUNNING else "done")
            assert row.remembered == (sia_id in RUNNING)
            assert row.spec["sia_id"] == sia_id and len(row.phase_history) >= 2
        last = store.last_round()
        assert last is not None and last.round_index == ROUNDS - 1
        throughputs = {d.throughput for d in store.decisions(last.round_index).values()}
        assert throughputs == {0.0} if schema == 1 else max(throughputs) > 0

        controller, notes = open_controller(config, store)
        assert controller.round_index == ROUNDS
        assert set(controller.jobs) == RUNNING
        assert all(record.reports == ROUNDS - 1 for record in controller.jobs.values())
        assert all(record.max_gpus_seen >= 1 for record in controller.jobs.values())
        previous = controller.previous
        if memory_format == 1:  # not converted: Gavel counted time run, not credited
            assert previous is None
            assert [(n.what, n.reason.split(",")[0]) for n in notes] == [
                ("previous allocation", "saved in memory format 1 by sia-slurm 0.1.0")
            ]
            return
        assert notes == []
        assert previous is not None and previous.round_index == ROUNDS - 1
        assert set(previous.jobs) == RUNNING and isinstance(previous.state, STATE[policy])
        if isinstance(previous.state, GavelState):
            assert set(previous.state.received) == RUNNING and previous.hints_move_jobs
            assert all(seconds > 0 for seconds in previous.state.type_time.values())
        else:
            assert isinstance(previous.state, PolluxState)
            assert set(previous.state.job_ids) == RUNNING
            assert previous.state.replicas.sum() == sum(
                share.config.gpus for share in previous.jobs.values()
            )

        with store.transaction():  # the next save writes today's format
            save_memory(store, controller, policy, [], ROUNDS, 60.0 * ROUNDS)
        row = controller_row(store)
        assert row is not None and row["format"] == MEMORY_FORMAT
        again, notes = open_controller(config, store)
        assert notes == [] and again.previous is not None
        assert allocation_to_json(again.previous) == allocation_to_json(previous)


def test_a_kept_database_under_another_policy_starts_the_policy_fresh(tmp_path: Path) -> None:
    config = copied("schema3-memory2-gavel", tmp_path, "sia")
    with Store.open(config.db_path) as store:
        controller, notes = open_controller(config, store)
    assert controller.previous is None and set(controller.jobs) == RUNNING
    assert [f"{n.what}: {n.reason}" for n in notes] == [
        "previous allocation: saved by policy 'gavel', the configured policy is 'sia'"
    ]


def test_a_memory_format_from_a_newer_release_starts_fresh_saying_what_to_do(
    tmp_path: Path,
) -> None:
    config = copied("schema3-memory3-gavel", tmp_path, "gavel")
    with Store.open(config.db_path) as store:
        store.conn.execute(
            "UPDATE controller SET format = ?, sia_version = '9.0'", (MEMORY_FORMAT + 1,)
        )
        controller, notes = open_controller(config, store)
    assert controller.previous is None and set(controller.jobs) == RUNNING
    (note,) = notes
    assert note.what == "previous allocation"
    assert note.reason.startswith(f"saved in memory format {MEMORY_FORMAT + 1} by a newer sia-")
    assert note.reason.endswith(
        "To keep it, run that release, or restore the database copy taken before the upgrade "
        "(docs/operations.md, Upgrading)"
    )


def test_a_schema_from_a_newer_release_is_refused_untouched(tmp_path: Path) -> None:
    config = copied("schema3-memory3-gavel", tmp_path, "gavel")

    def content() -> tuple[int, list[str]]:
        with sqlite3.connect(config.db_path) as raw:
            kept = raw.execute("PRAGMA user_version").fetchone()[0], list(raw.iterdump())
        raw.close()
        return kept

    with sqlite3.connect(config.db_path) as raw:
        raw.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    raw.close()
    before = content()
    with pytest.raises(StoreError, match=r"a newer release wrote it\. Run that release, or "):
        Store.open(config.db_path)
    assert content() == before and before[0] == SCHEMA_VERSION + 1
