"""The chaos soak's pure parts (benchmarks/chaos_plan.py, chaos_evidence.py): the schedule from a
seed, the job plans, and every evidence parser and counter, on lines captured from a soak on
the dev cluster (2026-11-25). No Slurm: each verdict must be able to catch the defect it names.
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import tempfile
from pathlib import Path

import pytest

from benchmarks.chaos_evidence import (
    JobEvidence,
    LogEvent,
    SampleRuns,
    duplicate_launches,
    parse_job_log,
    parse_sample_log,
    read_exit_records,
    read_training_records,
    restores,
    table,
    totals,
    unlogged_completions,
)
from benchmarks.chaos_plan import (
    ARRIVALS,
    FAULT_KINDS,
    ISSUE_FAULTS,
    RETRY_EVERY,
    ChaosError,
    fault_schedule,
    job_plans,
    parse_fault_counts,
)
from benchmarks.chaos_site import DATA_TMP, _events

JOB = "s1795586873392-dbea"
# bert-03's whole log, captured in a short soak (seed 18, 2026-11-25): its
# run of round 6 was killed while writing the checkpoint of step 102 and round 7 resumed.
LOG = (Path(__file__).parent / "fixtures" / "chaos" / "bert-03.out").read_text(encoding="utf-8")


def test_the_schedule_is_the_seeds_and_has_every_fault_of_the_issue() -> None:
    first = fault_schedule(ISSUE_FAULTS, 60.0, 1200.0, seed=18)
    assert first == fault_schedule(ISSUE_FAULTS, 60.0, 1200.0, seed=18)
    assert first != fault_schedule(ISSUE_FAULTS, 60.0, 1200.0, seed=19)
    assert {k: sum(f.kind == k for f in first) for k in FAULT_KINDS} == ISSUE_FAULTS
    times = [f.at_s for f in first]
    assert times == sorted(times) and times[0] >= 60.0 and times[-1] <= 1200.0
    assert min(b - a for a, b in itertools.pairwise(times)) >= 10.0 - 1e-6
    kills = [f.index for f in first if f.kind == "controller_kill"]
    assert kills == list(range(1, 11))


def test_a_schedule_that_cannot_fit_is_refused() -> None:
    with pytest.raises(ChaosError, match="do not fit"):
        fault_schedule(ISSUE_FAULTS, 60.0, 200.0, seed=1)
    assert fault_schedule({}, 0.0, 10.0, seed=1) == []


def test_fault_counts_parse_and_refuse_unknown_kinds() -> None:
    counts = parse_fault_counts("controller_kill=3, drain=1")
    assert counts == {**dict.fromkeys(FAULT_KINDS, 0), "controller_kill": 3, "drain": 1}
    for bad in ("controller_kill", "reboot=1", "drain=-1", "drain=x"):
        with pytest.raises(ChaosError, match="kind=N"):
            parse_fault_counts(bad)


def test_job_plans_mix_emulated_and_real_jobs_with_retry_candidates() -> None:
    plans = job_plans(30, 2, scale=4.0, window_s=1200.0, seed=18)
    assert plans == job_plans(30, 2, scale=4.0, window_s=1200.0, seed=18)
    assert len(plans) == 32 and len({p.name for p in plans}) == 32
    real = [p for p in plans if p.real]
    assert sorted(p.name for p in real) == ["cnn-real", "transformer-real"]
    retry = sorted(p.name for p in plans if p.max_failures == 1)
    assert len(retry) == len(range(3, 30, RETRY_EVERY)) == 4
    assert all(not p.real for p in plans if p.max_failures)
    times = [p.submit_at_s for p in plans]
    assert times == sorted(times) and times[0] >= 0 and times[-1] <= ARRIVALS * 1200.0
    # time compression: a scale twice as high halves the emulated datasets
    half = {p.name: p for p in job_plans(30, 2, scale=8.0, window_s=1200.0, seed=18)}
    cifar = next(p for p in plans if p.name == "cifar10-00")
    size = cifar.command.index("--dataset-size") + 1
    assert int(half["cifar10-00"].command[size]) * 2 == int(cifar.command[size])


def test_the_job_log_yields_launches_restores_checkpoints_and_the_completion() -> None:
    events = parse_job_log(LOG.splitlines())
    assert [(e.kind, e.round, e.step) for e in events] == [
        ("launch", 5, 0),
        ("restore", 5, 0),
        ("saved", 5, 70),
        ("launch", 6, 0),
        ("restore", 6, 70),
        ("launch", 7, 0),
        ("skipped", -1, 102),
        ("restore", 7, 70),
        ("complete", 7, 93),
    ]
    launches = [(e.slurm_job, e.restart) for e in events if e.kind == "launch"]
    assert launches == [("1", 0), ("1", 1), ("1", 2)]
    assert all(e.job == JOB for e in events if e.kind != "skipped")
    assert events[1].time - events[0].time == pytest.approx(2.889)


def test_a_killed_checkpoint_write_is_no_loss_but_a_restore_behind_a_saved_one_is() -> None:
    events = parse_job_log(LOG.splitlines())
    # The run of round 6 was killed writing step 102 (no log line: the write never completed);
    # the next run restored 70, the newest complete checkpoint: nothing saved was lost.
    assert [(r.restored, r.last_checkpoint, r.beyond) for r in restores(events)] == [
        (0, None, 0),
        (70, 70, 0),
        (70, 70, 0),
    ]
    # Had the write of 102 completed (logged), restoring 70 would lose 32 saved steps.
    saved = LogEvent(events[4].time + 1, "saved", JOB, 6, 102)
    assert [r.beyond for r in restores([*events, saved])] == [0, 0, 32]


def test_two_launches_of_one_decision_are_found() -> None:
    events = parse_job_log(LOG.splitlines())
    assert duplicate_launches(events) == {}
    again = LogEvent(events[3].time + 5, "launch", JOB, 6, slurm_job="1", restart=2)
    assert duplicate_launches([*events, again]) == {6: [("1", 1), ("1", 2)]}


def sample(step: int, restarts: int) -> str:
    return json.dumps({"step": step, "restarts": restarts, "loss": 1.0})


def test_the_sample_log_shows_overlapping_runs_and_redone_steps() -> None:
    # run 0 trains 0..9, a checkpoint at 5; run 1 restores 5 and trains 5..12
    clean = [sample(s, 0) for s in range(10)] + [sample(s, 1) for s in range(5, 13)]
    runs = parse_sample_log([*clean, "{cut short by a ki"])
    assert runs.first_step == {0: 0, 1: 5} and runs.last_step == {0: 9, 1: 12}
    assert runs.overlaps == () and runs.steps_redone == 5
    # run 0 left behind trains step 10 after run 1 began: two runs at once
    overlapping = [*clean[:12], sample(10, 0), *clean[12:]]
    assert parse_sample_log(overlapping).overlaps == ((0, 1),)


def exit_record(cause: str, restart: int, when: float) -> dict[str, object]:
    return {"sia_id": JOB, "slurm_job_id": "1", "slurm_restart_count": restart,
            "cause": cause, "status": 0, "time": when}  # fmt: skip


def evidence(
    phase: str, log: str, causes: list[str], samples: SampleRuns | None = None
) -> JobEvidence:
    exits = tuple(exit_record(c, i, 100.0 + i) for i, c in enumerate(causes))
    events = tuple(parse_job_log(log.splitlines()))
    return JobEvidence("bert-03", JOB, phase, "", events, samples or SampleRuns(), exits)


def rerun(restart: int, restored: int, completed: int) -> str:
    """Log lines of one more run of the job: launched, restored, completed."""
    tag = f"[round=9 job={JOB}]"
    return (
        f"2026-11-25 06:09:00,000 sia-launch INFO {tag} a100:1x1 batch 12 = 1 x 12 x 1, "
        f"restart {restart}: srun --nodes=1 --rdzv-id=1 --max-restarts=0\n"
        f"2026-11-25 06:09:01,000 rank0 sia_slurm.job.elastic.trainer INFO {tag} restored step "
        f"{restored} (epoch 1, sample 0 of 480) from ckpt-{restored:010d}.pt\n"
        f"2026-11-25 06:09:02,000 rank0 sia_slurm.job.elastic.trainer INFO {tag} training complete "
        f"after {completed} steps\n"
    )


def test_verdicts_rest_on_the_database_the_log_and_the_exit_records() -> None:
    complete = evidence("done", LOG, ["stopped", "failed", "completed"])
    assert complete.verdict == "completed once" and not complete.launched_twice
    assert (complete.replayed_completions, complete.false_completions) == (0, 0)
    # a later run that trained past the completion: the job trained twice
    assert evidence("done", LOG + rerun(3, 70, 100), ["completed"]).verdict == "duplicated"
    # a later run that restored the final checkpoint and completed at once (the completed run
    # died with its node before its launcher recorded it): replayed, not duplicated
    replay = evidence("done", LOG + rerun(3, 93, 93), ["stopped", "failed", "completed"])
    assert replay.verdict == "completed once" and replay.replayed_completions == 1
    # 'completed' recorded for runs 0 and 1, which logged no completion (srun exited 0 after a
    # node failure): false records, whatever the verdict
    assert evidence("done", LOG, ["completed", "completed", "completed"]).false_completions == 2
    assert evidence("failed", LOG, ["stopped", "failed"]).verdict == "failed (own code)"
    # failed after a run that Slurm ended (no fault of the job's): a lost job
    assert evidence("failed", LOG, ["stopped", "terminated"]).verdict == "lost"
    assert evidence("failed", LOG, ["stopped"]).verdict == "lost"
    assert evidence("gone", LOG, ["completed"]).verdict == "lost"
    unfinished = "\n".join(line for line in LOG.splitlines() if "training complete" not in line)
    assert evidence("done", unfinished, ["completed"]).verdict == "lost"
    overlap = SampleRuns({0: 0, 1: 5}, {0: 10, 1: 12}, ((0, 1),), 5)
    assert evidence("done", LOG, ["completed"], overlap).launched_twice


def test_a_completion_only_a_left_over_training_record_says_is_counted() -> None:
    """Run 2 of the captured log left behind by its dead slurmd: it completed after its
    launcher had gone, so its 'training complete' line never reached the log, and only its
    ``training-1.2.json`` (which sia-launch removes once it has judged a run) says so."""
    logged = parse_job_log(LOG.splitlines())
    done = next(e for e in logged if e.kind == "complete")
    unlogged = "\n".join(line for line in LOG.splitlines() if "training complete" not in line)
    record = ("training-1.2.json", {"steps": 93, "end": "completed", "time": done.time})

    def judged(log: str, records: list[tuple[str, dict[str, object]]]) -> JobEvidence:
        events = parse_job_log(log.splitlines())
        events += unlogged_completions(records, events)
        return JobEvidence("bert-03", JOB, "done", "", tuple(events), SampleRuns(), ())

    # The successor restored the final checkpoint and completed at once: a replay.
    replay = judged(unlogged + "\n" + rerun(3, 93, 93), [record])
    assert (replay.completions, replay.replayed_completions) == (1, 1)
    assert replay.verdict == "completed once"
    assert [r.last_checkpoint for r in replay.restores][-1] == 93
    assert judged(unlogged + "\n" + rerun(3, 93, 93), []).replayed_completions == 0  # as before
    # The successor restored an older checkpoint and trained to the end again: twice.
    assert judged(unlogged + "\n" + rerun(3, 70, 93), [record]).verdict == "duplicated"
    assert judged(unlogged + "\n" + rerun(3, 70, 93), []).verdict == "completed once"
    # A record whose completion the log has, runs that did not complete, junk: nothing added.
    assert unlogged_completions([record], logged) == []
    others = [
        ("training-1.1.json", {"steps": 80, "end": None, "time": done.time}),
        ("training-1.0.json", {"steps": 70, "end": "stopped", "time": done.time}),
        ("exit-1.2.json", {"steps": 93, "end": "completed", "time": done.time}),
        ("training-1.3.json", {"steps": "93", "end": "completed", "time": done.time}),
    ]
    assert unlogged_completions(others, []) == []


def test_training_records_are_read_and_junk_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "training-1.2.json").write_text('{"steps": 93, "end": "completed", "time": 1}')
    (tmp_path / "training-1.3.json").write_text("cut sh")
    (tmp_path / "exit-1.2.json").write_text("{}")
    assert read_training_records(tmp_path) == [
        ("training-1.2.json", {"steps": 93, "end": "completed", "time": 1})
    ]
    assert read_training_records(tmp_path / "missing") == []


def test_totals_and_the_table() -> None:
    jobs = [
        evidence("done", LOG, ["completed"]),
        evidence("failed", LOG, ["failed"]),
        evidence("failed", LOG, []),
    ]
    result = totals(jobs, faults_injected=19)
    assert (result.completed_once, result.failed_own, result.lost) == (1, 1, 1)
    lines = table(result)
    assert lines[2] == "| 19 | 1 of 3 | 1 | 0 | 0 |"
    assert "lost: 1, duplicated: 0" in lines[-2]


def test_exit_records_are_read_oldest_first_and_junk_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "exit-1.1.json").write_text(json.dumps(exit_record("completed", 1, 200.0)))
    (tmp_path / "exit-1.0.json").write_text(json.dumps(exit_record("stopped", 0, 100.0)))
    (tmp_path / "exit-1.2.json").write_text("{not json")
    assert [r["cause"] for r in read_exit_records(tmp_path)] == ["stopped", "completed"]
    assert read_exit_records(tmp_path / "missing") == []


def test_the_checkpoint_kill_recognises_the_data_files_temporary_name_only(tmp_path: Path) -> None:
    """The names CheckpointManager._write_atomic gives (mkstemp with its prefix and suffix)."""
    data = Path("ckpt-0000000102.pt")
    names = []
    for final in (data, data.with_name(data.name + ".sha256")):
        fd, name = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".tmp", dir=tmp_path)
        os.close(fd)
        names.append(Path(name).name)
    found = DATA_TMP.match(names[0])
    assert found is not None and int(found[1]) == 102
    assert DATA_TMP.match(names[1]) is None
    assert DATA_TMP.match("ckpt-0000000102.pt") is None


def test_inotify_events_are_unpacked() -> None:
    def event(wd: int, name: bytes) -> bytes:
        padded = name + b"\0" * (16 - len(name))
        return struct.pack("iIII", wd, 0x100, 0, len(padded)) + padded

    data = event(1, b".ckpt-1.pt.x.tmp") + event(2, b"b")
    assert _events(data) == [(1, ".ckpt-1.pt.x.tmp"), (2, "b")]
