"""The tiers stay honest (docs/testing.md, "Tiers"): a test that starts several training
processes, a browser or a wheel build is marked ``heavy`` (or is a ``slurm`` test), so that the
quick tier, ``-m "not slurm and not heavy"``, never runs one.

Read from the test modules' source, not collected: collecting the suite imports PyTorch and
every test module, seconds of the very time the quick tier leaves out. What the source shows: a
test function that calls one of the helpers below, directly or through a function of its own
module, or that takes one of the fixtures below.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import DAEMON_FIXTURES, may_select_slurm_tests

TESTS = Path(__file__).resolve().parent

# What makes a test heavy, by the name its module calls it by.
HEAVY_CALLS = {
    "run_two_ranks": "two gloo training processes (tests/job/gloo.py)",
    "run_ranks": "gloo training processes (tests/job/gloo.py)",
    "run_chromium": "a headless browser (tests/report/test_site.py)",
    "run_example": "an example trainer trained until it learns (tests/job/test_examples.py)",
}
HEAVY_FIXTURES = {
    "released": "a wheel and sdist built by scripts/release.py (tests/test_release.py)",
}


@dataclass(frozen=True)
class Found:
    """One test function as its module's source shows it."""

    path: Path
    name: str
    heavy_because: frozenset[str]  # the helpers and fixtures above that it uses
    marks: frozenset[str]  # "heavy", "slurm": its own, its module's, or a daemon fixture's

    def __str__(self) -> str:
        because = ", ".join(sorted(self.heavy_because))
        return f"{self.path.relative_to(TESTS.parent)}::{self.name} ({because})"


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _marks(expressions: list[ast.expr]) -> set[str]:
    text = " ".join(ast.unparse(expression) for expression in expressions)
    return {mark for mark in ("heavy", "slurm") if f"mark.{mark}" in text}


def _found_in(path: Path) -> Iterator[Found]:
    text = path.read_text()
    if not any(name in text for name in (*HEAVY_CALLS, *HEAVY_FIXTURES)):
        return  # most modules: nothing to parse
    module = ast.parse(text, str(path))
    functions = {node.name: node for node in module.body if isinstance(node, ast.FunctionDef)}
    names = {name: _names(function) for name, function in functions.items()}
    module_marks = set()
    for node in module.body:
        if isinstance(node, ast.Assign) and "pytestmark" in _names(node.targets[0]):
            module_marks |= _marks([node.value])
    # The heavy helpers each of the module's own helpers reaches, to a fixed point.
    reaches = {name: {name} for name in HEAVY_CALLS}
    helpers = [name for name in functions if not name.startswith("test_")]
    grew = True
    while grew:
        grew = False
        for helper in helpers:
            found = set().union(*(reaches.get(name, set()) for name in names[helper]))
            if not found <= reaches.get(helper, set()):
                reaches[helper] = reaches.get(helper, set()) | found
                grew = True
    for name, test in functions.items():
        if not name.startswith("test_"):
            continue
        arguments = {argument.arg for argument in test.args.args}
        because = set().union(*(reaches.get(used, set()) for used in names[name]))
        because |= arguments & set(HEAVY_FIXTURES)
        marks = module_marks | _marks(test.decorator_list)
        if arguments & DAEMON_FIXTURES:
            marks.add("slurm")
        yield Found(path, name, frozenset(because), frozenset(marks))


def found() -> list[Found]:
    return [test for path in sorted(TESTS.rglob("test_*.py")) for test in _found_in(path)]


def test_no_test_that_starts_processes_a_browser_or_a_build_is_in_the_inner_loop() -> None:
    tests = found()
    unmarked = [str(test) for test in tests if test.heavy_because and not test.marks]
    assert unmarked == [], "mark these @pytest.mark.heavy (docs/testing.md, 'Tiers'):\n" + (
        "\n".join(unmarked)
    )
    # A helper renamed or gone would leave the check looking at nothing.
    used = set().union(*(test.heavy_because for test in tests))
    assert used == set(HEAVY_CALLS) | set(HEAVY_FIXTURES)


@pytest.mark.parametrize(
    ("expression", "parallel"),
    [
        ("not slurm", True),
        ("not slurm and not heavy", True),
        ("heavy and not slurm", True),
        (None, False),
        ("", False),
        ("slurm", False),
        ("slurm and not one_release", False),
        ("one_release", False),
        ("heavy", False),  # as an expression, it does not rule a slurm test out
        ("not slurm or heavy", False),
        ("not (slurm", False),  # pytest refuses it itself
    ],
)
def test_a_session_runs_on_every_core_only_if_it_can_select_no_slurm_test(
    expression: str | None, parallel: bool
) -> None:
    """``-n auto``: the live tests share a dev cluster, a session fixture of one process."""
    assert may_select_slurm_tests(expression) is not parallel
