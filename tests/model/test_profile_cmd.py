"""``sia-slurm profile show`` through click's CliRunner."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from sia_slurm.cli.profile_cmd import profile
from sia_slurm.core import Configuration
from sia_slurm.model.efficiency import GradientStats
from sia_slurm.model.estimator import JobGoodputEstimator
from sia_slurm.protocol.profile import ProfileSet


def table_rows(output: str, title: str) -> dict[str, list[str]]:
    """Rows of the table printed after ``title``, keyed by their first cell."""
    lines = output.split(title, 1)[1].splitlines()[1:]  # skip the rest of the title line
    rows = {}
    for line in lines[1:]:
        if not line.strip():
            break
        cells = line.split()
        rows[cells[0]] = cells[1:]
    rows["TYPE"] = lines[0].split()[1:]
    return rows


def test_show_prints_models_and_goodput_table(profiles: ProfileSet) -> None:
    result = CliRunner().invoke(
        profile, ["show", "cifar10", "--grad-sqr", "1", "--grad-var", "20", "--nodes", "3"]
    )
    assert result.exit_code == 0, result.output
    assert result.output.startswith("cifar10: ResNet-18 on CIFAR-10\nM0 128, max batch 4096")
    models = table_rows(result.output, "Throughput model per GPU type")
    assert sorted(k for k in models if k != "TYPE") == ["dgx", "quad", "rtx", "t4", "v100"]
    goodput = table_rows(result.output, "Projected goodput")
    # Sia's configurations: 1, 2, 4 (, 8) GPUs in a node, then 2 and 3 whole nodes.
    assert goodput["TYPE"] == ["1", "2", "4", "8", "12", "16", "24"]
    assert goodput["t4"][goodput["TYPE"].index("16")] == "-"
    est = JobGoodputEstimator.from_profile(
        profiles.app("cifar10"), grad_stats=GradientStats(1.0, 20.0)
    )
    expected = est.evaluate([Configuration("t4", 1, 1), Configuration("t4", 3, 12)]).goodput
    assert goodput["t4"][0] == f"{expected[0]:.1f}"
    assert goodput["t4"][goodput["TYPE"].index("12")] == f"{expected[1]:.1f}"


def test_gpus_per_node_option_changes_the_configurations() -> None:
    result = CliRunner().invoke(profile, ["show", "bert", "--gpus-per-node", "dgx=2"])
    assert result.exit_code == 0, result.output
    goodput = table_rows(result.output, "Projected goodput")
    header = goodput["TYPE"]
    assert goodput["dgx"][header.index("4")] != "-"  # 2 nodes x 2 GPUs
    assert goodput["dgx"][header.index("8")] == "-"


def test_errors_are_reported_without_a_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    unknown = runner.invoke(profile, ["show", "gpt3"])
    assert unknown.exit_code == 1
    assert "no profile for app 'gpt3' (known apps: bert, cifar10" in unknown.output
    bad_shape = runner.invoke(profile, ["show", "bert", "--gpus-per-node", "h100=8"])
    assert bad_shape.exit_code == 2
    assert "expected a GPU type among dgx, quad, rtx, t4, v100, got 'h100'" in bad_shape.output
    half_stats = runner.invoke(profile, ["show", "bert", "--grad-sqr", "1"])
    assert half_stats.exit_code == 2
    assert "--grad-sqr and --grad-var go together" in half_stats.output
    missing = runner.invoke(profile, ["show", "bert", "--profiles", str(tmp_path)])
    assert missing.exit_code == 1
    assert f"{tmp_path / 'gpu_types.csv'}: file not found" in missing.output


def test_help_reads_like_a_man_page_summary() -> None:
    result = CliRunner().invoke(profile, ["show", "--help"])
    assert result.exit_code == 0
    assert "Show a model's fitted throughput and projected goodput" in result.output
    assert "--gpus-per-node TYPE=N" in result.output


def test_a_measured_profile_is_shown_and_forgotten(tmp_path: Path) -> None:
    """A profile the scheduler measured (docs/profiling.md) is found through the config's
    state directory, shown like a shipped one with when, where and how long it was measured,
    and forgotten on request."""
    import json
    from dataclasses import replace

    from sia_slurm.protocol.profile import load_profiles
    from sia_slurm.protocol.profile_json import profile_to_json
    from sia_slurm.state.profiles import ProfileStore

    config = tmp_path / "sia.yaml"
    config.write_text(
        f"state_dir: {tmp_path / 'state'}\npartitions:\n  t4: {{gpu_type: t4, gpus_per_node: 4}}\n"
    )
    document = profile_to_json(replace(load_profiles().app("ncf"), name="mynet"))
    meta = {"measured_at": 0.0, "seconds": 95.0, "by": "job s1", "gpu_types": ["dgx", "t4"]}
    ProfileStore(tmp_path / "state").put("physics", "mynet", document, meta)
    runner = CliRunner()
    shown = runner.invoke(profile, ["show", "mynet", "--config", str(config)])
    assert shown.exit_code == 0, shown.output
    assert "measured 1970-01-01 00:00:00 UTC by job s1 on dgx, t4 in 95 s (account physics)" in (
        shown.output
    )
    assert "Projected goodput" in shown.output
    assert json.loads((tmp_path / "state/profiles/physics/mynet.json").read_text())["meta"] == meta
    other = runner.invoke(
        profile, ["show", "mynet", "--account", "biology", "--config", str(config)]
    )
    assert other.exit_code == 1 and "no profile measured for account biology" in other.output
    gone = runner.invoke(
        profile, ["forget", "mynet", "--account", "physics", "--config", str(config)]
    )
    assert gone.exit_code == 0 and "the next job of it is profiled again" in gone.output
    assert not (tmp_path / "state/profiles/physics/mynet.json").exists()
    again = runner.invoke(
        profile, ["forget", "mynet", "--account", "physics", "--config", str(config)]
    )
    assert again.exit_code == 1 and "no profile measured" in again.output
    hostile = runner.invoke(profile, ["forget", "../x", "--config", str(config)])
    assert hostile.exit_code == 1 and "app: expected a name" in hostile.output
