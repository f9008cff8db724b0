"""The measurement of restart time (benchmarks/restart_measure.py): grants from the real state
database (written with the store and journal modules the controller uses), ready lines formatted
by the trainer's own logging format, and their pairing; and restart_time.py's options. No Slurm:
the calibration itself is a benchmark run."""

from __future__ import annotations

import json
import logging
import sqlite3
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # benchmarks/ is a directory of scripts, imported by path
    sys.path.insert(0, str(REPO))

from benchmarks.dev_release import release_problem, slurm_bin_dir  # noqa: E402
from benchmarks.restart_measure import (  # noqa: E402
    Grant,
    GrantDelay,
    ReadyLine,
    RestartTimeError,
    grant_delays,
    measure,
    pair_grants,
    parse_ready_lines,
    read_grants,
    summarize,
    summarize_by_size,
)
from benchmarks.restart_time import parse_options, write_config  # noqa: E402
from sia_slurm.cluster import BatchChoice, Move, Rebatch, Start, Stop  # noqa: E402
from sia_slurm.core import Configuration  # noqa: E402
from sia_slurm.policy.base import NodeShare  # noqa: E402
from sia_slurm.state.journal import SKIPPED, Journal  # noqa: E402
from sia_slurm.state.store import Store  # noqa: E402

# sia_slurm/job/examples/common.py's format, for rank 0; the trainer's logger and prefix.
TRAINER_FORMAT = "%(asctime)s rank0 %(name)s %(levelname)s %(message)s"
T0 = 1_700_000_000.0  # epoch seconds of the first grant
BATCH = BatchChoice(128, 64, 0)


def log_line(when: float, round_index: int, sia_id: str, message: str, rank: int = 0) -> str:
    """A line exactly as the trainer's logging writes it at epoch time ``when`` (local time)."""
    formatter = logging.Formatter(TRAINER_FORMAT.replace("rank0", f"rank{rank}"))
    record = logging.LogRecord(
        "sia_slurm.job.elastic.trainer", logging.INFO, __file__, 1,
        f"[round={round_index} job={sia_id}] {message}", None, None,
    )  # fmt: skip
    record.created = when
    record.msecs = (when - int(when)) * 1000.0
    return formatter.format(record)


def restored(when: float, round_index: int, sia_id: str, rank: int = 0) -> str:
    return log_line(
        when, round_index, sia_id, "restored step 40 (epoch 0, sample 5120 of 8192) from /c/40.pt",
        rank,
    )  # fmt: skip


def scratch(when: float, round_index: int, sia_id: str) -> str:
    return log_line(when, round_index, sia_id, "no checkpoint in /c: starting from scratch")


def journal(db: Path, entries: list[tuple[object, float, str]]) -> None:
    """Journal each ``(action, created, state)`` as the controller does: added, then settled."""
    with Store.open(db) as store:
        log = Journal(store)
        for action, created, state in entries:
            with store.transaction():
                if state == SKIPPED:
                    log.add([action], created, state=SKIPPED)
                    continue
                (entry_id,) = log.add([action], created)
                if state != "pending":
                    log.mark(entry_id, state == "done", state, created + 0.5)


def start(sia_id: str, round_index: int, gpus: int = 2, node: str = "a100-1") -> Start:
    return Start(
        sia_id, round_index, Configuration("a100", 1, gpus), (NodeShare(node, gpus),), BATCH
    )


def move(sia_id: str, round_index: int, gpus: int = 2, node: str = "a100-2") -> Move:
    return Move(
        sia_id, round_index, Configuration("a100", 1, gpus), (NodeShare(node, gpus),), BATCH
    )


# ------------------------------------------------------------------------------------------------
# Ready lines


def test_ready_lines_are_parsed_to_epoch_seconds_with_milliseconds() -> None:
    lines = [
        scratch(T0 + 5.25, 0, "s1-ab"),
        restored(T0 + 30.125, 3, "s1-ab"),
        log_line(T0 + 31, 3, "s1-ab", "rank 0 of 2 on a100 (1 node(s), 2 GPU(s))"),
        log_line(T0 + 32, 3, "s1-ab", "stopped for round 4: checkpoint /c/41.pt, acknowledged"),
        restored(T0 + 33, 3, "s1-ab", rank=1),  # only rank 0 counts
        "srun: error: a100-1: task 0: Terminated",
        "1970-13-45 99:99:99,000 rank0 x INFO [round=1 job=s1-ab] restored step 1",  # no date
    ]
    found = parse_ready_lines(lines)
    assert [(r.sia_id, r.round_index) for r in found] == [("s1-ab", 0), ("s1-ab", 3)]
    assert found[0].time == pytest.approx(T0 + 5.25, abs=1e-6)
    assert found[1].time == pytest.approx(T0 + 30.125, abs=1e-6)


