"""The Slurm package's layers: observing never imports actuating, and neither imports the
backend that composes them (issue 36: ``actuate`` and ``waits`` imported ``JobsView`` from the
backend, which imports them). Read from the source, so an import under ``TYPE_CHECKING`` or
inside a function counts too."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SLURM = Path(__file__).resolve().parents[2] / "sia_slurm" / "slurm"


def imports_of(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it (``from a import b`` counts as a.b too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, f"{path}: relative import"
            assert node.module is not None
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def within(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


@pytest.mark.parametrize(
    ("layer", "forbidden"),
    [
        ("observe", ("sia_slurm.slurm.actuate", "sia_slurm.slurm.backend")),
        ("actuate", ("sia_slurm.slurm.backend",)),
    ],
)
def test_a_layer_does_not_import_the_layers_above_it(
    layer: str, forbidden: tuple[str, ...]
) -> None:
    sources = sorted((SLURM / layer).glob("*.py"))
    assert len(sources) > 1, f"no modules in {SLURM / layer}"
    found = {
        f"{path.name}: {name}"
        for path in sources
        for name in imports_of(path)
        if within(name, forbidden)
    }
    assert not found, f"{layer}/ imports {sorted(found)}"


def test_shared_plumbing_imports_no_actuation() -> None:
    for name in ("runner", "records", "commands", "slurm_conf"):
        actuating = [
            n
            for n in imports_of(SLURM / f"{name}.py")
            if within(n, ("sia_slurm.slurm.actuate", "sia_slurm.slurm.backend"))
        ]
        assert not actuating, f"{name}.py imports {actuating}"
