"""The chaos soak's evidence: what the jobs and the controller wrote, read into verdicts.

``benchmarks/chaos.py`` runs the soak; everything here reads files and returns values, so that
``tests/test_chaos_bench.py`` checks it without Slurm. The verdicts come from what the jobs and
the controller wrote, never from what the soak meant to happen:

* **completed exactly once**: the controller's database says ``done`` and the job's log has
  one ``training complete`` line of a run that trained (every rank-0 completion logs it after
  its final checkpoint). A run that restored the final checkpoint and completed at once (the
  previous run completed, then died with its node before its launcher could record it, so the
  controller brought it back) trained nothing again: a *replayed* completion, counted apart.
  A run left behind by a dead slurmd logs nothing once its ``srun`` is gone: its completion
  is the ``training-<run>.json`` it left (:func:`unlogged_completions`);
* **false completion records**: an ``exit-<run>.json`` whose cause is ``completed`` for a run
  that logged no completion (seen: ``srun`` exited 0 after "Node failure");
* **failed by its own code**: the database says ``failed`` and the last run's exit record
  blames the job (``failed``/``invalid``: :attr:`sia_slurm.protocol.ExitCause.users_fault`);
* **lost**: neither (failed without an exit of its own, gone, never finished);
* **duplicated**: two completions that trained, two launches for one journaled decision (the
  launcher logs the round of the assignment it launched, the Slurm job id and restart count),
  or two Slurm
  runs training at once (the rank-0 sample log, appended to by every run in the order the
  steps were trained, has a step of an older run after the first step of a newer one);
* **steps redone beyond the last checkpoint**: each restore (``restored step N`` or ``no
  checkpoint ...: starting from scratch``) against the newest checkpoint logged as written
  before it (stop, termination and completion each log theirs after the save returned, so a
  logged checkpoint is complete). A restore below it lost steps that had been saved.
  The steps redone since the checkpoint (work of a run killed before it could save) are
  counted apart: that is what a crash costs, not a loss.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

OWN_FAULT_CAUSES = ("failed", "invalid")  # ExitCause.users_fault


# ----------------------------------------------------------------------------------------------
# The job logs

_TS = r"(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}),(?P<ms>\d{3})"
_TAG = r"\[round=(?P<round>\d+) job=(?P<job>[^\]\s]+)\]"
LAUNCH_LINE = re.compile(
    _TS + r" sia-launch \S+ " + _TAG + r" .*, restart (?P<restart>\d+): .*--rdzv-id=(?P<slurm>\d+)"
)
RANK0_LINE = re.compile(_TS + r" rank0 \S+ \S+ " + _TAG + r" (?P<message>.*)$")
RESTORED = re.compile(r"^restored step (\d+) ")
SCRATCH = re.compile(r"^no checkpoint in .*: starting from scratch")
SAVED = re.compile(r"checkpoint \S*ckpt-(\d{10})\.pt\b")
COMPLETE = re.compile(r"^training complete after (\d+) steps")
LEFT_BEHIND = re.compile(r"was left behind")
# sia_slurm/job/elastic/checkpoint.py, when a restore passes over an incomplete or corrupt
# checkpoint
SKIPPED = re.compile(
    _TS + r" rank0 \S+ WARNING checkpoint \S*ckpt-(?P<step>\d{10})\.pt: .*; skipping it$"
)


@dataclass(frozen=True)
class LogEvent:
    """One line of a job's log that matters to the verdicts.

    ``kind``: ``launch`` (sia-launch started a run: ``slurm_job``, ``restart``), ``restore``
    (rank 0 restored ``step``; 0 from scratch), ``saved`` (a checkpoint of ``step`` is
    complete), ``complete`` (training done at ``step``; its checkpoint is saved), ``left``
    (a run left behind exits), ``skipped`` (a restore passed over the incomplete checkpoint
    of ``step``; its line names no job or round: ``round`` -1)."""

    time: float
    kind: str
    job: str
    round: int
    step: int = 0
    slurm_job: str = ""
    restart: int = -1


def _when(match: re.Match[str]) -> float:
    return time.mktime(time.strptime(match["ts"], "%Y-%m-%d %H:%M:%S")) + int(match["ms"]) / 1e3


def parse_job_log(lines: Iterable[str]) -> list[LogEvent]:
    """The events among a job's log lines, in file order (other lines are ignored)."""
    events: list[LogEvent] = []
    for line in lines:
        launch = LAUNCH_LINE.search(line)
        if launch is not None:
            events.append(
                LogEvent(
                    _when(launch), "launch", launch["job"], int(launch["round"]),
                    slurm_job=launch["slurm"], restart=int(launch["restart"]),
                )
            )  # fmt: skip
            continue
        skipped = SKIPPED.search(line)
        if skipped is not None:
            events.append(LogEvent(_when(skipped), "skipped", "", -1, int(skipped["step"])))
            continue
        rank0 = RANK0_LINE.search(line)
        if rank0 is None:
            continue
        when, job, round_index = _when(rank0), rank0["job"], int(rank0["round"])
        message = rank0["message"]
        if (found := RESTORED.search(message)) is not None:
            events.append(LogEvent(when, "restore", job, round_index, int(found[1])))
        elif SCRATCH.search(message):
            events.append(LogEvent(when, "restore", job, round_index, 0))
        elif (found := COMPLETE.search(message)) is not None:
            events.append(LogEvent(when, "complete", job, round_index, int(found[1])))
        elif (found := SAVED.search(message)) is not None:
            events.append(LogEvent(when, "saved", job, round_index, int(found[1])))
        elif LEFT_BEHIND.search(message):
            events.append(LogEvent(when, "left", job, round_index))
    return events


