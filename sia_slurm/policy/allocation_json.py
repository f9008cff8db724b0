"""A policy's previous :class:`~sia_slurm.policy.base.Allocation` as a versioned JSON document
(memory format 3), so the controller's memory outlives an upgrade of sia-slurm.

Why not pickle: a pickle names internal classes and their fields as they were when it was
written, so any release that renamed or reshaped one made every saved allocation unreadable,
and formats 1 and 2 were therefore dropped at every upgrade (Gavel's time credits and Pollux's
warm start reset). This document names only what it means; a later release that changes it
bumps :data:`FORMAT` and converts the earlier documents.

The document (every key required, no other key allowed; numbers are JSON numbers, and a float
that is not finite is written as Python's ``json`` writes it: ``NaN``, ``Infinity``)::

    {
      "time": 600.0,                      # Allocation.time, seconds (the round's clock)
      "round_index": 10,                  # the round that made it
      "jobs": {                           # per job id, its share of that round
        "j1": {"gpu_type": "a100", "nodes": 1, "gpus": 2,
               "batch_size": 256, "local_bsz": 128, "accum_steps": 0,
               "goodput": 1234.5, "throughput": 1500.0}
      },
      "info": {"status": "optimal", "solve_seconds": 0.01, "message": ""},
      "node_hints": {"j1": [["a100-1", 2]]},   # per job, [node, GPUs] pairs
      "hints_move_jobs": false,
      "state": {"kind": "none"}           # the policy's own memory, one of:
    }

Objects keep the allocation's order (jobs, hints, Gavel's credits), so that a policy that reads
its memory in order reads it as the live process did.

``state`` by ``kind``:

* ``"none"``: no memory (Sia, FIFO, and Pollux's empty rounds);
* ``"gavel"`` (:class:`~sia_slurm.policy.gavel.GavelState`): ``received`` (job -> type ->
  seconds credited), ``round_start`` (seconds) and ``type_time`` (type -> seconds credited over
  every job ever seen);
* ``"pollux"`` (:class:`~sia_slurm.policy.pollux.PolluxState`): ``job_ids``, ``node_names``
  and ``replicas``, the replica matrix as one list of non-negative integers per job, one entry
  per node.

:func:`allocation_from_json` is strict: anything missing, extra or of the wrong type raises a
:class:`ValueError` naming the field (``jobs.j1.gpus: expected an integer, got 'two'``), so a
damaged document starts the policy fresh instead of steering it wrong.

:func:`legacy_document` turns an allocation unpickled from memory format 2 (sia-slurm before
format 3) into this document; it reads attributes only, so a field added to a class since
(with its default) reads as that default.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import numpy as np

from sia_slurm.core import Configuration, NodeShare
from sia_slurm.policy.base import Allocation, JobAllocation, SolveInfo
from sia_slurm.policy.gavel import GavelState
from sia_slurm.policy.pollux import PolluxState

FORMAT = 3  # the memory format this module writes (sia_slurm.state.memory.MEMORY_FORMAT)

_TOP = ("time", "round_index", "jobs", "info", "node_hints", "hints_move_jobs", "state")
_JOB = ("gpu_type", "nodes", "gpus", "batch_size", "local_bsz", "accum_steps", "goodput")
_JOB_KEYS = (*_JOB, "throughput")
_INFO = ("status", "solve_seconds", "message")
_STATE_KEYS = {
    "none": ("kind",),
    "gavel": ("kind", "received", "round_start", "type_time"),
    "pollux": ("kind", "job_ids", "node_names", "replicas"),
}


# ----------------------------------------------------------------------------------------------
# Encoding


def allocation_to_json(allocation: Allocation) -> dict[str, Any]:
    """``allocation`` as the document above (plain dicts, lists, strings and numbers)."""
    return {
        "time": float(allocation.time),
        "round_index": int(allocation.round_index),
        "jobs": {job: _share_to_json(share) for job, share in allocation.jobs.items()},
        "info": {
            "status": allocation.info.status,
            "solve_seconds": float(allocation.info.solve_seconds),
            "message": allocation.info.message,
        },
        "node_hints": {
            job: [[share.node, int(share.gpus)] for share in shares]
            for job, shares in allocation.node_hints.items()
        },
        "hints_move_jobs": bool(allocation.hints_move_jobs),
        "state": state_to_json(allocation.state),
    }


def _share_to_json(share: JobAllocation) -> dict[str, Any]:
    return {
        "gpu_type": share.config.gpu_type,
        "nodes": int(share.config.nodes),
        "gpus": int(share.config.gpus),
        "batch_size": int(share.batch_size),
        "local_bsz": int(share.local_bsz),
        "accum_steps": int(share.accum_steps),
        "goodput": float(share.goodput),
        "throughput": float(share.throughput),
    }


def state_to_json(state: object) -> dict[str, Any]:
    """A policy's own memory with its ``kind`` tag; a kind this module does not know is a
    :class:`TypeError` (a new policy state must be given a documented encoding here)."""
    if state is None:
        return {"kind": "none"}
    if isinstance(state, GavelState):
        return {
            "kind": "gavel",
            "received": {
                job: {t: float(s) for t, s in types.items()}
                for job, types in state.received.items()
            },
            "round_start": float(state.round_start),
            "type_time": {t: float(s) for t, s in state.type_time.items()},
        }
    if isinstance(state, PolluxState):
        return {
            "kind": "pollux",
            "job_ids": list(state.job_ids),
            "node_names": list(state.node_names),
            "replicas": [[int(v) for v in row] for row in np.asarray(state.replicas)],
        }
    raise TypeError(
        f"no JSON encoding for policy state {type(state).__name__}; "
        f"known: None, GavelState, PolluxState (sia_slurm/policy/allocation_json.py)"
    )


# ----------------------------------------------------------------------------------------------
# Decoding


def allocation_from_json(data: Any, where: str = "allocation") -> Allocation:
    """The :class:`Allocation` the document ``data`` describes; a :class:`ValueError` naming the
    field (prefixed by ``where``) on anything the document must not hold."""
    top = _object(data, where, _TOP)
    jobs = {
        job: _share_from_json(item, f"{where}.jobs.{job}")
        for job, item in _mapping(top["jobs"], f"{where}.jobs").items()
    }
    info = _object(top["info"], f"{where}.info", _INFO)
    hints = {
        job: _hints(item, f"{where}.node_hints.{job}")
        for job, item in _mapping(top["node_hints"], f"{where}.node_hints").items()
    }
    return Allocation(
        jobs=jobs,
        time=_float(top["time"], f"{where}.time"),
        round_index=_int(top["round_index"], f"{where}.round_index"),
        state=state_from_json(top["state"], f"{where}.state"),
        info=SolveInfo(
            _str(info["status"], f"{where}.info.status"),
            _float(info["solve_seconds"], f"{where}.info.solve_seconds"),
            _str(info["message"], f"{where}.info.message"),
        ),
        node_hints=hints,
        hints_move_jobs=_bool(top["hints_move_jobs"], f"{where}.hints_move_jobs"),
    )


def _share_from_json(data: Any, where: str) -> JobAllocation:
    item = _object(data, where, _JOB_KEYS)
    nodes, gpus = _int(item["nodes"], f"{where}.nodes"), _int(item["gpus"], f"{where}.gpus")
    if not 1 <= nodes <= gpus:
        raise ValueError(f"{where}: expected 1 <= nodes <= gpus, got nodes={nodes} gpus={gpus}")
    return JobAllocation(
        config=Configuration(_str(item["gpu_type"], f"{where}.gpu_type"), nodes, gpus),
        batch_size=_int(item["batch_size"], f"{where}.batch_size"),
        local_bsz=_int(item["local_bsz"], f"{where}.local_bsz"),
        accum_steps=_int(item["accum_steps"], f"{where}.accum_steps"),
        goodput=_float(item["goodput"], f"{where}.goodput"),
        throughput=_float(item["throughput"], f"{where}.throughput"),
    )


def _hints(data: Any, where: str) -> tuple[NodeShare, ...]:
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a list of [node, GPUs] pairs, got {data!r:.80}")
    shares = []
    for i, pair in enumerate(data):
        if not isinstance(pair, list) or len(pair) != 2:
            raise ValueError(f"{where}[{i}]: expected a [node, GPUs] pair, got {pair!r:.80}")
        shares.append(
            NodeShare(_str(pair[0], f"{where}[{i}][0]"), _int(pair[1], f"{where}[{i}][1]"))
        )
    return tuple(shares)


def state_from_json(data: Any, where: str = "state") -> GavelState | PolluxState | None:
    """The policy memory ``data`` describes (see the module docstring for each ``kind``)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object with a kind, got {data!r:.80}")
    kind = data.get("kind")
    if kind not in _STATE_KEYS:
        known = ", ".join(repr(k) for k in _STATE_KEYS)
        raise ValueError(f"{where}.kind: expected one of {known}, got {kind!r:.80}")
    _object(data, where, _STATE_KEYS[kind])
    if kind == "gavel":
        received = {
            job: MappingProxyType(_seconds(types, f"{where}.received.{job}"))
            for job, types in _mapping(data["received"], f"{where}.received").items()
        }  # read-only, as GavelPolicy makes it
        return GavelState(
            MappingProxyType(received),
            _float(data["round_start"], f"{where}.round_start"),
            MappingProxyType(_seconds(data["type_time"], f"{where}.type_time")),
        )
    if kind == "pollux":
        return _pollux(data, where)
    return None


