"""``sia_slurm.state`` only stores and loads (issue 36): none of its modules imports the
controller, the policies or the goodput model.

Checked twice: each module's own import statements (parsed, so a deferred import inside a
function counts too), and what importing each module pulls in, in a fresh interpreter (so what
the test process already imported hides nothing).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import sia_slurm.state

LOGIC = ("sia_slurm.controller", "sia_slurm.policy", "sia_slurm.model")
# Imported transitively all the same, through sia_slurm.cluster -> policy.site_accounting (the
# site's shares and limits are part of a cluster snapshot): data classes only, no solver, no fit.
VOCABULARY = ("sia_slurm.policy", "sia_slurm.policy.base", "sia_slurm.policy.limits")
VOCABULARY += ("sia_slurm.policy.shares", "sia_slurm.policy.site_accounting")
HEAVY = ("sia_slurm.controller", "sia_slurm.model", "scipy")

PACKAGE = Path(sia_slurm.state.__file__).parent
MODULES = sorted(f"sia_slurm.state.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def _imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _is_under(name: str, packages: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in packages)


def test_every_state_module_is_checked() -> None:
    assert {"sia_slurm.state.memory", "sia_slurm.state.store"} <= set(MODULES)
    assert len(MODULES) >= 6


@pytest.mark.parametrize("path", sorted(PACKAGE.glob("*.py")), ids=lambda p: p.name)
def test_no_state_module_imports_the_logic(path: Path) -> None:
    found = sorted(n for n in _imported_names(path) if _is_under(n, LOGIC))
    assert not found, f"{path.name} imports {found}"


def test_the_check_sees_an_import() -> None:
    """The parser finds both spellings, so an empty result above means something."""
    assert _is_under("sia_slurm.controller", LOGIC)
    assert not _is_under("sia_slurm.controllers", LOGIC)
    module = PACKAGE.parent / "service" / "controller_memory.py"
    assert {"sia_slurm.controller", "sia_slurm.policy.base"} <= _imported_names(module)


@pytest.mark.parametrize("module", ["sia_slurm.state", *MODULES])
def test_importing_state_pulls_in_no_controller_or_model(module: str) -> None:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(out.stdout.split())
    assert module in loaded
    heavy = sorted(n for n in loaded if _is_under(n, HEAVY))
    assert not heavy, f"{module} imports {heavy}"
    policy = sorted(n for n in loaded if _is_under(n, ("sia_slurm.policy",)))
    assert set(policy) <= set(VOCABULARY), f"{module} imports {policy}"
