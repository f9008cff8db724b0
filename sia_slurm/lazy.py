"""Package re-exports imported on first use (PEP 562).

The job side (``sia-launch`` and the trainers) imports a few light modules of the model and the
simulator on every start; their packages re-export the heavy ones too (fitting with
scipy.optimize, the policies). Importing those eagerly cost about half a CPU-second per process,
which a dev cluster emulating many GPUs on a few cores pays on every restart.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(
    package: str, module_of: Mapping[str, str], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's ``__getattr__`` and ``__dir__`` for names that live in its submodules.

    ``module_of`` maps each exported name to its submodule (relative to ``package``); a name is
    imported when first read and then cached in the package's ``namespace``.
    """

    def __getattr__(name: str) -> Any:
        module = module_of.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace) | set(module_of))

    return __getattr__, __dir__
