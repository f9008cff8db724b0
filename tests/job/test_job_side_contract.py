"""The job side's contract with the rest of sia-slurm (issue 36): what ``sia_slurm.job`` may import.

The job side (``sia-sbatch``, ``sia-launch``, the training helpers users import) talks to the
controller through the protocol files, and reads only a handful of the site's settings
(:class:`sia_slurm.job_settings.JobSiteSettings`, loaded by ``sia_slurm/job/settings.py``). It never
imports the controller's CLI, config types, controller, policies, service or database. Every
``sia_slurm`` module a job-side module imports (at the top or inside a function) must be in
:data:`ALLOWED`, which says why it is there; an entry nobody uses any more must go. The contract
(:data:`CONTRACT`) is narrow: the protocol package, the safe-file helpers, the command runner and
its parser of ``scontrol -o`` records, what the programs share with the controller's CLI, the
job-side settings and, in their loader only, the config loader. Beyond it, only the emulated
example, which replays the simulator's measurements (:data:`EMULATED_ONLY`).

``launcher``, the package's old name, stays for one release as an alias (``launcher/__init__.py``)
for the jobs and scripts of an upgrade; it may import nothing but the job side.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
JOB_SIDE = ROOT / "sia_slurm" / "job"
ALIAS = ROOT / "launcher"  # the deprecated alias package, for one release
ANY = None  # an entry any job-side module may import

# The controller's side: never imported by the job side (sia_slurm.config only by the loader);
# nor the dev cluster (sia-slurm-dev), which a site does not install.
FORBIDDEN = (
    "sia_slurm.cli",
    "sia_slurm.config",
    "sia_slurm.controller",
    "sia_slurm.policy",
    "sia_slurm.service",
    "sia_slurm.state",
    "sia_slurm_dev",
)
LOADER = "sia_slurm/job/settings.py"  # the one module that reads the config file

# module -> (why the job side imports it, the job-side files that may, or ANY)
CONTRACT: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "sia_slurm": ("__version__ for --version of sia-sbatch and sia-launch", ANY),
    "sia_slurm.protocol": ("the job/controller protocol: the files both sides read and write", ANY),
    "sia_slurm.protocol.profile": (
        "the protocol's throughput profiles of --app/--profile (batch limits, a job's seed)",
        ANY,
    ),
    "sia_slurm.protocol.profile_json": (
        "the protocol's profile.json and profiled.json, a job's profile for the controller",
        ("sia_slurm/job/sbatch.py", "sia_slurm/job/elastic/job_profiling.py"),
    ),
    "sia_slurm.protocol.observation": (
        "the protocol's measured step, what a profiling run's points are",
        ("sia_slurm/job/elastic/job_profiling.py",),
    ),
    "sia_slurm.safefiles": ("atomic, bounded writes and reads of those files and checkpoints", ANY),
    "sia_slurm.slurm.runner": ("running sbatch, scontrol and sacct as subprocesses", ANY),
    "sia_slurm.slurm.records": (
        "parse_records of scontrol -o show job/node: did Slurm end this run",
        ("sia_slurm/job/runs.py",),
    ),
    "sia_slurm.clicommon": (
        "click's -h/--help and OPENBLAS_NUM_THREADS=1, shared with the controller's CLI",
        ("sia_slurm/job/launch.py", "sia_slurm/job/sbatch.py"),
    ),
    "sia_slurm.job_settings": ("the site's settings the job side uses (JobSiteSettings)", ANY),
    "sia_slurm.config": (
        "the controller's config loader, so a bad sia.yaml is reported the same everywhere",
        (LOADER,),
    ),
}

# The one exception: the emulated trainer (``python -m sia_slurm.job.examples.emulated``), a
# training script for demos on the dev cluster's fake GPUs that replays the simulator's
# measurements, read-only. It stays a job-side example rather than moving to the dev package:
# it runs as a job's script under sia-launch like the other examples (one process per GPU on
# every restart, and ``import sia_slurm_dev`` loads the whole dev cluster), its command line is
# that of the demo, the fidelity and restart benchmarks and the live tests, and jobs submitted
# before an upgrade run it as ``launcher.examples.emulated`` (the alias's promise, one release).
# Nothing else of the job side may import these, nor load them through another module
# (test_the_job_side_proper_loads_no_model_and_no_simulator_module).
EMULATED = "sia_slurm/job/examples/emulated.py"
EMULATED_ONLY: dict[str, tuple[str, tuple[str, ...] | None]] = {
    "sia_slurm.model.efficiency": (
        "the emulated example reports gradient statistics as a real job would",
        (EMULATED,),
    ),
    "sia_slurm.sim.apps": ("the emulated example replays the simulator's traces", (EMULATED,)),
    "sia_slurm.sim.gradstats": (
        "the emulated example's gradient statistics, as the simulator's",
        (EMULATED,),
    ),
    "sia_slurm.sim.groundtruth": (
        "the emulated example's step times, as the simulator's ground truth",
        (EMULATED,),
    ),
    "sia_slurm.sim.progress": (
        "the emulated example's statistical progress, as a simulated job's",
        (EMULATED,),
    ),
}
ALLOWED = {**CONTRACT, **EMULATED_ONLY}


def _is_module(dotted: str) -> bool:
    base = ROOT.joinpath(*dotted.split("."))
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


def sia_imports(path: Path) -> set[str]:
    """The ``sia_slurm`` (and ``sia_slurm_dev``) modules outside the job side that ``path``
    imports, anywhere in it (functions included); ``from sia_slurm.x import y`` counts as
    ``sia_slurm.x.y`` when ``y`` is a module. The job side's own modules (``sia_slurm.job``) are
    its business."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [
                f"{node.module}.{alias.name}"
                if _is_module(f"{node.module}.{alias.name}")
                else node.module
                for alias in node.names
            ]
        else:
            continue
        found.update(
            name
            for name in names
            if name.split(".")[0] in ("sia_slurm", "sia_slurm_dev")
            and name.split(".")[:2] != ["sia_slurm", "job"]
        )
    return found


