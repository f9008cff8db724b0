"""The kill tests' harness: a plan of SIGKILL points, the shim directory that carries it out, a
supervisor that restarts the killed controller, and the checks on each job's own history.

* :class:`KillRule` / :class:`KillPlan`: where to kill. The plan directory holds wrappers for
  Slurm's commands (the controller's ``slurm.bin_dir``) that run ``slurm_kill_shim.py``; rules
  are armed in order and each fires once (see the shim's docstring).
* :class:`Supervisor`: keeps one ``sia-slurm controller run`` loop alive, as systemd's
  ``Restart=always`` would: a controller that died of SIGKILL is started again at once; any
  other exit is recorded and stops the supervision. It lives in
  :mod:`sia_slurm_dev.supervisor` (the chaos soak uses it too) and is re-exported here.
* :func:`job_history_problems`: what a job's ``events.jsonl`` (written by
  tests/slurm/protocol_job.py) shows that must never happen: two runs at once, a counter that
  went back beyond the last checkpoint, a launch refused, a second finish.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sia_slurm_dev.supervisor import Exit, Supervisor

__all__ = ["Exit", "KillPlan", "KillRule", "Supervisor", "job_history_problems", "read_jsonl"]

SHIM = Path(__file__).with_name("slurm_kill_shim.py")
SLURM_COMMANDS = ("squeue", "scontrol", "scancel", "sbatch")
CONTROLLER_MARKER = "sia_slurm.cli"  # in the controller's command line, never in a job's

# A run of protocol_job.py ends with one of these events (``acked`` is followed by
# ``idle-exit`` when Slurm's requeue terminates it).
RUN_ENDS = ("idle-exit", "done", "terminated", "refused")
SAVES = ("acked", "done", "terminated")  # events written right after a checkpoint


@dataclass(frozen=True)
class KillRule:
    """Kill the controller at the ``nth`` Slurm command matching ``argv`` (a regular expression
    on ``command arg...``), ``before`` or ``after`` running it; optionally only while an action
    of one of ``kinds`` is pending in the journal, only as the first command after the round's
    decisions were logged (``after_decision``), or only right after a command matching
    ``follows``."""

    name: str
    argv: str
    when: str
    kinds: tuple[str, ...] = ()
    nth: int = 1
    after_decision: bool = False
    follows: str = ""

    def __post_init__(self) -> None:
        if self.when not in ("before", "after") or self.nth < 1:
            raise ValueError(f"bad kill rule {self}")


@dataclass
class KillPlan:
    """The shim's directory: wrappers named like Slurm's commands, ``plan.json`` with the real
    commands and the rules, and the shim's ``calls.jsonl`` / ``kills.jsonl``."""

    directory: Path
    db: Path
    log: Path
    rules: list[KillRule] = field(default_factory=list)

    @property
    def bin_dir(self) -> Path:
        return self.directory / "bin"

    def install(self, owner_uid: int, owner_gid: int) -> None:
        """Write the wrappers and an empty plan; the directory becomes the controller's (the
        shim runs as the controller's account and writes its logs there)."""
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for command in SLURM_COMMANDS:
            wrapper = self.bin_dir / command
            wrapper.write_text(
                f'#!/bin/sh\nexec {sys.executable} -I -S {SHIM} {self.directory} {command} "$@"\n'
            )
            wrapper.chmod(0o755)
        self._write()
        for path in (self.directory, self.bin_dir):
            os.chown(path, owner_uid, owner_gid)
            path.chmod(0o755)

    def arm(self, rules: Sequence[KillRule]) -> None:
        """Append ``rules``; they are armed one after another once the earlier ones fired."""
        self.rules += rules
        self._write()

    def _write(self) -> None:
        real = {}
        for command in SLURM_COMMANDS:
            found = shutil.which(command)
            if found is None:
                raise RuntimeError(f"{command} is not on PATH: the dev cluster needs it")
            real[command] = found
        plan = {
            "real": real,
            "db": str(self.db),
            "log": str(self.log),
            "controller_marker": CONTROLLER_MARKER,
            "rules": [asdict(rule) for rule in self.rules],
        }
        staged = self.directory / "plan.json.new"
        staged.write_text(json.dumps(plan, indent=1), encoding="utf-8")
        staged.chmod(0o644)
        staged.replace(self.directory / "plan.json")

    def kills(self) -> list[dict[str, Any]]:
        return read_jsonl(self.directory / "kills.jsonl")

    def calls(self) -> list[dict[str, Any]]:
        return read_jsonl(self.directory / "calls.jsonl")

    def unfired(self) -> list[str]:
        fired = {kill["rule"] for kill in self.kills()}
        return [rule.name for rule in self.rules if rule.name not in fired]


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """JSON lines of ``path``; a line cut short by a kill (or glued to the next) is skipped."""
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records


def job_history_problems(events: list[dict[str, Any]]) -> list[str]:
    """What ``events`` (one job's, in file order) show that must not happen.

    * runs never overlap: after a ``start``, the next ``start`` comes only after that run
      ended (``idle-exit``, ``done``, ``terminated`` or ``refused``);
    * each run resumes the counter exactly where the last checkpoint left it (``acked``,
      ``done`` and ``terminated`` are written right after one), so no step is lost or redone;
    * no launch is refused (an assignment that disagrees with Slurm's allocation) and none is
      terminated without a stop request (a run the controller did not grant);
    * the job finishes once, as its last event; each Slurm run (job id, restart count) and each
      decision (the assignment's round) is launched once.
    """
    problems = []
    saved = 0
    running: dict[str, Any] | None = None
    runs: set[tuple[str, int]] = set()
    rounds: set[int] = set()
    for event in events:
        kind = event["event"]
        if kind == "start":
            if running is not None:
                problems.append(f"start {event} while the run started at {running} had not ended")
            if event["counter"] != saved:
                problems.append(f"start at counter {event['counter']}, last checkpoint {saved}")
            run = (event["slurm_job_id"], event["slurm_restart_count"])
            if run in runs:
                problems.append(f"Slurm run {run} launched twice")
            if event["round"] in rounds:
                problems.append(f"the decision of round {event['round']} launched twice")
            runs.add(run)
            rounds.add(event["round"])
            running = event
        elif kind in ("refused", "terminated"):
            problems.append(f"{kind}: {event}")
        if kind in SAVES:
            if event["counter"] < saved:
                problems.append(f"{kind} at counter {event['counter']} < checkpoint {saved}")
            saved = event["counter"]
        if kind in RUN_ENDS:
            if running is None:
                problems.append(f"{kind} outside a run: {event}")
            running = None
    done = [e for e in events if e["event"] == "done"]
    if len(done) != 1 or events[-1]["event"] != "done":
        last = events[-1] if events else None
        problems.append(f"finished {len(done)} time(s); last event {last}")
    return problems
