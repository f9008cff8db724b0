"""JSON forms of the values the state database keeps: actions, configurations, placements.

The journal stores each action as ``(kind, payload)`` so that a restarted controller can rebuild
the very same frozen :class:`~sia_slurm.cluster.Action` and re-apply it; decoding validates every
field and raises :class:`CodecError` naming the field, so a damaged row is reported, not guessed.
"""

from __future__ import annotations

from typing import Any

from sia_slurm.cluster import Action, BatchChoice, Move, Rebatch, Start, Stop
from sia_slurm.core import Configuration, NodeShare

ACTION_KINDS: dict[type, str] = {Start: "start", Move: "move", Stop: "stop", Rebatch: "rebatch"}


class CodecError(ValueError):
    """A stored value cannot be turned back into the object it was written from."""


def action_kind(action: Action) -> str:
    """``"start"``, ``"move"``, ``"stop"`` or ``"rebatch"``."""
    return ACTION_KINDS[type(action)]


def config_to_json(config: Configuration | None) -> dict[str, Any] | None:
    if config is None:
        return None
    return {"gpu_type": config.gpu_type, "nodes": config.nodes, "gpus": config.gpus}


def config_from_json(value: Any, where: str) -> Configuration:
    if not isinstance(value, dict):
        raise CodecError(f"{where}: expected a configuration object, got {value!r}")
    try:
        return Configuration(
            _str(value, "gpu_type", where), _int(value, "nodes", where), _int(value, "gpus", where)
        )
    except ValueError as exc:
        raise CodecError(f"{where}: {exc}") from None


def placement_to_json(placement: tuple[NodeShare, ...]) -> list[list[Any]]:
    return [[share.node, share.gpus] for share in placement]


def placement_from_json(value: Any, where: str) -> tuple[NodeShare, ...]:
    if not isinstance(value, list):
        raise CodecError(f"{where}: expected a list of [node, gpus], got {value!r}")
    shares = []
    for item in value:
        if (
            not isinstance(item, list)
            or len(item) != 2
            or not isinstance(item[0], str)
            or not _is_int(item[1])
        ):
            raise CodecError(f"{where}: expected [node, gpus], got {item!r}")
        shares.append(NodeShare(item[0], item[1]))
    return tuple(shares)


def batch_to_json(batch: BatchChoice | None) -> dict[str, int] | None:
    if batch is None:
        return None
    return {
        "batch_size": batch.batch_size,
        "local_bsz": batch.local_bsz,
        "accum_steps": batch.accum_steps,
    }


def batch_from_json(value: Any, where: str) -> BatchChoice:
    if not isinstance(value, dict):
        raise CodecError(f"{where}: expected a batch object, got {value!r}")
    return BatchChoice(
        _int(value, "batch_size", where),
        _int(value, "local_bsz", where),
        _int(value, "accum_steps", where),
    )


def action_payload(action: Action) -> dict[str, Any]:
    """Everything of ``action`` but its job and round (those have their own columns)."""
    if isinstance(action, Start | Move):
        return {
            "config": config_to_json(action.config),
            "placement": placement_to_json(action.placement),
            "batch": batch_to_json(action.batch),
        }
    if isinstance(action, Rebatch):
        return {"batch": batch_to_json(action.batch)}
    return {}


def action_from_row(
    kind: str, sia_id: str, round_index: int, payload: dict[str, Any], where: str
) -> Action:
    """Rebuild the action journaled as ``(kind, sia_id, round_index, payload)``."""
    if kind in ("start", "move"):
        cls = Start if kind == "start" else Move
        return cls(
            sia_id,
            round_index,
            config_from_json(payload.get("config"), f"{where}: config"),
            placement_from_json(payload.get("placement"), f"{where}: placement"),
            batch_from_json(payload.get("batch"), f"{where}: batch"),
        )
    if kind == "rebatch":
        return Rebatch(
            sia_id, round_index, batch_from_json(payload.get("batch"), f"{where}: batch")
        )
    if kind == "stop":
        return Stop(sia_id, round_index)
    raise CodecError(
        f"{where}: kind: expected one of {', '.join(ACTION_KINDS.values())}, got {kind!r}"
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _int(mapping: dict[str, Any], key: str, where: str) -> int:
    value = mapping.get(key)
    if not _is_int(value):
        raise CodecError(f"{where}: {key}: expected an integer, got {value!r}")
    return value  # type: ignore[return-value]


def _str(mapping: dict[str, Any], key: str, where: str) -> str:
    value = mapping.get(key)
    if not isinstance(value, str) or not value:
        raise CodecError(f"{where}: {key}: expected a non-empty string, got {value!r}")
    return value
