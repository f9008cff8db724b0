"""Deprecated alias of :mod:`sia_slurm.job`, the job side's package, for one release.

The job side moved from ``launcher`` to ``sia_slurm.job`` (issue 36). An upgrade does not wait
for the jobs that are running, and they still use the old name: their batch scripts, written by
an older ``sia-sbatch``, run ``python -m launcher.launch``; an older ``sia-launch`` starts
``python -m launcher.agent``; users' training scripts do ``from launcher.elastic import ...``;
console scripts installed before the upgrade call ``launcher.sbatch:main``. So every
``launcher.X`` resolves here to the very module object ``sia_slurm.job.X``, never to a second
copy: a class, ``current_job()``'s process-wide job and every other module state are the same
whichever name a line used. ``python -m launcher.X`` runs ``sia_slurm.job.X``.

Importing this package warns (:class:`DeprecationWarning`) with the new name. It is removed in
the release after the one that brought it (CHANGELOG.md, "Deprecated"); it imports nothing but
:mod:`sia_slurm.job` (``tests/job/test_job_side_contract.py``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Sequence
from types import CodeType, ModuleType

OLD = __name__  # "launcher"
NEW = "sia_slurm.job"


def new_name(old: str) -> str:
    """``launcher.X`` -> ``sia_slurm.job.X``."""
    return NEW + old[len(OLD) :]


class AliasLoader(importlib.abc.Loader):
    """Loads ``launcher.X`` as the module ``sia_slurm.job.X`` itself, imported under its own name.

    The import system stores what :meth:`create_module` returns as ``sys.modules["launcher.X"]``
    (and as the attribute ``X`` of the parent), so both names hold one object. It also sets that
    module's ``__spec__`` to the alias's spec; :meth:`exec_module` puts the module's own back, so
    the module still says it is ``sia_slurm.job.X`` (pickling, ``importlib.reload``, spawned
    workers that re-import their ``__main__``).
    """

    def __init__(self, target: importlib.machinery.ModuleSpec) -> None:
        self.target = target
        self.own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.target.name)
        self.own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.own_spec

    def get_code(self, fullname: str) -> CodeType | None:
        """The code of ``sia_slurm.job.X``: what ``python -m launcher.X`` runs (:mod:`runpy` asks
        for it; an import never does). Warns as coming from ``__main__``, since the run module
        is the script: Python shows that by default (PEP 565), in the job's output, where an
        admin finishing an upgrade looks; ``-W ignore::DeprecationWarning`` still silences it."""
        warnings.warn_explicit(
            f"python -m {fullname} is deprecated: run python -m {self.target.name} (the "
            f"{OLD!r} alias is removed in the next release)",
            DeprecationWarning,
            filename=__file__,
            lineno=0,
            module="__main__",
        )
        get_code = getattr(self.target.loader, "get_code", None)
        return get_code(self.target.name) if get_code is not None else None


class AliasFinder(importlib.abc.MetaPathFinder):
    """Finds ``launcher.X`` wherever ``sia_slurm.job.X`` is. First on ``sys.meta_path``:
    after ``launcher.elastic`` is the ``sia_slurm.job.elastic`` package, the path finder
    would otherwise find ``launcher.elastic.ddp`` in that package's directory and load the file
    a second time, as a module of its own."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None = None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith(OLD + "."):
            return None
        real = importlib.util.find_spec(new_name(fullname))
        if real is None:
            return None
        package = real.submodule_search_locations is not None
        alias = importlib.machinery.ModuleSpec(
            fullname, AliasLoader(real), origin=real.origin, is_package=package
        )
        if package:
            alias.submodule_search_locations = list(real.submodule_search_locations or ())
        alias.has_location = real.has_location
        return alias


# Once, even if this module runs again (importlib.reload makes a new AliasFinder class).
if not any(type(finder).__module__ == __name__ for finder in sys.meta_path):
    sys.meta_path.insert(0, AliasFinder())

warnings.warn(
    f"the {OLD!r} package is deprecated: import {NEW!r} instead ({OLD}.X is {NEW}.X; the "
    "alias is removed in the next release)",
    DeprecationWarning,
    stacklevel=2,
)