def read_job_log(path: Path) -> list[LogEvent]:
    """:func:`parse_job_log` of a file; a missing file (the job never ran) has no events."""
    if not path.exists():
        return []
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse_job_log(handle)


TRAINING_RECORD = re.compile(r"^training-(?P<slurm>\d+)\.(?P<restart>\d+)\.json$")
SAME_COMPLETION_S = 5.0  # a logged completion this close to a record's, same step: the same one


def unlogged_completions(
    records: Iterable[tuple[str, Mapping[str, Any]]], logged: Sequence[LogEvent]
) -> list[LogEvent]:
    """``complete`` events for the runs whose trainer recorded a completion that the job's log
    does not have. ``records``: ``(file name, content)`` of the job's ``training-<run>.json``.

    sia-launch removes a run's record once it has judged the run, so a record left over is
    one the trainer wrote after its launcher had gone: a run left behind by a dead slurmd
    (seen: cifar10-06, soak of 2026-11-26, seed 18, whose run 1 completed a second after
    its launcher judged it aborted). Its log lines went to an ``srun`` that no longer
    existed, so only the record says that it trained to the end and saved the final
    checkpoint. Without it, the next run's immediate completion from that checkpoint reads
    as the job's one trained completion, and a successor that trained to the end again
    would not read as the second."""
    found = []
    for name, record in records:
        match = TRAINING_RECORD.match(name)
        steps, when = record.get("steps"), record.get("time")
        if match is None or record.get("end") != "completed" or not isinstance(steps, int):
            continue
        if not isinstance(when, int | float):
            continue
        if any(
            e.kind == "complete" and e.step == steps and abs(e.time - when) <= SAME_COMPLETION_S
            for e in logged
        ):
            continue
        found.append(
            LogEvent(float(when), "complete", "", -1, steps, match["slurm"], int(match["restart"]))
        )
    return found


def read_training_records(job_dir: Path) -> list[tuple[str, dict[str, Any]]]:
    """The job's ``training-<run>.json`` records left over (unreadable: skipped)."""
    found = []
    for path in sorted(job_dir.glob("training-*.json")) if job_dir.is_dir() else []:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            found.append((path.name, record))
    return found


@dataclass(frozen=True)
class Restore:
    """A run's restore against the newest checkpoint logged before it (None: none yet)."""

    time: float
    restored: int
    last_checkpoint: int | None

    @property
    def beyond(self) -> int:
        """Saved steps this restore went back past: what the goal says must stay 0."""
        if self.last_checkpoint is None:
            return 0
        return max(0, self.last_checkpoint - self.restored)


def restores(events: Sequence[LogEvent]) -> list[Restore]:
    """Every restore with the newest checkpoint logged as complete before it (time order)."""
    saved: int | None = None
    found = []
    for event in sorted(events, key=lambda e: e.time):  # stable: file order breaks ties
        if event.kind in ("saved", "complete"):
            saved = event.step if saved is None else max(saved, event.step)
        elif event.kind == "restore":
            found.append(Restore(event.time, event.step, saved))
    return found


def completions(events: Sequence[LogEvent]) -> tuple[int, int]:
    """``(trained, replayed)``: completions of runs that trained, and of runs that restored the
    step a previous completion had reached and completed without a step."""
    trained = replayed = 0
    done_at: int | None = None
    restored: int | None = None
    for event in sorted(events, key=lambda e: e.time):
        if event.kind == "restore":
            restored = event.step
        elif event.kind == "complete":
            if done_at is not None and restored == done_at == event.step:
                replayed += 1
            else:
                trained += 1
            done_at = event.step
    return trained, replayed