def test_a_prefixed_line_still_counts() -> None:
    """Output of several processes may share the file; a prefix does not hide the line."""
    (found,) = parse_ready_lines(["[default0]:" + restored(T0, 2, "s2-cd")])
    assert (found.sia_id, found.round_index) == ("s2-cd", 2)


# ------------------------------------------------------------------------------------------------
# Grants from the state database


def test_only_done_starts_and_moves_are_grants(tmp_path: Path) -> None:
    db = tmp_path / "sia.db"
    journal(
        db,
        [
            (start("a", 0, gpus=1, node="a100-1"), T0, "done"),
            (start("b", 0), T0 + 0.1, "failed"),
            (start("c", 0), T0 + 0.2, SKIPPED),
            (Rebatch("a", 1, BATCH), T0 + 6, "done"),
            (move("a", 2, gpus=4, node="a100-2"), T0 + 12, "done"),
            (move("c", 2), T0 + 12.1, "pending"),
            (Stop("a", 3), T0 + 18, "done"),
        ],
    )
    assert read_grants(db) == [
        Grant("a", "start", 1, ("a100-1",), 0, T0),
        Grant("a", "move", 4, ("a100-2",), 2, T0 + 12),
    ]


def test_a_missing_database_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(RestartTimeError, match=r"nope\.db: no state database"):
        read_grants(tmp_path / "nope.db")


def test_a_database_without_the_journal_names_the_table(tmp_path: Path) -> None:
    db = tmp_path / "other.db"
    sqlite3.connect(db).execute("CREATE TABLE t (x)").connection.commit()
    with pytest.raises(RestartTimeError, match=r"other\.db: table actions"):
        read_grants(db)


def test_a_bad_payload_names_the_entry_and_the_field(tmp_path: Path) -> None:
    db = tmp_path / "sia.db"
    journal(db, [(start("a", 0), T0, "done"), (move("a", 1), T0 + 6, "done")])
    with sqlite3.connect(db) as conn:
        payload = {"config": {"gpu_type": "a100", "nodes": 1, "gpus": 0}, "placement": []}
        conn.execute("UPDATE actions SET payload = ? WHERE id = 2", (json.dumps(payload),))
        conn.execute("UPDATE actions SET payload = '{}' WHERE id = 1")
    with pytest.raises(RestartTimeError, match=r"sia\.db: actions id 1: payload: expected"):
        read_grants(db)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM actions WHERE id = 1")
    with pytest.raises(RestartTimeError, match=r"actions id 2: payload\.config\.gpus: .* got 0"):
        read_grants(db)


# ------------------------------------------------------------------------------------------------
# Pairing


def grant(kind: str, round_index: int, granted: float, sia_id: str = "a", gpus: int = 2) -> Grant:
    return Grant(sia_id, kind, gpus, ("a100-1",), round_index, granted)


def test_each_grant_takes_the_first_ready_line_of_its_round_before_the_next_grant() -> None:
    grants = [
        grant("start", 0, T0),
        grant("move", 2, T0 + 12),  # stopped again before it trained: unready
        grant("move", 3, T0 + 18),
        grant("move", 9, T0 + 60),  # never trained (cancelled)
        grant("start", 0, T0 + 1, sia_id="b"),
    ]
    ready = [
        ReadyLine("a", 0, T0 + 5),
        ReadyLine("a", 0, T0 + 5.5),  # a second line of the same run: not a second grant's
        ReadyLine("a", 2, T0 + 19),  # the round-2 run, after the round-3 grant: not round 3's
        ReadyLine("a", 3, T0 + 40),
        ReadyLine("a", 3, T0 + 41),
        ReadyLine("b", 0, T0 + 9),
    ]
    delays, unready = pair_grants(grants, ready)
    assert delays == [
        GrantDelay("a", "start", 2, T0, T0 + 5),
        GrantDelay("b", "start", 2, T0 + 1, T0 + 9),
        GrantDelay("a", "move", 2, T0 + 18, T0 + 40),
    ]
    assert [d.seconds for d in delays] == [5.0, 8.0, 22.0]
    assert unready == [grants[1], grants[3]]


def test_a_ready_line_before_the_grant_is_not_its_answer() -> None:
    delays, unready = pair_grants([grant("move", 4, T0 + 30)], [ReadyLine("a", 4, T0 + 29.9)])
    assert (delays, unready) == ([], [grant("move", 4, T0 + 30)])


