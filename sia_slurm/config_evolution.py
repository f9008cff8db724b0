"""Config files across releases: keys that were renamed or removed, and files that are newer.

An upgrade should not turn a working config into a refused one overnight, nor keep a renamed
setting quietly at its default. So a key in :data:`~sia_slurm.config_keys.RETIRED` is still
read for the rest of the release that retired it, with a warning that names the file, the line,
the old and the new key and the release from which the old name is an error; from that next
release on it is an error that says what to write instead. A file whose ``config_version`` is
newer than :data:`~sia_slurm.config_keys.CONFIG_VERSION` is refused with a message that says
so, instead of a list of "unknown key" errors that would send the admin hunting for typos.

Both run on the raw mapping before the loader validates it (:func:`sia_slurm.config.parse_config`),
so the loader itself only ever sees current keys.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import sia_slurm
from sia_slurm import config_keys
from sia_slurm.config_keys import CONFIG_VERSION, RetiredKey
from sia_slurm.yamlsource import KeyPath, SourceIssue, YamlSource

WARNING = "warning: "
"""How a warning's message starts, so it reads apart from an error wherever it is printed."""

_RELEASE = re.compile(r"^(\d+)\.(\d+)(?:\.\d+)?")


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version such as ``0.2.0`` or ``0.2.1.dev3``: releases of one
    minor series share their keys, so patch and pre-release parts do not matter here (no
    dependency on ``packaging`` for two numbers)."""
    found = _RELEASE.match(version)
    if found is None:
        raise ValueError(f"not a release version: {version!r} (expected MAJOR.MINOR[.PATCH])")
    return int(found[1]), int(found[2])


def error_from(key: RetiredKey) -> str:
    """The release from which ``key`` is an error: the minor release after the one that
    retired it."""
    major, minor = release(key.retired_in)
    return f"{major}.{minor + 1}.0"


def check_config_version(data: dict[str, Any], source: YamlSource) -> bool:
    """Report a bad ``config_version``; False when the file is newer than this sia-slurm reads,
    and nothing else in it should be judged (its other keys may well be unknown here)."""
    if "config_version" not in data:
        return True  # absent: written for version 1
    value = data["config_version"]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        source.issue(("config_version",), f"expected an integer >= 1, got {value!r}")
        return True
    if value > CONFIG_VERSION:
        source.issue(
            ("config_version",),
            f"{value} is newer than this sia-slurm ({sia_slurm.__version__}) reads "
            f"({CONFIG_VERSION}): upgrade sia-slurm, or use a config file written for "
            f"config_version {CONFIG_VERSION}",
        )
        return False
    return True


def retire_keys(
    data: dict[str, Any], source: YamlSource, version: str | None = None
) -> list[SourceIssue]:
    """Move renamed keys to their new names and drop removed ones, in ``data``; returns the
    warnings (keys retired in this release), adds the errors (keys retired before) to
    ``source``. ``version``: this sia-slurm's (the default), or another to judge by."""
    now = release(version or sia_slurm.__version__)
    warnings: list[SourceIssue] = []
    for key in config_keys.RETIRED:
        expired = now >= release(error_from(key))
        for keypath, holder, names in list(_occurrences(data, key.path.split("."))):
            where = ".".join(keypath)
            if key.replaced_by is None:
                message = _removed(key, expired)
            else:
                new = tuple(_substitute(key.replaced_by, names).split("."))
                value = holder[keypath[-1]]
                message = _renamed(key, keypath, value, new, expired, data, source)
            del holder[keypath[-1]]
            if message.startswith(WARNING):
                warnings.append(SourceIssue(source.path, source.line(keypath), where, message))
            else:
                source.issue(keypath, message)
    return sorted(warnings, key=lambda warning: warning.line or 0)  # in file order


def _removed(key: RetiredKey, expired: bool) -> str:
    why = f": {key.why}" if key.why else ""
    if expired:
        return f"removed in sia-slurm {key.retired_in}{why}; delete it"
    return (
        f"{WARNING}removed in sia-slurm {key.retired_in} and ignored{why}; delete it "
        f"(an error from {error_from(key)} on)"
    )


