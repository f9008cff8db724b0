"""YAML documents that remember where each key came from.

PyYAML's ``safe_load`` forgets line numbers and silently keeps the last of two duplicate keys
(so a partition mapped twice would vanish without a word). This module composes the node tree
itself, turns it into plain Python values and keeps a table from key path to line number, so
every configuration error can say ``file:line: key: ...``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

KeyPath = tuple[str, ...]


class NoAliasLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing aliases (``*name``).

    An alias is a reference to an earlier node; nested ones expand exponentially ("billion
    laughs": nine lines of aliases make a billion strings), so a 1 KiB file can take every
    gigabyte and minute there is. No file sia-slurm reads needs one: a config, a profile's
    ``app.yaml``, an accounts spec. Anchors alone are harmless and left alone."""

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"found an alias (*{event.anchor}): aliases are not allowed",
                event.start_mark,
            )  # fmt: skip
        return super().compose_node(parent, index)  # type: ignore[no-any-return]


def compose(text: str) -> yaml.Node | None:
    """The node tree of ``text``, aliases refused (:class:`NoAliasLoader`)."""
    return yaml.compose(text, Loader=NoAliasLoader)


def safe_load(text: str) -> Any:
    """``yaml.safe_load`` with aliases refused (:class:`NoAliasLoader`)."""
    return yaml.load(text, Loader=NoAliasLoader)


@dataclass(frozen=True)
class SourceIssue:
    """One problem found in a source file, located as precisely as known."""

    path: Path | None
    line: int | None
    key: str
    message: str

    def __str__(self) -> str:
        where = str(self.path) if self.path is not None else "<config>"
        if self.line is not None:
            where += f":{self.line}"
        return f"{where}: {self.key}: {self.message}" if self.key else f"{where}: {self.message}"


@dataclass
class YamlSource:
    """A parsed YAML document plus the line number of every key path."""

    path: Path | None
    data: Any
    lines: dict[KeyPath, int] = field(default_factory=dict)
    issues: list[SourceIssue] = field(default_factory=list)

    def line(self, keypath: KeyPath) -> int | None:
        """Line of ``keypath``, else of its nearest ancestor that has one."""
        while keypath:
            if keypath in self.lines:
                return self.lines[keypath]
            keypath = keypath[:-1]
        return None

    def issue(self, keypath: KeyPath, message: str) -> SourceIssue:
        found = SourceIssue(self.path, self.line(keypath), ".".join(keypath), message)
        self.issues.append(found)
        return found


def parse_yaml(text: str, path: Path | None = None) -> YamlSource:
    """Parse ``text``; syntax errors and duplicate keys become issues, never exceptions."""
    source = YamlSource(path=path, data=None)
    try:
        node = compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        problem = getattr(exc, "problem", None) or str(exc)
        source.issues.append(SourceIssue(path, line, "", f"invalid YAML: {problem}"))
        return source
    if node is not None:
        source.data = _to_python(node, (), source)
    return source


def _to_python(node: yaml.Node, keypath: KeyPath, source: YamlSource) -> Any:
    if isinstance(node, yaml.MappingNode):
        result: dict[str, Any] = {}
        for key_node, value_node in node.value:
            key = str(_scalar(key_node))
            child = (*keypath, key)
            line = key_node.start_mark.line + 1
            if key in result:
                first = source.lines[child]
                source.issues.append(
                    SourceIssue(
                        source.path,
                        line,
                        ".".join(child),
                        f"given twice (first on line {first}); each key may appear once",
                    )
                )
                continue
            source.lines[child] = line
            result[key] = _to_python(value_node, child, source)
        return result
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            child = (*keypath, str(index))
            source.lines[child] = item.start_mark.line + 1
            items.append(_to_python(item, child, source))
        return items
    return _scalar(node)


def _scalar(node: yaml.Node) -> Any:
    if not isinstance(node, yaml.ScalarNode):
        return f"<{node.id}>"
    loader = yaml.SafeLoader("")
    return loader.construct_object(node, deep=True)