def false_completions(events: Sequence[LogEvent], exits: Sequence[Mapping[str, Any]]) -> int:
    """Exit records saying ``completed`` for a run that logged no completion between its launch
    and the next launch (the record and the launch line both name the Slurm job and run)."""
    launches = sorted((e for e in events if e.kind == "launch"), key=lambda e: e.time)
    done = [e.time for e in events if e.kind == "complete"]
    false = 0
    for record in exits:
        if record.get("cause") != "completed":
            continue
        run = (str(record.get("slurm_job_id")), record.get("slurm_restart_count"))
        for i, launch in enumerate(launches):
            if (launch.slurm_job, launch.restart) != run:
                continue
            end = launches[i + 1].time if i + 1 < len(launches) else float("inf")
            if not any(launch.time <= t < end for t in done):
                false += 1
            break
    return false


def duplicate_launches(events: Sequence[LogEvent]) -> dict[int, list[tuple[str, int]]]:
    """Rounds (journaled decisions) launched by more than one Slurm run: round -> runs."""
    runs: dict[int, set[tuple[str, int]]] = {}
    for event in events:
        if event.kind == "launch":
            runs.setdefault(event.round, set()).add((event.slurm_job, event.restart))
    return {r: sorted(found) for r, found in sorted(runs.items()) if len(found) > 1}


# ----------------------------------------------------------------------------------------------
# The rank-0 sample log (sia_slurm/job/examples/common.py SampleLog, one line per trained step)


@dataclass(frozen=True)
class SampleRuns:
    """What the rank-0 sample log says about the job's runs (a run = Slurm restart count)."""

    first_step: dict[int, int] = field(default_factory=dict)  # run -> its first trained step
    last_step: dict[int, int] = field(default_factory=dict)  # run -> its last trained step
    overlaps: tuple[tuple[int, int], ...] = ()  # (older, newer): older trained after newer began
    steps_redone: int = 0  # steps trained again because a run ended before saving them


def parse_sample_log(lines: Iterable[str]) -> SampleRuns:
    """Runs, overlaps and redone steps from rank 0's sample lines in file order (a line cut
    short by a kill is skipped)."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    overlaps: set[tuple[int, int]] = set()
    newest = -1
    redone = 0
    reached = -1  # the highest step any run has trained so far
    for line in lines:
        try:
            record = json.loads(line)
            step, run = int(record["step"]), int(record["restarts"])
        except (ValueError, KeyError, TypeError):
            continue
        if run < newest:
            overlaps.add((run, newest))
        if run not in first:
            first[run] = step
            redone += max(0, reached + 1 - step)
        newest = max(newest, run)
        last[run] = step
        reached = max(reached, step)
    return SampleRuns(first, last, tuple(sorted(overlaps)), redone)


def read_sample_log(path: Path) -> SampleRuns:
    if not path.exists():
        return SampleRuns()
    with open(path, encoding="utf-8", errors="replace") as handle:
        return parse_sample_log(handle)


# ----------------------------------------------------------------------------------------------
# Exit records and the verdict per job


def read_exit_records(job_dir: Path) -> list[dict[str, Any]]:
    """The launcher's ``exit-<run>.json`` records of a job, oldest first (unreadable: skipped)."""
    records = []
    for path in sorted(job_dir.glob("exit-*.json")) if job_dir.is_dir() else []:
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(record, dict):
            records.append(record)
    return sorted(records, key=lambda r: float(r.get("time", 0.0)))


