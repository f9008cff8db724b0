"""The job side's start-up does not import the fitting or policy stacks (sia_slurm.lazy).

Every restart on a cluster starts ``sia-launch`` and one trainer per GPU; on the dev cluster (many
fake GPUs on a few cores) each heavy import is paid on every restart, which is what slowed the
fidelity runs' restarts (docs/fidelity.md). Checked in a fresh interpreter, so what the test
process already imported does not hide anything.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import sia_slurm.model
import sia_slurm.sim
from sia_slurm.lazy import lazy_exports

HEAVY = ("scipy", "sia_slurm.policy.sia", "sia_slurm.model.fit", "sia_slurm.sim.run")


def imported_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


@pytest.mark.parametrize(
    "module",
    [
        "sia_slurm.job.launch",
        "sia_slurm.job.sbatch",
        pytest.param("sia_slurm.job.examples.emulated", marks=pytest.mark.heavy),  # torch
        "launcher.launch",  # through the deprecated alias, as old batch scripts run it
        "sia_slurm.config",
        "sia_slurm.job_settings",
    ],
)
def test_job_side_modules_do_not_import_the_heavy_stacks(module: str) -> None:
    loaded = imported_after(module)
    assert module in loaded
    assert not loaded & set(HEAVY), f"{module} imports {sorted(loaded & set(HEAVY))}"


@pytest.mark.parametrize("package", [sia_slurm.model, sia_slurm.sim])
def test_every_re_export_resolves_to_its_module(package: object) -> None:
    names = package.__all__  # type: ignore[attr-defined]
    assert sorted(names) == sorted(package._MODULE_OF)  # type: ignore[attr-defined]
    for name in names:
        value = getattr(package, name)
        module = package._MODULE_OF[name]  # type: ignore[attr-defined]
        assert value is getattr(sys.modules[f"{package.__name__}.{module}"], name)
    assert set(names) <= set(dir(package))


def test_an_unknown_name_is_an_attribute_error() -> None:
    getattr_, _ = lazy_exports("pkg", {"known": "mod"}, {})
    with pytest.raises(AttributeError, match="'pkg' has no attribute 'unknown'"):
        getattr_("unknown")
    with pytest.raises(AttributeError):
        sia_slurm.model.no_such_name  # noqa: B018


def test_the_config_loader_knows_every_registered_policy() -> None:
    from sia_slurm.policy.parameters import POLICY_PARAMS
    from sia_slurm.policy.registry import POLICIES

    assert {name: entry.config_type for name, entry in POLICIES.items()} == POLICY_PARAMS