def _pollux(data: dict[str, Any], where: str) -> PolluxState:
    job_ids = _strings(data["job_ids"], f"{where}.job_ids")
    node_names = _strings(data["node_names"], f"{where}.node_names")
    rows = data["replicas"]
    if not isinstance(rows, list) or len(rows) != len(job_ids):
        raise ValueError(
            f"{where}.replicas: expected {len(job_ids)} rows (one per job id), got {rows!r:.80}"
        )
    matrix = np.zeros((len(job_ids), len(node_names)), dtype=np.int64)
    for j, row in enumerate(rows):
        if not isinstance(row, list) or len(row) != len(node_names):
            raise ValueError(
                f"{where}.replicas[{j}]: expected {len(node_names)} GPU counts (one per node), "
                f"got {row!r:.80}"
            )
        for n, value in enumerate(row):
            count = _int(value, f"{where}.replicas[{j}][{n}]")
            if count < 0:
                raise ValueError(f"{where}.replicas[{j}][{n}]: expected >= 0, got {count}")
            matrix[j, n] = count
    return PolluxState(job_ids, node_names, matrix)


# ----------------------------------------------------------------------------------------------
# Memory format 2: an Allocation unpickled by an earlier release's classes


def legacy_document(loaded: object) -> dict[str, Any]:
    """The format-3 document of an allocation unpickled from memory format 2.

    A pickle restores an object's attributes as they were saved, without ``__init__``: a field
    added since is missing from the instance and reads as its class default here (none was
    removed between format 2 and 3). Whatever does not fit is left to
    :func:`allocation_from_json`'s checks, which the caller applies to the result.
    """
    if not isinstance(loaded, Allocation):
        raise ValueError(f"expected a pickled Allocation, got {type(loaded).__name__}")
    info = _attribute(loaded, "info", SolveInfo("optimal"))
    return {
        "time": _attribute(loaded, "time", 0.0),
        "round_index": _attribute(loaded, "round_index", 0),
        "jobs": {
            job: _legacy_share(share, job)
            for job, share in dict(_attribute(loaded, "jobs")).items()
        },
        "info": {
            "status": _attribute(info, "status"),
            "solve_seconds": _attribute(info, "solve_seconds", 0.0),
            "message": _attribute(info, "message", ""),
        },
        "node_hints": {
            job: [[_attribute(s, "node"), _attribute(s, "gpus")] for s in shares]
            for job, shares in dict(_attribute(loaded, "node_hints", {})).items()
        },
        "hints_move_jobs": _attribute(loaded, "hints_move_jobs", False),
        "state": _legacy_state(_attribute(loaded, "state", None)),
    }