def _renamed(
    key: RetiredKey,
    old: KeyPath,
    value: Any,
    new: KeyPath,
    expired: bool,
    data: dict[str, Any],
    source: YamlSource,
) -> str:
    """Set ``value`` (the old key's) at ``new`` while the old name is still read; the message
    either way."""
    target = ".".join(new)
    if expired:
        return (
            f"renamed to {target} in sia-slurm {key.retired_in} (the old name is no longer "
            f"read since {error_from(key)}): rename it"
        )
    holder = _mapping_at(data, new[:-1])
    if holder is None:
        return f"renamed to {target} in sia-slurm {key.retired_in}, but {target} cannot be set here"
    if new[-1] in holder:
        return (
            f"renamed to {target} in sia-slurm {key.retired_in}, which this file sets too: "
            "delete the old name"
        )
    holder[new[-1]] = value
    for path, line in list(source.lines.items()):  # errors in the value point at its line
        if path[: len(old)] == old:
            source.lines.setdefault((*new, *path[len(old) :]), line)
    return (
        f"{WARNING}renamed to {target} in sia-slurm {key.retired_in}; read under its old name "
        f"until {error_from(key)}, an error from then on: rename it"
    )


def _occurrences(
    node: Any, pattern: list[str], prefix: KeyPath = (), names: dict[str, str] | None = None
) -> Iterator[tuple[KeyPath, dict[str, Any], dict[str, str]]]:
    """Each place ``pattern`` (a dotted path split, ``<name>`` matching any key) is set in
    ``node``: its key path, the mapping that holds it and the names its placeholders took."""
    names = names or {}
    if not isinstance(node, dict):
        return
    head, rest = pattern[0], pattern[1:]
    if head.startswith("<"):
        candidates = [(str(name), {**names, head: str(name)}) for name in node]
    else:
        candidates = [(head, names)] if head in node else []
    for name, bound in candidates:
        if rest:
            yield from _occurrences(node[name], rest, (*prefix, name), bound)
        else:
            yield (*prefix, name), node, bound


def _substitute(path: str, names: dict[str, str]) -> str:
    for placeholder, name in names.items():
        path = path.replace(placeholder, name)
    return path


def _mapping_at(data: dict[str, Any], keypath: KeyPath) -> dict[str, Any] | None:
    """The mapping at ``keypath``, made (empty) where absent; None where something else is."""
    node: Any = data
    for part in keypath:
        if part not in node or node[part] is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, dict):
            return None
    return node


def table_problems(
    retired: tuple[RetiredKey, ...], current: tuple[config_keys.ConfigKey, ...]
) -> list[str]:
    """What is wrong with a table of retired keys, checked against the current keys: a retired
    path still current, a replacement that is not, a placeholder the old path cannot fill, a
    release that does not parse, a key retired twice."""
    paths = {key.path for key in current}
    problems: list[str] = []
    seen: set[str] = set()
    for key in retired:
        if key.path in paths:
            problems.append(f"{key.path}: retired, yet still a current key")
        if key.path in seen:
            problems.append(f"{key.path}: retired twice")
        seen.add(key.path)
        if key.path.rsplit(".", 1)[-1].startswith("<"):
            problems.append(f"{key.path}: a retired key must end in a fixed name")
        try:
            release(key.retired_in)
        except ValueError as exc:
            problems.append(f"{key.path}: {exc}")
        if key.replaced_by is None:
            continue
        if key.replaced_by not in paths:
            problems.append(f"{key.path}: replaced by {key.replaced_by}, which is not a key")
        old_names = set(re.findall(r"<\w+>", key.path))
        if not set(re.findall(r"<\w+>", key.replaced_by)) <= old_names:
            problems.append(f"{key.path}: {key.replaced_by} names a placeholder it lacks")
    return problems
