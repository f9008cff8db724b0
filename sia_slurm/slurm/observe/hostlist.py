"""Slurm host lists: ``a100-[1-2,4],rtx-1`` <-> ``("a100-1", "a100-2", "a100-4", "rtx-1")``.

Slurm prints node sets of jobs and reservations in this compressed form (``squeue``'s
``nodes``, ``scontrol show res``'s ``Nodes=``). Only the forms Slurm itself prints are accepted:
comma-separated items, each a name with at most one bracketed range list (zero padding kept,
``n[01-03]``). Pure functions; an unparsable list raises :class:`ValueError` quoting it.
"""

from __future__ import annotations

import re

_ITEM = re.compile(r"^(?P<prefix>[^\[\],]*)\[(?P<ranges>[^\[\]]+)\](?P<suffix>[^\[\],]*)$")
_RANGE = re.compile(r"^(?P<lo>\d+)(?:-(?P<hi>\d+))?$")


def expand_hostlist(text: str) -> tuple[str, ...]:
    """Every host name of ``text`` in order (``""`` and ``(null)`` are no hosts)."""
    text = text.strip()
    if not text or text in ("(null)", "None", "N/A"):
        return ()
    hosts: list[str] = []
    try:
        items = split_top_level(text)
    except ValueError:
        raise ValueError(f"unbalanced brackets in host list {text!r}") from None
    for item in items:
        match = _ITEM.match(item)
        if match is None:
            if "[" in item or "]" in item:
                raise ValueError(f"cannot parse host list item {item!r} in {text!r}")
            hosts.append(item)
            continue
        for part in match["ranges"].split(","):
            bounds = _RANGE.match(part.strip())
            if bounds is None:
                raise ValueError(f"cannot parse host range {part!r} in {text!r}")
            lo_text, hi_text = bounds["lo"], bounds["hi"] or bounds["lo"]
            lo, hi = int(lo_text), int(hi_text)
            if hi < lo:
                raise ValueError(f"descending host range {part!r} in {text!r}")
            width = len(lo_text) if lo_text.startswith("0") and len(lo_text) > 1 else 0
            hosts.extend(
                f"{match['prefix']}{number:0{width}d}{match['suffix']}"
                for number in range(lo, hi + 1)
            )
    return tuple(hosts)


def split_top_level(text: str, brackets: str = "[]", *, strict: bool = True) -> list[str]:
    """Split ``text`` on the commas outside ``brackets`` (its opening and closing character),
    stripped, empty items dropped: ``a[1-2],b`` for host lists, ``gpu:a100:4(S:0-1),...`` with
    ``"()"`` for GRES. ``strict``: unbalanced brackets raise ValueError."""
    opening, closing = brackets
    items, depth, current = [], 0, []
    for char in text:
        if char == opening:
            depth += 1
        elif char == closing:
            depth -= 1
        if char == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(char)
    if strict and depth != 0:
        raise ValueError(f"unbalanced brackets in {text!r}")
    items.append("".join(current))
    return [item.strip() for item in items if item.strip()]
