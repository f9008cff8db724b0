"""The bounds of every field of every protocol document, and their table in the docs.

A document comes from a file a user can write, so before it is built every value is held to a
range (numbers) or a pattern (names that reach Slurm's command lines, file names and
terminals). :data:`FIELD_BOUNDS` is what the reader enforces; :func:`bounds_table` renders it
for ``docs/protocol.md``, and a test keeps the two the same.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace
from typing import Any

from sia_slurm.protocol.documents import (
    MAX_FAILURES,
    MAX_MESSAGE_CHARS,
    Assignment,
    ExitCause,
    JobKind,
    JobSpec,
    MetricsReport,
    RunExit,
    RunRefusal,
    StopRequest,
)

# Bounds of every field (docs/protocol.md, "Bounds of every field", is :func:`bounds_table`)
MAX_GPUS = 100_000  # GPUs (and nodes) of one job: past any cluster sia-slurm schedules
MAX_BATCH = 2**24  # samples in one global or per-GPU batch
MAX_ACCUM = 2**16  # extra micro-batches per step
MAX_SECONDS = 1e11  # a time on either clock (year 5138), or a duration
MAX_STEP_SECONDS = 86_400.0  # one micro-batch
MAX_GRAD_STAT = 1e30  # a gradient statistic (squared norm, variance)
MAX_COUNT = 2**62  # rounds, steps
MAX_RESTARTS = 10**9
MAX_UID = 2**32 - 1
MAX_SWEEP = 32  # per-GPU batches one profiling run measures

# Names that reach Slurm's command lines, file names and terminals: one printable token
# (matched whole, with ``fullmatch``: ``$`` would let a trailing newline through).
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+\-]{0,63}")
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,254}")
JOB_ID = re.compile(r"[0-9]{0,20}")  # a Slurm job id, or "" for none
_LINE = re.compile(r"[^\n\t]*")  # one line (the reader refuses the other control characters)


@dataclass(frozen=True)
class Bound:
    """What one field may hold: a number in ``[low, high]``, or a string matching ``pattern``
    (each item of a list of strings), with ``items`` the most a list may hold."""

    low: float | None = None
    high: float | None = None
    pattern: re.Pattern[str] | None = None
    says: str = ""  # the pattern in words, for messages and the docs
    items: int | None = None

    def problem(self, value: Any) -> str:
        """Why ``value`` is out of bounds, ``""`` if it is within."""
        if value is None:
            return ""
        if isinstance(value, int | float) and not isinstance(value, bool):
            if self.low is not None and value < self.low:
                return f"expected >= {_number(self.low)}, got {value!r}"
            if self.high is not None and value > self.high:
                return f"expected <= {_number(self.high)}, got {value!r}"
            return ""
        items = value if isinstance(value, list | tuple) else [value]
        if self.items is not None and len(items) > self.items:
            return f"expected at most {self.items} items, got {len(items)}"
        for item in items:
            if isinstance(item, int) and not isinstance(item, bool) and item is not value:
                problem = replace(self, items=None).problem(item)
                if problem:
                    return problem
                continue
            if (
                self.pattern is not None
                and isinstance(item, str)
                and not self.pattern.fullmatch(item)
            ):
                return f"expected {self.says}, got {item[:80]!r}"
        return ""

    def describe(self) -> str:
        if self.pattern is not None:
            return self.says + (f", at most {self.items}" if self.items is not None else "")
        span = f"{_number(self.low)} .. {_number(self.high)}"
        if self.items is not None and self.low is not None:
            return f"at most {self.items} items, each {span}"
        if self.items is not None:
            return f"at most {self.items} items"
        return span


def _number(value: float | None) -> str:
    if value is None:
        return ""
    if float(value).is_integer() and abs(value) < 1e12:
        return str(int(value))
    return f"{value:g}"


_NAME = Bound(pattern=NAME, says="a name: 1-64 letters, digits, '_', '.', '+', '-'")
_HOST = Bound(pattern=HOST, says="a host name: 1-255 letters, digits, '_', '.', '-'")
_JOB_ID = Bound(pattern=JOB_ID, says="a Slurm job id (digits) or ''")
_LINE_TEXT = Bound(pattern=_LINE, says="one line of text")
_TIME = Bound(0, MAX_SECONDS)
_ROUND = Bound(0, MAX_COUNT)
_RESTARTS = Bound(0, MAX_RESTARTS)
_GPUS = Bound(1, MAX_GPUS)
_BATCH0 = Bound(0, MAX_BATCH)
_LOCAL = Bound(1, MAX_BATCH)
_ACCUM = Bound(0, MAX_ACCUM)
_STATUS = Bound(-(2**31), 2**31 - 1)

FIELD_BOUNDS: dict[type, dict[str, Bound]] = {
    JobSpec: {
        "app": Bound(
            pattern=re.compile(f"(?:{NAME.pattern})?"),
            says=_NAME.says + ", or '' (a model profiled for this job alone)",
        ),
        "init_batch_size": _BATCH0,
        "max_batch_size": _BATCH0,
        "min_gpus": _GPUS,
        "max_gpus": _GPUS,
        "requested_gpus": _GPUS,
        "requested_gpu_type": _NAME,
        "requested_batch_size": _BATCH0,
        "restart_cost": Bound(0, MAX_STEP_SECONDS),
        "submit_time": _TIME,
        "checkpoint_dir": _LINE_TEXT,
        "command": Bound(items=1024),
        "profile": _LINE_TEXT,
        "owner_uid": Bound(0, MAX_UID),
        "max_failures": Bound(0, MAX_FAILURES),
    },
    Assignment: {
        "round_index": _ROUND,
        "gpu_type": _NAME,
        "partition": _NAME,
        "nodes": _GPUS,
        "gpus": _GPUS,
        "node_list": Bound(pattern=HOST, says=_HOST.says, items=MAX_GPUS),
        "batch_size": Bound(1, MAX_BATCH),
        "local_bsz": _LOCAL,
        "accum_steps": _ACCUM,
        "restarts": _RESTARTS,
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "not_before": _TIME,
        "profile_sweep": Bound(1, MAX_BATCH, items=MAX_SWEEP),
    },
    MetricsReport: {
        "time": _TIME,
        "gpu_type": _NAME,
        "nodes": _GPUS,
        "gpus": _GPUS,
        "local_bsz": _LOCAL,
        "accum_steps": _ACCUM,
        "step_time": Bound(0, MAX_STEP_SECONDS),
        "sync_time": Bound(0, MAX_STEP_SECONDS),
        "grad_sqr": Bound(0, MAX_GRAD_STAT),
        "grad_var": Bound(0, MAX_GRAD_STAT),
        "steps": _ROUND,
        "round_index": _ROUND,
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "node_list": Bound(pattern=HOST, says=_HOST.says, items=1024),
    },
    StopRequest: {"round_index": _ROUND, "time": _TIME},
    RunExit: {
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "cause": _NAME,
        "status": _STATUS,
        "time": _TIME,
    },
    RunRefusal: {
        "slurm_job_id": _JOB_ID,
        "slurm_restart_count": _RESTARTS,
        "node_list": Bound(pattern=HOST, says=_HOST.says, items=1024),
        "round_index": _ROUND,
        "time": _TIME,
    },
}


def bounds_table() -> str:
    """The Markdown table of every document's fields and bounds (docs/protocol.md holds it;
    a test keeps the two the same). Every string is also bounded by the reader
    (:mod:`sia_slurm.safefiles`: printable, at most 4096 characters)."""
    lines = ["| document | field | type | bounds |", "|---|---|---|---|"]
    for cls, bounds in FIELD_BOUNDS.items():
        for spec in fields(cls):
            if spec.name == "version":
                continue
            bound = bounds.get(spec.name)
            if spec.name == "sia_id":
                said = "a job id: 1-64 letters, digits, '_', '.', '-'"
            elif spec.name == "kind":
                said = ", ".join(k.value for k in JobKind)
            elif spec.name == "cause":
                said = ", ".join(c.value for c in ExitCause)
            elif bound is None:
                said = "any printable text"
            else:
                said = bound.describe()
            if spec.name == "message":
                said = f"any printable text, cut to {MAX_MESSAGE_CHARS} characters"
            kind = str(spec.type).replace("|", "\\|")  # not a column of the table
            lines.append(f"| {cls.__name__} | `{spec.name}` | `{kind}` | {said} |")
    return "\n".join(lines) + "\n"
