"""Making user text safe to show: every control character becomes a visible escape.

Much of what sia-slurm shows was written by a cluster's users, not its administrator: a job's
``spec.json`` (``app``, ``command``, ``profile``, ``checkpoint_dir``), the ``message`` of its
metrics, exit and refusal files, and Slurm's job names, comments, accounts and users. Shown raw,
such text reaches an administrator's terminal as escape sequences (``ESC [2J`` clears the
screen, an OSC 8 sequence hides a link behind innocent text, ``CR`` overwrites what came
before) and forges lines in a log (a newline starts what looks like a record of its own). Bidi
overrides do the same to what a terminal or browser shows without being control characters.

:func:`printable` is applied where text leaves the program (the CLI, the plain-text log
formatter, the dashboard, the Prometheus textfile), not where it is read, so every value keeps
its exact bytes in the state database and in JSON output, whose own escaping already covers
control characters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_SHORT = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

# Unicode category Cc is exactly C0 (U+0000-U+001F), DEL (U+007F) and C1 (U+0080-U+009F).
_CONTROL = [*range(0x00, 0x20), *range(0x7F, 0xA0)]
# Bidi embeddings, overrides and isolates reorder the text around them; U+2028 and U+2029 end a
# line for str.splitlines() and for JavaScript, so a "one line" holding them would be two.
_REORDERING_OR_BREAKING = [*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029]
# A lone surrogate cannot be written as UTF-8 at all: printed raw it raises, not shows.
_SURROGATES = [*range(0xD800, 0xE000)]


def _escape(code: int) -> str:
    char = chr(code)
    if char in _SHORT:
        return _SHORT[char]
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


_ONE_LINE: Mapping[int, str] = {
    c: _escape(c) for c in _CONTROL + _REORDERING_OR_BREAKING + _SURROGATES
}
_MULTI_LINE: Mapping[int, str] = {c: e for c, e in _ONE_LINE.items() if chr(c) not in ("\n", "\t")}


def printable(text: str, *, one_line: bool = True) -> str:
    """``text`` with every control character and bidi override replaced by a visible escape.

    ESC becomes the four characters ``\\x1b``, a newline ``\\n``, a carriage return ``\\r``,
    a tab ``\\t``, a bidi override such as U+202E ``\\u202e``; everything else, a backslash
    included, is left as it is, so ordinary text is unchanged and the escaped form reads like a
    Python string literal. ``one_line=False`` keeps newlines and tabs, for text whose lines are
    meant (a traceback); a carriage return is escaped even then, since it overwrites a line.
    """
    return text.translate(_ONE_LINE if one_line else _MULTI_LINE)


def printable_json(value: Any) -> Any:
    """A JSON-like document (dicts, lists, tuples as lists) with every string in it, keys
    included, passed through :func:`printable`; numbers, booleans and ``None`` as they are.
    For documents shown to people (a log record's fields, the dashboard's data), where
    ``json.dumps``'s own escaping would keep the file valid but hand the raw text back to
    whoever reads it with ``jq -r`` or a browser."""
    if isinstance(value, str):
        return printable(value)
    if isinstance(value, Mapping):
        return {printable(str(k)): printable_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [printable_json(v) for v in value]
    return value
