"""Reading CSV inputs with line numbers, so every error can say ``file:line``.

Profiles, traces and workloads are plain CSV with a header; columns may come in any order and
extra columns are ignored. Blank lines and lines starting with ``#`` are skipped. Callers turn
:class:`CsvTableError` into their own error type where they have one (e.g. ``ProfileError``).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path


class CsvTableError(ValueError):
    """A CSV file is missing, empty, lacks a column or has a ragged row."""


def read_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) for each data line, after checking the header has ``required``."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CsvTableError(f"{path}: file not found") from None
    except OSError as exc:
        raise CsvTableError(f"{path}: cannot read: {exc.strerror}") from None
    lines = [
        (number, line)
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    if not lines:
        raise CsvTableError(
            f"{path}: expected a header line ({','.join(required)}), got an empty file"
        )
    header_line, header_text = lines[0]
    header = [name.strip() for name in next(csv.reader([header_text]))]
    missing = [name for name in required if name not in header]
    if missing:
        raise CsvTableError(
            f"{path}:{header_line}: header: expected columns {','.join(required)}, "
            f"missing {','.join(missing)} (found {','.join(header)})"
        )
    for number, line in lines[1:]:
        values = [value.strip() for value in next(csv.reader([line]))]
        if len(values) != len(header):
            raise CsvTableError(
                f"{path}:{number}: row: expected {len(header)} fields ({','.join(header)}), "
                f"got {len(values)}: {line.strip()!r}"
            )
        yield number, dict(zip(header, values, strict=True))