@dataclass(frozen=True)
class JobEvidence:
    """Everything the verdict of one job rests on."""

    name: str
    sia_id: str
    phase: str  # the controller database's (``done``, ``failed``, ``gone``, ``missing``, ...)
    message: str
    events: tuple[LogEvent, ...]
    samples: SampleRuns
    exits: tuple[dict[str, Any], ...]
    slurm_states: tuple[str, ...] = ()  # the last state Slurm showed for each of its Slurm jobs

    @property
    def completions(self) -> int:
        """Completions of runs that trained (replayed ones: :attr:`replayed_completions`)."""
        return completions(self.events)[0]

    @property
    def replayed_completions(self) -> int:
        return completions(self.events)[1]

    @property
    def false_completions(self) -> int:
        return false_completions(self.events, self.exits)

    @property
    def completed_exits(self) -> int:
        return sum(1 for r in self.exits if r.get("cause") == "completed")

    @property
    def own_failure(self) -> bool:
        return bool(self.exits) and self.exits[-1].get("cause") in OWN_FAULT_CAUSES

    @property
    def restores(self) -> list[Restore]:
        return restores(self.events)

    @property
    def steps_beyond_checkpoint(self) -> int:
        return sum(r.beyond for r in self.restores)

    @property
    def duplicate_launches(self) -> dict[int, list[tuple[str, int]]]:
        return duplicate_launches(self.events)

    @property
    def launched_twice(self) -> bool:
        """Two launches for one decision, or two Slurm runs training at once."""
        return bool(self.duplicate_launches or self.samples.overlaps)

    @property
    def verdict(self) -> str:
        """``completed once``, ``failed (own code)``, ``duplicated`` or ``lost``."""
        if self.completions > 1:
            return "duplicated"
        if self.phase == "done" and self.completions == 1:
            return "completed once"
        if self.phase == "failed" and self.own_failure:
            return "failed (own code)"
        return "lost"

    def summary(self) -> dict[str, Any]:
        """The JSON form: the counts and what each verdict rests on."""
        return {
            "name": self.name,
            "sia_id": self.sia_id,
            "verdict": self.verdict,
            "phase": self.phase,
            "message": self.message,
            "completions": self.completions,
            "replayed_completions": self.replayed_completions,
            "false_completion_records": self.false_completions,
            "completed_exits": self.completed_exits,
            "exit_causes": [r.get("cause") for r in self.exits],
            "slurm_states": list(self.slurm_states),
            "launches": sum(1 for e in self.events if e.kind == "launch"),
            "restores": [
                {"restored": r.restored, "last_checkpoint": r.last_checkpoint, "beyond": r.beyond}
                for r in self.restores
            ],
            "steps_beyond_checkpoint": self.steps_beyond_checkpoint,
            "steps_redone_since_checkpoint": self.samples.steps_redone,
            "duplicate_launches": {str(k): v for k, v in self.duplicate_launches.items()},
            "overlapping_runs": [list(pair) for pair in self.samples.overlaps],
            "left_behind_exits": sum(1 for e in self.events if e.kind == "left"),
            "unlogged_completions": sum(
                1 for e in self.events if e.kind == "complete" and e.round == -1
            ),
        }


@dataclass(frozen=True)
class Totals:
    """The soak's line of the table."""

    faults: int
    jobs: int
    completed_once: int
    failed_own: int
    lost: int
    duplicated: int
    steps_beyond_checkpoint: int
    launched_twice: int
    steps_redone_since_checkpoint: int
    replayed_completions: int = 0
    false_completion_records: int = 0


def totals(jobs: Sequence[JobEvidence], faults_injected: int) -> Totals:
    verdicts = [job.verdict for job in jobs]
    return Totals(
        faults=faults_injected,
        jobs=len(jobs),
        completed_once=verdicts.count("completed once"),
        failed_own=verdicts.count("failed (own code)"),
        lost=verdicts.count("lost"),
        duplicated=verdicts.count("duplicated"),
        steps_beyond_checkpoint=sum(job.steps_beyond_checkpoint for job in jobs),
        launched_twice=sum(1 for job in jobs if job.launched_twice),
        steps_redone_since_checkpoint=sum(job.samples.steps_redone for job in jobs),
        replayed_completions=sum(job.replayed_completions for job in jobs),
        false_completion_records=sum(job.false_completions for job in jobs),
    )


TABLE_HEADER = (
    "| faults injected | jobs completed exactly once | jobs failed (own code) | "
    "steps redone beyond the last checkpoint | jobs launched twice for one decision |"
)


def table(result: Totals) -> list[str]:
    """The issue's table (markdown), and the two counts the goal adds: lost and duplicated."""
    return [
        TABLE_HEADER,
        "|---|---|---|---|---|",
        f"| {result.faults} | {result.completed_once} of {result.jobs} | {result.failed_own} | "
        f"{result.steps_beyond_checkpoint} | {result.launched_twice} |",
        "",
        f"lost: {result.lost}, duplicated: {result.duplicated}; steps redone since the last "
        f"checkpoint (work of killed runs, not a loss): {result.steps_redone_since_checkpoint}",
        f"completions replayed from the final checkpoint (0 steps): {result.replayed_completions}"
        f"; 'completed' exit records of runs that did not complete: "
        f"{result.false_completion_records}",
    ]
