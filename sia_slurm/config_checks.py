"""Checks of one value of the configuration file against what its key expects, for
:mod:`sia_slurm.config`: a number, a positive number, a scalar of a dataclass field's type, a
mapping's keys, a Slurm name. Each problem is reported to the :class:`~sia_slurm.yamlsource.
YamlSource` at the value's key path (so the message names the file, the line and the key) and
the check goes on, so that one load reports every problem of the file; the config's own
structure (sections, GPU types, partitions, shares) is :mod:`sia_slurm.config`'s.
"""

from __future__ import annotations

import difflib
import math
import re
import types
from collections.abc import Collection
from dataclasses import MISSING, fields
from typing import Any, get_args, get_type_hints

from sia_slurm.yamlsource import KeyPath, YamlSource

# What Slurm accepts as a partition, GPU type (gres) or account name, and so do we.
SLURM_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_positive(value: Any, keypath: KeyPath, source: YamlSource) -> float | None:
    number = check_number(value, keypath, source)
    if number is not None and number <= 0:
        source.issue(keypath, f"expected a number > 0, got {number:g}")
        return None
    return number


def build_dataclass(
    cls: type, value: Any, keypath: KeyPath, source: YamlSource, extra_keys: tuple[str, ...] = ()
) -> Any:
    """Build a flat dataclass of scalars from ``value``, reporting unknown keys and bad types.

    A ``ValueError`` from the dataclass's own validation is reported at the first of its
    fields that the message names (so the line points at the offending key).
    """
    if value is None:
        value = {}
    if not isinstance(value, dict):
        source.issue(keypath, f"expected a mapping of settings, got {kind_of(value)}")
        return None
    hints = get_type_hints(cls)
    defaults = {f.name: (None if f.default is MISSING else f.default) for f in fields(cls)}
    check_keys(value, keypath, {k: None for k in extra_keys} | defaults, (), source)
    kwargs = {}
    ok = True
    for name, default in defaults.items():
        raw = value.get(name, default)
        converted, good = convert_scalar(raw, hints[name], (*keypath, name), source)
        ok = ok and good
        kwargs[name] = converted
    if not ok:
        return None
    try:
        return cls(**kwargs)
    except ValueError as exc:
        prefix = re.match(rf"^{cls.__name__}(?:\.(\w+))?: ", str(exc))
        message = str(exc)[prefix.end() :] if prefix else str(exc)
        places = {n: m.start() for n in defaults if (m := re.search(rf"\b{n}\b", message))}
        first = [prefix[1]] if prefix and prefix[1] else sorted(places, key=places.__getitem__)[:1]
        source.issue((*keypath, *first), message)
        return None


def convert_scalar(value: Any, hint: Any, keypath: KeyPath, source: YamlSource) -> tuple[Any, bool]:
    """``(converted, ok)`` for a scalar field typed float, int, bool, str or ``X | None``."""
    options = get_args(hint) if isinstance(hint, types.UnionType) else (hint,)
    if value is None and type(None) in options:
        return None, True
    expected = next(t for t in options if t is not type(None))
    if expected is float:
        number = check_number(value, keypath, source)
        return number, number is not None
    if expected is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value, True
        source.issue(keypath, f"expected an integer, got {kind_of(value)} {value!r}")
        return None, False
    if expected is bool:
        if isinstance(value, bool):
            return value, True
        source.issue(keypath, f"expected true or false, got {value!r}")
        return None, False
    if expected is str:
        if isinstance(value, str):
            return value, True
        source.issue(keypath, f"expected a string, got {kind_of(value)} {value!r}")
        return None, False
    raise TypeError(f"unsupported config field type {hint!r}")


def check_number(value: Any, keypath: KeyPath, source: YamlSource) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        source.issue(keypath, f"expected a number, got {kind_of(value)} {value!r}")
        return None
    return float(value)


def check_keys(
    mapping: dict[str, Any],
    keypath: KeyPath,
    allowed: Collection[str],
    required: tuple[str, ...],
    source: YamlSource,
) -> None:
    for key in mapping:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            source.issue(
                (*keypath, key), f"unknown key; {hint}valid keys here: {', '.join(allowed)}"
            )
    for key in required:
        if key not in mapping:
            where = ".".join(keypath) or "the top level"
            source.issue((*keypath, key), f"missing: this key is required in {where}")


def check_name(name: str, keypath: KeyPath, what: str, source: YamlSource) -> None:
    if not SLURM_NAME.match(name):
        source.issue(
            keypath, f"expected a {what} name of letters, digits, '_', '.' or '-', got {name!r}"
        )


def kind_of(value: Any) -> str:
    if value is None:
        return "nothing"
    return {
        dict: "a mapping",
        list: "a list",
        str: "a string",
        bool: "a boolean",
        int: "an integer",
        float: "a number",
    }.get(type(value), type(value).__name__)
