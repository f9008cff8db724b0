"""Parse what Slurm says about jobs (``squeue --json``) and reservations (``scontrol show res``).

``squeue --json`` exists from 21.08 on, but its fields change shape between versions; every
reader here accepts all the forms seen so far. Captured from real daemons (22.05.8, 24.11.5,
26.05.5: ``tests/fixtures/slurm-<release>/``, ``scripts/capture_slurm_fixtures.py``):

* ``job_state``: a string on 22.05 (``"RUNNING"``; a completing job is ``"COMPLETING"`` alone,
  one whose powered-down nodes boot ``"CONFIGURING"`` alone), a list of a base state and flags
  on 24.11 and 26.05 (``["CANCELLED", "COMPLETING"]``, ``["RUNNING", "CONFIGURING",
  "POWER_UP_NODE"]``); documented as a list from 23.11 on;
* numbers (``priority``, ``submit_time``, ``node_count``, ``time_limit``...): plain on 22.05,
  ``{"set": true, "infinite": false, "number": 5}`` on 24.11 and 26.05; ``job_id``,
  ``user_id``, ``restart_cnt`` stay plain numbers on all three;
* ``tres_per_node``: ``gres:gpu:2`` / ``gres:gpu:rtx:3`` on 22.05, ``gres/gpu:2`` /
  ``gres/gpu:rtx:3`` on 24.11 and 26.05 (``gres/gpu=4`` / ``gres/gpu:a100=4`` in allocated TRES
  strings, from documentation); ``gres_detail`` has one item ``gpu:a100:2(IDX:0-1)`` per
  allocated node on all three, and is empty while a job completes;
* ``comment``: a string on all three (a ``{"job": ...}`` object only in documentation);
* held: reason ``JobHeldUser``/``JobHeldAdmin`` and priority 0 on all three (24.11 and 26.05
  also print ``"hold": true``; the rule below gives the same answer on every capture);
* ``time_limit``: unlimited is ``null`` (22.05) or ``infinite`` (24.11, 26.05); on 26.05 a job
  without a limit that the *backfill* scheduler started reads 525600 (365 days: Slurm writes
  it into the job), which is Slurm's value, not a parse error;
* ``standard_output``: the pattern as submitted (``.../%j.out``) on 22.05 and 26.05, the
  expanded path (``.../8.out``) on 24.11 (26.05 adds ``stdout_expanded``).

A job record that cannot be understood is skipped and named in ``SqueueResult.problems``
(with the raw value), so one odd job never hides the others. Pure functions.
"""

from __future__ import annotations

import gc
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sia_slurm.slurm.observe.hostlist import expand_hostlist
from sia_slurm.slurm.records import parse_records

# Base job states (Slurm's job_state_string); anything else in a state list is a flag.
BASE_STATES = frozenset(
    {
        "PENDING",
        "RUNNING",
        "SUSPENDED",
        "COMPLETED",
        "CANCELLED",
        "FAILED",
        "TIMEOUT",
        "NODE_FAIL",
        "PREEMPTED",
        "BOOT_FAIL",
        "DEADLINE",
        "OUT_OF_MEMORY",
    }
)
FINISHED_STATES = BASE_STATES - {"PENDING", "RUNNING", "SUSPENDED"}
_HELD_REASONS = frozenset({"JobHeldUser", "JobHeldAdmin", "job_requeued_in_held_state"})
_GRES_DETAIL = re.compile(r"^gpu(?::(?P<type>[^:()]+))?:(?P<count>\d+)")
_TRES_GPU = re.compile(r"(?:^|,)gres[:/]gpu(?::(?P<type>[^:=,]+))?[:=](?P<count>\d+)(?=,|$)")


