"""Structured logs: one JSON object per line, one line per decision and per action.

Why JSON lines: the controller's log is read by machines (journald -> Loki/Elastic, ``jq``)
as often as by people; each line carries the round, the job and every field of the decision or
action, plus a human ``message`` with the ``[round=N job=ID]`` prefix the rest of sia-slurm uses.
Everything goes through :mod:`logging`; :func:`configure_logging` installs the formatter on the
``sia_slurm`` logger, writing to stderr (journald) or to a file. The other commands
(``status``, ``report``, ...) print their warnings as plain text through
:func:`configure_text_logging`.

Many messages quote what users wrote (an app name, a job's exit message, Slurm's job name), so
both formatters escape control characters (:func:`~sia_slurm.text.printable`): one record is
one line, whatever the message holds, and ``jq -r .message`` prints no escape sequence.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from pathlib import Path
from typing import Any

from sia_slurm.cluster import Action, Move, Rebatch, Start
from sia_slurm.controller import Decision
from sia_slurm.state.codec import action_kind
from sia_slurm.text import printable, printable_json

EVENTS = logging.getLogger("sia_slurm.service.events")
_EVENT_KEY = "sia_event"


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON object: time, level, logger, message, and event fields.

    Every string is escaped (:func:`~sia_slurm.text.printable`) before ``json.dumps``, which
    alone would keep the line valid JSON but hand ``jq -r`` a user's escape sequences back.
    """

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": printable(record.getMessage()),
        }
        event = getattr(record, _EVENT_KEY, None)
        if isinstance(event, dict):
            payload.update({k: _finite(v) for k, v in printable_json(event).items()})
        if record.exc_info:  # a traceback's lines are its own: newlines kept, escapes not
            payload["exception"] = printable(self.formatException(record.exc_info), one_line=False)
        return json.dumps(payload, default=_plain, sort_keys=False)


class TextFormatter(logging.Formatter):
    """Formats a record as one line of plain text: the message (and the exception, if any),
    every control character escaped, so a newline in a user's string cannot start a line that
    reads like another record."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info:
            text += " | " + self.formatException(record.exc_info)
        return printable(text)


def _finite(value: Any) -> Any:
    """A non-finite number as its name: ``json.dumps`` would write ``NaN``, which is not JSON."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _plain(value: Any) -> Any:
    return printable(str(value))


def configure_logging(log_file: Path | None = None, level: int = logging.INFO) -> logging.Handler:
    """Send every ``sia_slurm`` log record, as JSON lines, to ``log_file`` or stderr."""
    if log_file is not None:
        log_file.parent.mkdir(parents=True, exist_ok=True)
        handler: logging.Handler = logging.FileHandler(log_file, encoding="utf-8")
    else:
        handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger("sia_slurm")
    _remove_ours(root)
    root.addHandler(handler)
    root.setLevel(level)
    root.propagate = False
    return handler


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a record comes (as logging's last resort
    does), so a replaced stderr (a test runner's capture) is honoured."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _value: Any) -> None:
        pass


def configure_text_logging(level: int = logging.WARNING) -> logging.Handler:
    """Print ``sia_slurm``'s records of ``level`` and above to stderr as escaped plain text.

    For the commands other than ``controller run`` (which calls :func:`configure_logging`
    instead, replacing this handler). Without it their warnings would reach logging's last
    resort, which prints each message raw.
    """
    handler = _StderrHandler()
    handler.setLevel(level)
    handler.setFormatter(TextFormatter())
    root = logging.getLogger("sia_slurm")
    _remove_ours(root)
    root.addHandler(handler)
    return handler


def _remove_ours(root: logging.Logger) -> None:
    for old in [h for h in root.handlers if isinstance(h.formatter, JsonFormatter | TextFormatter)]:
        root.removeHandler(old)
        old.close()


def log_event(level: int, message: str, **fields: Any) -> None:
    """Log ``message`` with ``fields`` as the JSON event (``event`` names its kind)."""
    EVENTS.log(level, message, extra={_EVENT_KEY: fields})


def log_decision(round_index: int, decision: Decision, dry_run: bool) -> None:
    log_event(
        logging.INFO,
        f"[round={round_index} job={decision.sia_id}] {decision.action} "
        f"{decision.before} -> {decision.after}"
        + (f" batch={decision.batch_size}" if decision.batch_size else "")
        + (f" ({decision.note})" if decision.note else ""),
        event="decision",
        round=round_index,
        job=decision.sia_id,
        dry_run=dry_run,
        phase=decision.phase,
        action=decision.action,
        before=decision.before,
        after=decision.after,
        batch_size=decision.batch_size,
        local_bsz=decision.local_bsz,
        accum_steps=decision.accum_steps,
        goodput=round(decision.goodput, 6),
        throughput=round(decision.throughput, 6),
        note=decision.note,
    )


def action_fields(action: Action) -> dict[str, Any]:
    """The loggable fields of an action (its target, for the ones that have one)."""
    fields: dict[str, Any] = {"kind": action_kind(action)}
    if isinstance(action, Start | Move):
        fields["config"] = str(action.config)
        fields["nodes"] = ",".join(f"{s.node}:{s.gpus}" for s in action.placement)
        if action.profile_sweep:  # a profiling run (docs/profiling.md)
            fields["profile_sweep"] = ",".join(str(b) for b in action.profile_sweep)
    if isinstance(action, Start | Move | Rebatch):
        fields["batch_size"] = action.batch.batch_size
        fields["local_bsz"] = action.batch.local_bsz
        fields["accum_steps"] = action.batch.accum_steps
    return fields


def log_action(action: Action, result: str, message: str = "", *, journal_id: int = 0) -> None:
    """One line per action: ``result`` is done, failed, pending (crash recovery) or dry-run."""
    level = logging.WARNING if result == "failed" else logging.INFO
    fields = action_fields(action)
    text = f"[round={action.round_index} job={action.sia_id}] {fields['kind']}"
    if "config" in fields:
        text += f" {fields['config']} on {fields['nodes']}"
    text += f": {result}" + (f" ({message})" if message else "")
    log_event(
        level,
        text,
        event="action",
        round=action.round_index,
        job=action.sia_id,
        result=result,
        result_message=message,
        journal_id=journal_id,
        **fields,
    )