def test_grant_delays_reads_a_log_appended_across_requeues(tmp_path: Path) -> None:
    """The whole path: the journal, one log per job (two runs appended to one file), a job
    with no log given (ignored) and one whose log was never created (its grant unready)."""
    db = tmp_path / "state" / "sia.db"
    journal(
        db,
        [
            (start("a", 0, gpus=2), T0, "done"),
            (start("other", 0, gpus=1), T0 + 0.2, "done"),
            (start("late", 1, gpus=1), T0 + 6, "done"),
            (move("a", 3, gpus=2), T0 + 18, "done"),
        ],
    )
    log = tmp_path / "out" / "a.out"
    log.parent.mkdir()
    log.write_text(
        "\n".join(
            [
                log_line(T0 + 4, 0, "a", "rank 0 of 2 on a100"),
                scratch(T0 + 7.5, 0, "a"),
                log_line(T0 + 19, 0, "a", "stopped for round 3: checkpoint /c/9.pt, acknowledged"),
                "slurmstepd: error: *** JOB 12 ON a100-1 CANCELLED AT 2023-11-14T22:13:39 ***",
                log_line(T0 + 31, 3, "a", "rank 0 of 2 on a100"),
                restored(T0 + 33.75, 3, "a"),
            ]
        )
        + "\n"
    )
    logs = {"a": log, "late": tmp_path / "out" / "late.out"}
    assert grant_delays(db, logs) == [
        GrantDelay("a", "start", 2, T0, T0 + 7.5),
        GrantDelay("a", "move", 2, T0 + 18, T0 + 33.75),
    ]
    result = measure(db, logs)
    assert [g.sia_id for g in result.unready] == ["late"]
    assert result.missing_logs == (tmp_path / "out" / "late.out",)


def test_an_unreadable_log_names_the_file(tmp_path: Path) -> None:
    db = tmp_path / "sia.db"
    journal(db, [(start("a", 0), T0, "done")])
    (tmp_path / "a.out").mkdir()  # a directory, not a file
    with pytest.raises(RestartTimeError, match=r"a\.out: cannot read the job log"):
        grant_delays(db, {"a": tmp_path / "a.out"})


# ------------------------------------------------------------------------------------------------
# Summaries and options


def test_summaries_per_kind_and_per_size() -> None:
    delays = [
        GrantDelay("a", "start", 1, T0, T0 + 4),
        GrantDelay("a", "move", 1, T0 + 10, T0 + 30),
        GrantDelay("a", "move", 1, T0 + 40, T0 + 52),
        GrantDelay("b", "start", 4, T0, T0 + 8),
        GrantDelay("b", "move", 4, T0 + 10, T0 + 37),
    ]
    assert summarize(delays) == {
        "move": {"count": 3, "mean_s": pytest.approx(59 / 3), "median_s": 20.0, "max_s": 27.0},
        "start": {"count": 2, "mean_s": 6.0, "median_s": 6.0, "max_s": 8.0},
    }
    by_size = summarize_by_size(delays)
    assert list(by_size) == [1, 4]
    assert by_size[1]["move"] == {"count": 2, "mean_s": 16.0, "median_s": 16.0, "max_s": 20.0}
    assert by_size[4]["start"]["count"] == 1
    assert summarize([]) == {}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "1,x"], "--sizes: expected integers"),
        (["--sizes", "3"], "--sizes: each size must be 1, 2 or 4"),
        (["--moves", "-1"], "--moves: expected 0 or more"),
        (["--round-s", "0"], "--round-s: expected a positive number"),
        (["--cred-expire", "2"], "--cred-expire: expected 5..3600"),
    ],
)
def test_bad_options_name_the_option(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_options(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_default_options() -> None:
    options = parse_options([])
    assert (options.sizes, options.moves, options.round_s, options.cred_expire) == (
        (1, 2, 4),
        2,
        6.0,
        5,
    )
    assert options.port_base == 19817 and options.directory == Path("/tmp/sia-restart")
    assert options.slurm == "system"


def test_slurm_option_chooses_a_roots_release() -> None:
    assert parse_options(["--slurm", "24.11"]).slurm == "24.11"
    assert parse_options(["--slurm", "26.05", "--dir", "/home/x/restart"]).slurm == "26.05"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--slurm", "23.02"], "--slurm: invalid choice: '23.02'"),
        (["--slurm", "24.11", "--dir", "/var/tmp/restart"], "it must lie under /tmp or /home"),
    ],
)
def test_a_bad_release_or_a_directory_the_root_cannot_see_is_refused(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        parse_options(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_release_problem() -> None:
    assert release_problem(Path("/var/lib/x"), "system") is None
    assert release_problem(Path("/tmp/x"), "24.11") is None
    assert "--slurm: expected one of system, 24.11, 26.05" in str(
        release_problem(Path("/tmp/x"), "25.05")
    )
    problem = str(release_problem(Path("/srv/bench"), "26.05"))
    assert "--dir /srv/bench" in problem and "--slurm 26.05" in problem


def test_a_roots_release_puts_its_client_wrappers_in_the_controller_config(
    tmp_path: Path,
) -> None:
    assert slurm_bin_dir(tmp_path / "cluster", "system") is None
    bin_dir = slurm_bin_dir(tmp_path / "cluster", "24.11")
    assert bin_dir == tmp_path / "cluster" / "bin"
    text = write_config(tmp_path, 6.0, bin_dir).read_text()
    assert f"bin_dir: {bin_dir}" in text
    assert "bin_dir" not in write_config(tmp_path, 6.0).read_text()
