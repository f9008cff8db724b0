"""A Slurm command that SIGKILLs the controller which called it, at a planned point (tests only).

The controller finds Slurm's commands in ``slurm.bin_dir``; the kill tests point that at a
directory of wrappers (``squeue``, ``scontrol``, ``scancel``, ``sbatch``) that each run::

    python3 -I -S slurm_kill_shim.py PLAN_DIR COMMAND ARG...

``PLAN_DIR/plan.json`` names the real commands and an ordered list of kill rules; only the first
rule not yet fired is armed. A rule fires at the ``nth`` command line that matches its ``argv``
regular expression (on ``COMMAND ARG...`` joined by spaces) while it is armed, and only if

* ``kinds`` (optional): the controller's journal has a ``pending`` action of one of these kinds,
  i.e. such an action is being applied or re-applied right now;
* ``after_decision`` (optional): the last line of the controller's log is a decision (the round
  has committed its journal and not yet issued anything: the start of ``apply``);
* ``follows`` (optional): the controller's previous Slurm command matches this expression (the
  read-back ``squeue`` right after an update, say).

When it fires, the shim kills its parent (the controller: ``SubprocessRunner`` runs the command
directly) with SIGKILL, ``before`` running the real command (which then never runs) or
``after`` it. Every command line is appended to ``PLAN_DIR/calls.jsonl`` and every kill to
``PLAN_DIR/kills.jsonl`` (with the journal's pending actions at that moment), for the test to
check and to print when it fails. State lives in ``PLAN_DIR/state.json`` under an flock.

Standard library only, and no ``site`` (``-S``): it runs before every Slurm command of the
controller and must start fast.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KILLED_EXIT = 128 + signal.SIGKILL


def read_json(path: Path, default: Any) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def append_line(path: Path, record: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")


def pending_actions(db: Path) -> list[dict[str, Any]]:
    """The journal's pending actions (id, round, job, kind), read-only; [] if unreadable."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=5.0) as conn:
            rows = conn.execute(
                "SELECT id, round_index, sia_id, kind FROM actions WHERE state = 'pending' "
                "ORDER BY id"
            ).fetchall()
    except sqlite3.Error:
        return []
    return [{"id": r[0], "round": r[1], "job": r[2], "kind": r[3]} for r in rows]


def last_log_event(log: Path) -> str:
    """The ``event`` of the last complete line of the controller's JSON log ('' if none)."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(handle.tell() - 65536, 0))
            lines = handle.read().splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        try:
            return str(json.loads(line).get("event", ""))
        except ValueError:
            continue
    return ""


def is_controller(pid: int, marker: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
    except OSError:
        return False
    return marker.encode() in cmdline


def armed_rule_fires(
    plan: dict[str, Any], state: dict[str, Any], line: str, parent: int
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The armed rule if it fires at ``line`` (else None), with the journal's pending actions;
    counts the match in ``state``."""
    rules = plan["rules"]
    index = state.get("next", 0)
    if index >= len(rules):
        return None, []
    rule = rules[index]
    if not re.search(rule["argv"], line) or not is_controller(parent, plan["controller_marker"]):
        return None, []
    pending = pending_actions(Path(plan["db"]))
    kinds = rule.get("kinds")
    if kinds and not any(entry["kind"] in kinds for entry in pending):
        return None, []
    if rule.get("after_decision") and last_log_event(Path(plan["log"])) != "decision":
        return None, []
    previous = state.get("previous", {})
    if rule.get("follows") and (
        previous.get("controller") != parent or not re.search(rule["follows"], previous["argv"])
    ):
        return None, []
    state["seen"] = state.get("seen", 0) + 1
    if state["seen"] < rule.get("nth", 1):
        return None, []
    state["next"], state["seen"] = index + 1, 0
    return rule, pending


def main(argv: list[str]) -> int:
    plan_dir, command, args = Path(argv[1]), argv[2], argv[3:]
    plan = read_json(plan_dir / "plan.json", {"rules": [], "real": {}})
    real = plan["real"][command]
    line = " ".join([command, *args])
    parent = os.getppid()
    with open(plan_dir / "state.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = read_json(plan_dir / "state.json", {})
        rule, pending = armed_rule_fires(plan, state, line, parent)
        state["previous"] = {"controller": parent, "argv": line}
        (plan_dir / "state.json").write_text(json.dumps(state), encoding="utf-8")
        call = {"time": time.time(), "argv": line, "controller": parent}
        append_line(plan_dir / "calls.jsonl", {**call, "kill": rule["name"] if rule else ""})
    if rule is None:
        os.execv(real, [real, *args])
    kill = {**call, "rule": rule["name"], "when": rule["when"], "pending": pending}
    if rule["when"] == "before":
        append_line(plan_dir / "kills.jsonl", kill)
        os.kill(parent, signal.SIGKILL)
        return KILLED_EXIT
    returncode = subprocess.run([real, *args], check=False).returncode
    append_line(plan_dir / "kills.jsonl", {**kill, "returncode": returncode})
    os.kill(parent, signal.SIGKILL)
    return returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv))