class SlurmParseError(ValueError):
    """Slurm's output is not what any supported version prints (the message quotes it)."""


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue --json`` describes it, normalised across Slurm versions.

    ``state`` is the base state (``RUNNING``); ``flags`` the rest (``COMPLETING``,
    ``REQUEUE_HOLD``...). 22.05 reports a completing job with state ``COMPLETING`` alone, which
    becomes state ``COMPLETING`` with the flag too. ``gpus_per_node`` has one entry per
    allocated node (in ``nodes`` order) while the job holds GPUs, else is empty;
    ``requested_gpus_per_node`` is what the job asks per node (``tres_per_node``).
    """

    job_id: str
    name: str
    state: str
    flags: tuple[str, ...]
    reason: str
    comment: str
    partition: str
    nodes: tuple[str, ...]
    node_count: int
    tasks: int
    cpus: int
    gpus_per_node: tuple[int, ...]
    requested_gpus_per_node: int
    required_nodes: tuple[str, ...]
    restart_count: int
    held: bool
    submit_time: float
    start_time: float
    end_time: float
    user_id: int
    group_id: int
    working_dir: str = ""
    stdout: str = ""
    stderr: str = ""
    stdin: str = ""
    time_limit_min: int | None = None  # None: unlimited
    account: str = ""
    qos: str = ""
    # Slurm's BeginTime (``details->begin_time``): after a requeue, the kill's second plus
    # cred_expire + 1. ``start_time`` is the same while that lies ahead, 0 for a held job once
    # it has passed, and the backfill scheduler's estimate for a released one (a year ahead
    # when the running jobs have no time limit), so only this field says when the requeue was.
    eligible_time: float = 0.0
    # squeue's own ``cpus_per_task`` (24.11 and 26.05 fill it; 22.05 leaves it out): 0 unknown.
    cpus_per_task_field: int = 0

    @property
    def cpus_per_task(self) -> int:
        """CPUs per task: Slurm's own field where it prints one (24.11, 26.05), else from the
        job's CPU and task counts (22.05's ``cpus_per_task`` field stays empty even for
        ``--cpus-per-task``). The counts mislead on 24.11 and 26.05 after a running job's
        owner shrank it (``NumNodes=1``) and it was requeued: ``NumTasks`` 1 but ``NumCPUs``
        still 2, which made a reshape ask 2 CPUs per task and left the job BadConstraints
        (tests/e2e/test_security_live.py)."""
        if self.cpus_per_task_field > 0:
            return self.cpus_per_task_field
        return max(1, self.cpus // self.tasks) if self.tasks > 0 else 1

    @property
    def completing(self) -> bool:
        return "COMPLETING" in self.flags or self.state == "COMPLETING"

    @property
    def finished(self) -> bool:
        return self.state in FINISHED_STATES and not self.completing

    @property
    def holds_gpus(self) -> bool:
        """Whether the job's GPUs are taken: running, suspended, or still completing."""
        return self.state in ("RUNNING", "SUSPENDED") or self.completing

    def gpus_on(self, node: str) -> int:
        """GPUs this job holds on ``node`` (0 when it holds none there)."""
        if not self.holds_gpus or node not in self.nodes:
            return 0
        if self.gpus_per_node:
            return self.gpus_per_node[self.nodes.index(node)]
        return self.requested_gpus_per_node


@dataclass(frozen=True)
class SqueueResult:
    jobs: tuple[SlurmJob, ...]
    problems: tuple[str, ...] = ()


@dataclass(frozen=True)
class Reservation:
    name: str
    active: bool
    nodes: tuple[str, ...]


# ------------------------------------------------------------------------------------------------
# squeue --json


