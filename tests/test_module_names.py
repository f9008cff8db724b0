"""Each module of the runtime package has a name of its own (issue 36, item 3): two files
called ``metrics.py`` in two rooms made a reader open both to learn which held what. A file
that needs a name already taken says what it holds instead (``controller_memory.py`` beside
``state/memory.py``)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "sia_slurm"


def test_no_two_modules_of_the_package_share_a_file_name() -> None:
    where: dict[str, list[str]] = defaultdict(list)
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name != "__init__.py" and "__pycache__" not in path.parts:
            where[path.name].append(str(path.relative_to(PACKAGE)))
    assert len(where) > 100  # the walk found the package
    assert {name: paths for name, paths in where.items() if len(paths) > 1} == {}