def job_side_imports() -> dict[str, set[str]]:
    return {
        str(path.relative_to(ROOT)): sia_imports(path) for path in sorted(JOB_SIDE.rglob("*.py"))
    }


def test_the_scan_sees_imports_inside_functions_and_not_the_job_sides_own(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        "import sia_slurm.state.db\n"
        "import sia_slurm.job.runs\n"
        "from sia_slurm.job.elastic import ElasticTrainer\n"
        "def f():\n    from sia_slurm import cli, __version__, job\n"
        "    from sia_slurm.policy.sia import SiaPolicy\n"
        "    from sia_slurm_dev import DevCluster\n"
    )
    assert sia_imports(module) == {
        "sia_slurm_dev",
        "sia_slurm.state.db",
        "sia_slurm.cli",
        "sia_slurm",
        "sia_slurm.policy.sia",
    }


def test_the_job_side_imports_nothing_of_the_controller() -> None:
    problems = [
        f"{path} imports {module}"
        for path, modules in job_side_imports().items()
        for module in sorted(modules)
        if any(module == f or module.startswith(f + ".") for f in FORBIDDEN)
        and not (module == "sia_slurm.config" and path == LOADER)
    ]
    assert problems == []


def test_every_import_of_the_job_side_is_in_the_allow_list() -> None:
    problems = []
    for path, modules in job_side_imports().items():
        for module in sorted(modules):
            if module not in ALLOWED:
                problems.append(f"{path} imports {module}: not in ALLOWED")
                continue
            files = ALLOWED[module][1]
            if files is not ANY and path not in files:
                problems.append(f"{path} imports {module}: ALLOWED only in {', '.join(files)}")
    assert problems == []