def parse_squeue_json(text: str) -> SqueueResult:
    """All jobs of ``squeue --json`` output (any version from 22.05 on).

    Python's cyclic garbage collector is paused while the output is decoded and parsed: the
    decoder builds hundreds of thousands of dicts and lists (60 MB for 10,000 jobs on 24.11),
    none of them in a cycle, and the collector's passes over that growing heap cost three times
    the parse itself (``benchmarks/bench_parse.py``: 2.2 s -> 0.65 s of CPU at 10,000 jobs).
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _parse_squeue_json(text)
    finally:
        if enabled:
            gc.enable()


def _parse_squeue_json(text: str) -> SqueueResult:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as exc:
        raise SlurmParseError(f"squeue --json: not JSON ({exc}): {text[:200]!r}") from None
    if not isinstance(payload, dict) or not isinstance(payload.get("jobs"), list):
        raise SlurmParseError(f"squeue --json: no 'jobs' list in {text[:200]!r}")
    errors = payload.get("errors") or []
    if errors:
        raise SlurmParseError(f"squeue --json reported errors: {errors!r}")
    jobs, problems = [], []
    for raw in payload["jobs"]:
        try:
            jobs.append(parse_job(raw))
        except (SlurmParseError, KeyError, TypeError, ValueError) as exc:
            job_id = raw.get("job_id", "?") if isinstance(raw, dict) else "?"
            problems.append(f"squeue job {job_id}: skipped: {exc}")
    return SqueueResult(tuple(jobs), tuple(problems))


def parse_job(raw: Mapping[str, Any]) -> SlurmJob:
    """One job object of ``squeue --json``; :class:`SlurmParseError` names the bad field."""
    if not isinstance(raw, Mapping):
        raise SlurmParseError(f"expected a job object, got {raw!r}")
    state, flags = job_state(raw.get("job_state"))
    nodes = expand_hostlist(_text(raw, "nodes"))
    detail = gres_detail_gpus(raw.get("gres_detail") or [])
    if detail and len(detail) != len(nodes):
        raise SlurmParseError(
            f"gres_detail has {len(detail)} entries for {len(nodes)} nodes: "
            f"{raw.get('gres_detail')!r} vs {raw.get('nodes')!r}"
        )
    requested = tres_gpus(_text(raw, "tres_per_node"))
    if not detail and not requested and nodes:
        total = tres_gpus(_text(raw, "tres_alloc_str"))
        requested = total // len(nodes) if total else 0
    reason = _text(raw, "state_reason")
    priority = number(raw.get("priority"))
    limit = number(raw.get("time_limit"))
    return SlurmJob(
        job_id=str(_int(raw, "job_id")),
        name=_text(raw, "name"),
        state=state,
        flags=flags,
        reason=reason,
        comment=_comment(raw.get("comment")),
        partition=_text(raw, "partition"),
        nodes=nodes,
        node_count=int(number(raw.get("node_count")) or len(nodes)),
        tasks=int(number(raw.get("tasks")) or 0),
        cpus=int(number(raw.get("cpus")) or 0),
        cpus_per_task_field=int(number(raw.get("cpus_per_task")) or 0),
        gpus_per_node=detail,
        requested_gpus_per_node=requested,
        required_nodes=expand_hostlist(_text(raw, "required_nodes")),
        restart_count=int(number(raw.get("restart_cnt")) or 0),
        held=state == "PENDING"
        and (reason in _HELD_REASONS or priority == 0 or "REQUEUE_HOLD" in flags),
        submit_time=float(number(raw.get("submit_time")) or 0),
        start_time=float(number(raw.get("start_time")) or 0),
        end_time=float(number(raw.get("end_time")) or 0),
        user_id=_int(raw, "user_id"),
        group_id=_int(raw, "group_id"),
        working_dir=_text(raw, "current_working_directory"),
        stdout=_text(raw, "standard_output"),
        stderr=_text(raw, "standard_error"),
        stdin=_text(raw, "standard_input"),
        time_limit_min=None if limit is None else int(limit),
        account=_text(raw, "account"),
        qos=_text(raw, "qos"),
        eligible_time=float(number(raw.get("eligible_time")) or 0),
    )


def job_state(value: Any) -> tuple[str, tuple[str, ...]]:
    """``(base state, flags)`` from a state string (22.05) or list (24.11, 26.05)."""
    if isinstance(value, str):
        names = [value]
    elif isinstance(value, list) and value and all(isinstance(v, str) for v in value):
        names = list(value)
    else:
        raise SlurmParseError(f"job_state: expected a string or list of strings, got {value!r}")
    names = [name.upper() for name in names]
    base = [name for name in names if name in BASE_STATES]
    flags = tuple(name for name in names if name not in BASE_STATES)
    if base:
        return base[0], flags
    if "COMPLETING" in flags:  # 22.05 prints a completing job's state as COMPLETING alone
        return "COMPLETING", flags
    if "CONFIGURING" in flags:  # 22.05: a job allocated nodes that boot (RUNNING on 24.11 on)
        return "RUNNING", flags
    raise SlurmParseError(f"job_state: no known base state in {value!r}")


def number(value: Any) -> float | None:
    """A number in either encoding; ``None`` for unset or infinite."""
    kind = type(value)
    if kind is int or kind is float:  # the common cases first: 14 fields x 10,000 jobs
        return value  # type: ignore[no-any-return]
    if kind is dict or isinstance(value, Mapping):
        if not value.get("set", True) or value.get("infinite", False):
            return None
        value = value.get("number")
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value
    raise SlurmParseError(f"expected a number, got {value!r}")


def tres_gpus(text: str) -> int:
    """GPUs in a TRES string (``gres:gpu:a100:4``, ``gres/gpu=4``...); 0 when none."""
    matches = list(_TRES_GPU.finditer(text or ""))
    # Newer TRES strings list the total and each type (gres/gpu=4,gres/gpu:a100=4): count once.
    untyped = [int(m["count"]) for m in matches if not m["type"]]
    if untyped:
        return max(untyped)
    return sum(int(m["count"]) for m in matches)


def gres_detail_gpus(items: Any) -> tuple[int, ...]:
    """GPUs per allocated node from ``gres_detail`` (``["gpu:a100:2(IDX:0-1)", ...]``)."""
    if not isinstance(items, list):
        raise SlurmParseError(f"gres_detail: expected a list, got {items!r}")
    counts = []
    for item in items:
        if not isinstance(item, str):
            raise SlurmParseError(f"gres_detail: expected strings, got {item!r}")
        gpus = 0
        for part in _split_gres(item):
            match = _GRES_DETAIL.match(part)
            if match:
                gpus += int(match["count"])
        counts.append(gpus)
    return tuple(counts)


def _split_gres(item: str) -> list[str]:
    """``gpu:a100:2(IDX:0-1),shard:0`` -> its comma-separated parts outside parentheses."""
    parts, depth, current = [], 0, []
    for char in item:
        depth += char == "("
        depth -= char == ")"
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise SlurmParseError(f"{key}: expected a string, got {value!r}")
    return value


def _int(raw: Mapping[str, Any], key: str) -> int:
    value = number(raw.get(key))
    if value is None:
        raise SlurmParseError(f"{key}: missing, got {raw.get(key)!r}")
    return int(value)


def _comment(value: Any) -> str:
    """``comment``: a string (22.05, 24.11, 26.05 captured); ``{"job": ..., "administrator": ...}``
    is accepted as well (documented for newer data parsers, never seen here)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("job", ""), str):
        return value.get("job") or ""
    raise SlurmParseError(f"comment: expected a string, got {value!r}")


# ------------------------------------------------------------------------------------------------
# scontrol -o show reservation


def parse_reservations(text: str) -> tuple[Reservation, ...]:
    """Reservations from ``scontrol -o show res`` (``No reservations in the system`` = none)."""
    reservations = []
    for record in parse_records(text):
        if "ReservationName" not in record:
            raise SlurmParseError(f"not a reservation record (no ReservationName=): {record!r}")
        reservations.append(
            Reservation(
                name=record["ReservationName"],
                active=record.get("State", "").upper() == "ACTIVE",
                nodes=expand_hostlist(record.get("Nodes", "")),
            )
        )
    return tuple(reservations)