def _legacy_state(state: object) -> dict[str, Any]:
    fields = {GavelState: _STATE_KEYS["gavel"], PolluxState: _STATE_KEYS["pollux"]}
    for name in fields.get(type(state), ("kind",))[1:]:
        _attribute(state, name)  # a ValueError naming what the pickle lacks
    try:
        return state_to_json(state)
    except TypeError as exc:
        raise ValueError(str(exc)) from None


def _legacy_share(share: object, job: str) -> dict[str, Any]:
    if not isinstance(share, JobAllocation):
        raise ValueError(f"jobs.{job}: expected a JobAllocation, got {type(share).__name__}")
    config = _attribute(share, "config")
    return {
        "gpu_type": _attribute(config, "gpu_type"),
        "nodes": _attribute(config, "nodes"),
        "gpus": _attribute(config, "gpus"),
        **{key: _attribute(share, key) for key in _JOB[3:]},
        "throughput": _attribute(share, "throughput", 0.0),
    }


_MISSING = object()


def _attribute(obj: object, name: str, default: Any = _MISSING) -> Any:
    """``obj.name`` as the pickle restored it, else ``default``; a ValueError if neither."""
    value = getattr(obj, name, default)
    if value is _MISSING:
        raise ValueError(f"{type(obj).__name__}.{name}: missing from the pickled allocation")
    return value


# ----------------------------------------------------------------------------------------------
# Strict readers


def _object(data: Any, where: str, keys: tuple[str, ...]) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {data!r:.80}")
    missing = [key for key in keys if key not in data]
    if missing:
        raise ValueError(f"{where}: missing {', '.join(missing)}")
    extra = sorted(str(key) for key in data if key not in keys)
    if extra:
        raise ValueError(f"{where}: unexpected {', '.join(extra)}; expected {', '.join(keys)}")
    return data


def _mapping(data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {data!r:.80}")
    return data


def _seconds(data: Any, where: str) -> dict[str, float]:
    return {key: _float(value, f"{where}.{key}") for key, value in _mapping(data, where).items()}


def _strings(data: Any, where: str) -> tuple[str, ...]:
    if not isinstance(data, list):
        raise ValueError(f"{where}: expected a list of strings, got {data!r:.80}")
    return tuple(_str(value, f"{where}[{i}]") for i, value in enumerate(data))


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{where}: expected a string, got {value!r:.80}")
    return value


def _int(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{where}: expected an integer, got {value!r:.80}")
    return int(value)


def _float(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise ValueError(f"{where}: expected a number, got {value!r:.80}")
    return float(value)


def _bool(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{where}: expected true or false, got {value!r:.80}")
    return value
