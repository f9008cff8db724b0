"""A dev cluster's GPU types: speed factors and emulated memory from the shipped profiles, the
TaskProlog that hands them to every job, and docs/profiling.md's table (the code's)."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import pytest

from sia_slurm.model.type_speeds import best_one_gpu_throughput, profile_speed_factors
from sia_slurm.protocol.profile import load_profiles
from sia_slurm_dev.slurm_conf import (
    ClusterLayout,
    render_slurm_conf,
    render_task_prolog,
)
from sia_slurm_dev.spec import DEFAULT_SPEC, DevClusterSpec
from sia_slurm_dev.speed import (
    MEMORY_VARIABLE,
    SAMPLES_PER_GB,
    SPEED_VARIABLE,
    default_table,
    emulation,
    job_variables,
    memory_gb,
    spec_variables,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "profiling.md"
TABLE_START = "<!-- devcluster-speed-table -->\n"
TABLE_END = "<!-- /devcluster-speed-table -->"


def test_the_docs_table_is_the_codes() -> None:
    text = DOCS.read_text()
    start = text.index(TABLE_START) + len(TABLE_START)
    assert text[start : text.index(TABLE_END)] == default_table()


def test_a_factor_is_the_geometric_mean_of_the_apps_throughput_ratios() -> None:
    """Recomputed by hand for rtx against dgx: the fastest of the two in every shipped app."""
    profiles = load_profiles()
    ratios = []
    for app in profiles.apps.values():
        dgx, rtx = best_one_gpu_throughput(app, "dgx"), best_one_gpu_throughput(app, "rtx")
        assert dgx is not None and rtx is not None and dgx > rtx
        ratios.append(rtx / dgx)
    expected = math.prod(ratios) ** (1 / len(ratios))
    assert profile_speed_factors(profiles, ["dgx", "rtx"]) == pytest.approx(
        {"dgx": 1.0, "rtx": expected}
    )


def test_the_default_cluster_a100_is_fastest_and_t4_slowest() -> None:
    rows = {r.gpu_type: r for r in emulation(["a100", "rtx", "t4"])}
    assert rows["a100"].profile_type == "dgx" and rows["a100"].speed == 1.0
    speeds = [rows[t].speed for t in ("a100", "rtx", "t4")]
    assert all(s is not None for s in speeds)
    assert speeds == sorted(speeds, reverse=True)  # type: ignore[type-var]
    assert 0.1 < rows["t4"].speed < 0.5  # type: ignore[operator]
    assert (rows["a100"].memory, rows["rtx"].memory, rows["t4"].memory) == (
        40 * SAMPLES_PER_GB,
        11 * SAMPLES_PER_GB,
        16 * SAMPLES_PER_GB,
    )


def test_the_fastest_type_of_the_cluster_is_1_and_unknown_types_are_left_out() -> None:
    """A cluster without A100s runs its fastest type at full speed; a type without a profile,
    or whose profile gives no memory size (v100's description names none), gets no entry."""
    rows = {r.gpu_type: r for r in emulation(["rtx", "t4", "v100", "h100"])}
    assert max(r.speed for r in rows.values() if r.speed is not None) == 1.0
    assert rows["h100"].speed is None and rows["h100"].memory is None
    assert rows["v100"].speed is not None and rows["v100"].memory is None
    variables = job_variables(rows.values())
    assert "h100" not in variables[SPEED_VARIABLE] and "v100" not in variables[MEMORY_VARIABLE]
    assert job_variables(emulation(["h100"])) == {}


def test_memory_comes_from_the_descriptions_size() -> None:
    types = load_profiles().gpu_types
    assert memory_gb(types["t4"]) == 16 and memory_gb(types["dgx"]) == 40
    assert memory_gb(types["v100"]) is None


def test_the_variables_of_the_default_cluster_name_its_types() -> None:
    variables = spec_variables(DevClusterSpec.parse(DEFAULT_SPEC))
    speeds = dict(item.split("=") for item in variables[SPEED_VARIABLE].split(","))
    memories = dict(item.split("=") for item in variables[MEMORY_VARIABLE].split(","))
    assert list(speeds) == ["a100", "rtx", "t4"] and speeds["a100"] == "1"
    assert memories == {"a100": "320", "rtx": "88", "t4": "128"}


def test_the_task_prolog_prints_the_exports_slurm_reads(tmp_path: Path) -> None:
    variables = {SPEED_VARIABLE: "a100=1,t4=0.246", MEMORY_VARIABLE: "a100=320,t4=128"}
    script = tmp_path / "task-prolog.sh"
    script.write_text(render_task_prolog(variables))
    out = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [
        "export SIA_DEVCLUSTER_SPEED=a100=1,t4=0.246",
        "export SIA_DEVCLUSTER_MEMORY=a100=320,t4=128",
    ]
    empty = tmp_path / "empty.sh"
    empty.write_text(render_task_prolog({}))
    assert subprocess.run(["sh", str(empty)], capture_output=True, text=True).stdout == ""


@pytest.mark.parametrize(
    "variables", [{"SIA_X": "a b"}, {"SIA_X": "$(reboot)"}, {"bad name": "1"}, {"SIA_X": "a;b"}]
)
def test_the_task_prolog_refuses_anything_but_a_plain_word(variables: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="not a plain NAME=value"):
        render_task_prolog(variables)


def test_slurm_conf_names_the_task_prolog(tmp_path: Path) -> None:
    layout = ClusterLayout(root=tmp_path, hostname="h", user="root", port_base=30817)
    conf = render_slurm_conf(DevClusterSpec.parse(DEFAULT_SPEC), layout)
    assert f"TaskProlog={tmp_path}/etc/task-prolog.sh\n" in conf


def test_up_without_profiles_says_so_as_a_dev_cluster_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sia_slurm.protocol.profile import ProfileError
    from sia_slurm_dev import lifecycle

    def missing(*_: object) -> dict[str, str]:
        raise ProfileError("/nowhere/profiles: expected a profiles directory")

    monkeypatch.setattr(lifecycle, "spec_variables", missing)
    cluster = lifecycle.DevCluster(tmp_path)
    with pytest.raises(lifecycle.DevClusterError, match="speed and memory: /nowhere/profiles"):
        cluster._emulation_variables(DevClusterSpec.parse(DEFAULT_SPEC))
    monkeypatch.undo()
    assert cluster._emulation_variables(DevClusterSpec.parse("t4:1x1")) == {
        SPEED_VARIABLE: "t4=1",
        MEMORY_VARIABLE: "t4=128",
    }
