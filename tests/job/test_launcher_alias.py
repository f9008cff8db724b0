"""The ``launcher`` alias of :mod:`sia_slurm.job`, kept for one release (``launcher/__init__.py``).

What an upgrade leaves running must keep working: batch scripts written by an older
``sia-sbatch`` (``python -m launcher.launch``), an older ``sia-launch`` (``python -m
launcher.agent``), training scripts (``from launcher.elastic import ...``), checkpoints that
pickled a class under its old module, console scripts that call ``launcher.sbatch:main``. Each
old name must be the very same module object as the new one (a second copy would have its own
classes and its own process-wide job), and using it must say what to use instead.
"""

from __future__ import annotations

import importlib
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

import pytest

from sia_slurm import __version__

REPO = Path(__file__).resolve().parents[2]


def import_old(name: str) -> ModuleType:
    """``launcher.<name>``, without letting the alias's warning fail or clutter this test."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return importlib.import_module(f"launcher.{name}")


def fresh(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python <args>`` with this checkout first on the path and Python's default warning
    filters (none from the environment), as a job's or a user's process has them."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["PYTHONPATH"] = str(REPO)
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


@pytest.mark.parametrize(
    "name",
    [
        "launch",
        "sbatch",
        "grant",
        "runs",
        "jobenv",
        "settings",
        "elastic",
        "elastic.ddp",
        "elastic.trainer",
        "examples",
        "examples.emulated",
    ],
)
def test_an_old_name_is_the_same_module_object_as_the_new(name: str) -> None:
    old = import_old(name)
    new = importlib.import_module(f"sia_slurm.job.{name}")
    assert old is new
    assert sys.modules[f"launcher.{name}"] is new
    # the module still says where it lives (pickling, reload and spawned workers go by this)
    assert (new.__name__, new.__spec__.name) == (f"sia_slurm.job.{name}",) * 2


def test_the_old_names_of_the_elastic_helpers_are_the_same_classes() -> None:
    from sia_slurm.job.elastic.ddp import ElasticDataParallel
    from sia_slurm.job.elastic.sampler import ElasticSampler

    elastic = import_old("elastic")
    assert elastic.ElasticDataParallel is ElasticDataParallel
    assert import_old("elastic.sampler").ElasticSampler is ElasticSampler
    # a checkpoint that pickled the class under its old module loads it (protocol 0: GLOBAL)
    assert pickle.loads(b"clauncher.elastic.sampler\nElasticSampler\n.") is ElasticSampler


def test_an_old_name_of_no_new_module_is_not_found() -> None:
    import_old("settings")
    with pytest.raises(ModuleNotFoundError) as missing:
        importlib.import_module("launcher.no_such_module")
    assert missing.value.name == "launcher.no_such_module"


def test_an_old_name_imported_first_still_loads_each_file_once(tmp_path: Path) -> None:
    """In a fresh interpreter the old name comes first: the new one must not load the file a
    second time, nor a submodule of a package reached by its old name."""
    code = (
        "import warnings; warnings.simplefilter('ignore')\n"
        "import sys, launcher.jobenv as a, launcher.examples.common as c\n"
        "import sia_slurm.job.jobenv as b, sia_slurm.job.examples.common as d\n"
        "files = [m.__file__ for m in list(sys.modules.values()) if getattr(m, '__file__', '')]\n"
        "print(a is b, c is d, files.count(a.__file__), files.count(c.__file__))\n"
    )
    out = fresh("-c", code, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    # sys.modules holds each under both names, one object: 2 entries, 1 module
    assert out.stdout.split() == ["True", "True", "2", "2"]


@pytest.mark.parametrize("program", ["launch", "sbatch"])
def test_python_m_of_an_old_name_runs_the_program_and_warns(program: str, tmp_path: Path) -> None:
    """What a batch script written before the upgrade runs (``-m launcher.launch``): the
    program, and a warning in the job's output that names the new command."""
    out = fresh("-m", f"launcher.{program}", "--version", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"sia-{program}, version {__version__}\n"
    assert "DeprecationWarning" in out.stderr
    assert f"run python -m sia_slurm.job.{program}" in out.stderr


def test_a_training_script_that_imports_the_old_name_is_told_the_new_one(tmp_path: Path) -> None:
    """Python shows a DeprecationWarning by default when the script itself (``__main__``)
    triggers it, which is how a user's training script imports the job side."""
    script = tmp_path / "train.py"
    script.write_text(
        "from launcher.jobenv import JobEnvironment\n"
        "import sia_slurm.job.jobenv\n"
        "print(JobEnvironment is sia_slurm.job.jobenv.JobEnvironment)\n"
    )
    out = fresh(str(script), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "True\n"
    assert f"{script}:1: DeprecationWarning: the 'launcher' package is deprecated" in out.stderr
    assert "import 'sia_slurm.job' instead" in out.stderr