def test_every_allow_list_entry_is_still_used() -> None:
    used: dict[str, set[str]] = {}
    for path, modules in job_side_imports().items():
        for module in modules:
            used.setdefault(module, set()).add(path)
    assert sorted(set(ALLOWED) - set(used)) == []
    for module, (_, files) in ALLOWED.items():
        if files is not ANY:
            assert set(files) == used[module], module


def test_no_job_side_module_takes_the_controller_config() -> None:
    """The job side's functions take :class:`JobSiteSettings`, never ``SiaConfig``."""
    users = [
        str(path.relative_to(ROOT))
        for path in sorted(JOB_SIDE.rglob("*.py"))
        if "SiaConfig" in path.read_text()
    ]
    assert users == []


def _fresh(code: str) -> str:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_NUM_THREADS"}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT, env=env
    )
    return out.stdout.strip()


@pytest.mark.parametrize(
    "module", ["sia_slurm.job.launch", "sia_slurm.job.sbatch", "launcher.launch", "launcher.sbatch"]
)
def test_the_programs_load_no_controller_module_and_keep_openblas_single_threaded(
    module: str,
) -> None:
    """Checked in a fresh interpreter, so what this process imported hides nothing: the
    programs' whole import graph, not only their own lines. ``OPENBLAS_NUM_THREADS=1`` (unless
    set) as before, which sbatch and the job's workers inherit. The old names too: console
    scripts installed before an upgrade call ``launcher.sbatch:main`` until reinstalled."""
    code = (
        f"import os, sys, {module}\n"
        "print(os.environ.get('OPENBLAS_NUM_THREADS'))\n"
        "print(*sorted(m for m in sys.modules if m.startswith('sia_slurm.')))\n"
    )
    blas, loaded = _fresh(code).split("\n")
    assert blas == "1"
    controller = ("cli", "controller", "service", "state")
    assert [m for m in loaded.split() if m.split(".")[1] in controller] == []


def test_the_job_side_proper_loads_no_model_and_no_simulator_module() -> None:
    """What a training script and the programs import (everything but the emulated example)
    loads neither the goodput model nor the simulator, in a fresh interpreter: the contract
    holds for the whole import graph, not only for the job side's own lines."""
    modules = ("launch", "sbatch", "agent", "runs", "elastic", "examples.cnn")
    code = (
        f"import sys, {', '.join(f'sia_slurm.job.{m}' for m in modules)}\n"
        "print(*sorted(m for m in sys.modules if m.startswith('sia_slurm.')))\n"
    )
    loaded = _fresh(code).split()
    assert [m for m in loaded if m.split(".")[1] in ("model", "sim")] == []
    assert {files for _, files in EMULATED_ONLY.values()} == {(EMULATED,)}


def test_the_alias_package_is_one_file_of_standard_library_imports() -> None:
    """What the alias needs of sia-slurm it imports by name at run time (``sia_slurm.job.X``
    for each ``launcher.X``): its own import lines hold the standard library only, so it cannot
    grow a dependency of its own while it waits to be removed."""
    files = sorted(str(path.relative_to(ROOT)) for path in ALIAS.rglob("*.py"))
    assert files == ["launcher/__init__.py"]
    imported: set[str] = set()
    for node in ast.walk(ast.parse((ALIAS / "__init__.py").read_text())):
        if isinstance(node, ast.Import):
            imported.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
    assert "importlib" in imported
    assert imported - set(sys.stdlib_module_names) == set()


@pytest.mark.parametrize("program", ["launch", "sbatch"])
def test_the_alias_loads_what_the_job_side_loads_and_nothing_more(program: str) -> None:
    """``import launcher.X`` brings in exactly the ``sia_slurm`` modules of
    ``import sia_slurm.job.X`` (a fresh interpreter for each)."""
    code = "import sys, {}\nprint(*sorted(m for m in sys.modules if m.startswith('sia_slurm')))"
    old = _fresh(
        "import warnings; warnings.simplefilter('ignore')\n" + code.format(f"launcher.{program}")
    )
    new = _fresh(code.format(f"sia_slurm.job.{program}"))
    assert "sia_slurm.job" in new.split()
    assert old == new
