"""The config loader: the example loads; every bad config names file, line, key and problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from sia_slurm.config import ConfigError, load_config, parse_config, resolve_config_path
from sia_slurm.policy.gavel import GavelPolicyConfig
from sia_slurm.policy.sia import SiaPolicyConfig
from sia_slurm.protocol import StatePaths

REPO = Path(__file__).resolve().parent.parent
GOOD = """\
round_seconds: 60
state_dir: /var/lib/sia
gpu_types:
  a100: {profile: dgx}
  t4: {}
partitions:
  gpu-a100: {gpu_type: a100, gpus_per_node: 8}
  gpu-t4: {gpu_type: t4, gpus_per_node: 4}
"""


def errors_of(text: str) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, Path("/etc/sia-slurm/sia.yaml"))
    return [str(issue) for issue in caught.value.issues]


def test_example_config_loads() -> None:
    config = load_config(REPO / "etc" / "sia.yaml")
    assert config.round_seconds == 60
    assert config.policy.name == "sia"
    assert isinstance(config.policy.params, SiaPolicyConfig)
    assert config.policy.params.p == -0.25 and config.policy.params.lambda_n == 1.1
    assert config.policy.params.lambda_a == 0.01
    assert [p.name for p in config.partitions] == ["a100", "rtx", "t4"]
    assert config.partition_of("t4").gpus_per_node == 4
    assert {g.name: g.profile for g in config.gpu_types}["a100"] == "dgx"
    assert config.dry_run is True


def test_defaults_and_derived_paths() -> None:
    config = parse_config(GOOD, Path("/etc/sia-slurm/sia.yaml"))
    assert config.policy.name == "sia"
    assert config.policy.params == SiaPolicyConfig()  # the policy's own defaults
    assert config.restart.checkpoint_timeout_s == 120
    assert config.managed_marker == "sia-slurm"
    assert config.db_path == Path("/var/lib/sia/sia.db")
    # Metrics are the job's own file in its directory (jobs/<id>/metrics.json): no spool.
    assert not hasattr(config, "spool_dir")
    assert StatePaths(config.state_dir).metrics("j") == Path("/var/lib/sia/jobs/j/metrics.json")
    assert {g.name: g.profile for g in config.gpu_types} == {"a100": "dgx", "t4": "t4"}


def test_relative_state_dir_is_relative_to_the_config_file() -> None:
    config = parse_config(GOOD.replace("/var/lib/sia", "state"), Path("/srv/sia/sia.yaml"))
    assert config.state_dir == Path("/srv/sia/state")


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "nope.yaml")
    assert str(caught.value) == f"{tmp_path / 'nope.yaml'}: file not found"


def test_unknown_key_suggests_the_right_one() -> None:
    (error,) = errors_of(GOOD + "round_secnds: 30\n")
    assert error.startswith("/etc/sia-slurm/sia.yaml:9: round_secnds: unknown key;")
    assert "did you mean 'round_seconds'?" in error


def test_unknown_nested_key() -> None:
    (error,) = errors_of(GOOD + "policy:\n  name: sia\n  lamda_n: 2\n")
    assert error.startswith("/etc/sia-slurm/sia.yaml:11: policy.lamda_n: unknown key;")
    assert "'lambda_n'" in error


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ("round_seconds: sixty\n", "round_seconds: expected a number, got a string 'sixty'"),
        ("dry_run: maybe\n", "dry_run: expected true or false, got 'maybe'"),
        ("policy: {p: x}\n", "policy.p: expected a number, got a string 'x'"),
        ("policy: [1]\n", "policy: expected a mapping of settings, got a list"),
        ("slurm: {backend: rest}\n", "slurm.backend: expected one of cli, pyslurm, got 'rest'"),
        ("managed_marker: a b\n", "managed_marker: expected a word of letters"),
    ],
)
def test_wrong_types(extra: str, expected: str) -> None:
    text = "\n".join(
        line for line in GOOD.splitlines() if not line.startswith(extra.split(":")[0] + ":")
    )
    errors = errors_of(text + "\n" + extra)
    assert len(errors) == 1, errors
    assert expected in errors[0]


def test_negative_round_length() -> None:
    (error,) = errors_of(GOOD.replace("round_seconds: 60", "round_seconds: -60"))
    assert error == (
        "/etc/sia-slurm/sia.yaml:1: round_seconds: expected a positive number of seconds, got -60"
    )


def test_negative_gpus_per_node() -> None:
    (error,) = errors_of(GOOD.replace("gpus_per_node: 8", "gpus_per_node: -4"))
    assert error == (
        "/etc/sia-slurm/sia.yaml:7: partitions.gpu-a100.gpus_per_node: "
        "expected a positive integer, got -4"
    )


@pytest.mark.parametrize(
    ("policy", "field", "message"),
    [
        ("{p: -0.5, lambda_n: -1.1}", "policy.lambda_n", "breaks the sign rules"),
        ("{p: 0.5, lambda_n: 1.1}", "policy.lambda_n", "breaks the sign rules"),
        ("{p: -0.5, lambda_n: 0.9}", "policy.lambda_n", "|lambda_n| > 1"),
        ("{p: 0}", "policy.p", "expected a finite non-zero number, got 0"),
        ("{name: gandiva}", "policy.name", "expected one of sia, sia-paper, pollux, gavel, fifo"),
        ("{growth_factor: 0.5}", "policy.growth_factor", "expected >= 1 or None, got 0.5"),
        ("{lambda_a: -1}", "policy.lambda_a", "expected >= 0, got -1"),
        ("{name: gavel, objective: fastest}", "policy.objective", "expected one of"),
        ("{name: gavel, water_filling: 2}", "policy.water_filling", "expected"),
        ("{name: pollux, population: 1}", "policy.p", "population >= 2"),
        (
            "{name: pollux, population: 1.5}",
            "policy.population",
            "expected an integer, got a number",
        ),
        ("{name: fifo, p: -0.5}", "policy.p", "unknown key"),
    ],
)
def test_policy_parameter_rules(policy: str, field: str, message: str) -> None:
    (error,) = errors_of(GOOD + f"policy: {policy}\n")
    assert f":9: {field}: " in error
    assert message in error


def test_policy_parameters_build_the_policys_config() -> None:
    config = parse_config(GOOD + "policy: {name: gavel, objective: max_total_throughput}\n")
    assert config.policy.name == "gavel"
    assert config.policy.params == GavelPolicyConfig(objective="max_total_throughput")
    config = parse_config(
        GOOD + "policy: {name: gavel, objective: max_min_fairness, water_filling: false}\n"
    )
    assert config.policy.params == GavelPolicyConfig("max_min_fairness", water_filling=False)
    config = parse_config(GOOD + "policy: {growth_factor: null, lambda_a: 0}\n")
    assert config.policy.params.growth_factor is None and config.policy.params.lambda_a == 0.0


def test_p_positive_with_negative_lambda_is_accepted() -> None:
    config = parse_config(GOOD + "policy: {p: 0.5, lambda_n: -1.1}\n")
    assert config.policy.params.p == 0.5


def test_partition_mapped_twice() -> None:
    errors = errors_of(GOOD + "  gpu-t4: {gpu_type: t4, gpus_per_node: 8}\n")
    assert errors == [
        "/etc/sia-slurm/sia.yaml:9: partitions.gpu-t4: given twice (first on line 8); "
        "each key may appear once"
    ]


def test_two_partitions_for_one_gpu_type() -> None:
    (error,) = errors_of(GOOD + "  more-t4: {gpu_type: t4, gpus_per_node: 4}\n")
    assert ":9: partitions.more-t4.gpu_type: GPU type 't4' is already mapped by partition" in error


def test_gpu_type_with_no_partition() -> None:
    (error,) = errors_of(GOOD.replace("  t4: {}\n", "  t4: {}\n  v100: {profile: v100}\n"))
    assert error.startswith("/etc/sia-slurm/sia.yaml:6: gpu_types.v100: GPU type has no partition")


def test_partition_with_undeclared_gpu_type() -> None:
    errors = errors_of(GOOD.replace("gpu_type: t4", "gpu_type: h100"))
    # Two real problems: h100 is not declared, and the declared t4 is now left unmapped.
    assert errors == [
        "/etc/sia-slurm/sia.yaml:5: gpu_types.t4: GPU type has no partition: map a partition to "
        "it under partitions, or remove it",
        "/etc/sia-slurm/sia.yaml:8: partitions.gpu-t4.gpu_type: GPU type 'h100' is not declared "
        "under gpu_types (declared: a100, t4)",
    ]


def test_missing_required_keys_and_all_problems_reported_together() -> None:
    errors = errors_of("round_seconds: 0\npartitions: {}\n")
    assert any("state_dir: missing: this key is required" in e for e in errors)
    assert any(":1: round_seconds: expected a positive number" in e for e in errors)
    assert any(":2: partitions: expected a non-empty mapping" in e for e in errors)


def test_partition_missing_fields() -> None:
    (error,) = errors_of(GOOD.replace("{gpu_type: t4, gpus_per_node: 4}", "{gpu_type: t4}"))
    assert error == (
        "/etc/sia-slurm/sia.yaml:8: partitions.gpu-t4.gpus_per_node: "
        "missing: this key is required in partitions.gpu-t4"
    )


def test_invalid_yaml_reports_the_line() -> None:
    (error,) = errors_of("state_dir: /x\npartitions: [a,\n")
    assert error.startswith("/etc/sia-slurm/sia.yaml:3: invalid YAML:")


def test_not_a_mapping() -> None:
    (error,) = errors_of("- a\n- b\n")
    assert "expected a mapping of settings, got a list" in error


def test_config_path_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SIA_SLURM_CONFIG", raising=False)
    assert resolve_config_path(None) == Path("/etc/sia-slurm/sia.yaml")
    monkeypatch.setenv("SIA_SLURM_CONFIG", "/x/y.yaml")
    assert resolve_config_path(None) == Path("/x/y.yaml")
    assert resolve_config_path("here.yaml") == Path("here.yaml")


def test_yaml_aliases_are_refused_everywhere(tmp_path: Path) -> None:
    """A billion laughs in nine lines: an alias is refused before anything expands it, in a
    config, a profile's app.yaml and an accounts spec (issue 35)."""
    from sia_slurm.protocol.profile import ProfileError, load_app_profile, load_profiles
    from sia_slurm.yamlsource import parse_yaml

    laughs = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n"
        for p, c in zip("abcdefgh", "bcdefghi", strict=True)
    )
    (issue,) = parse_yaml(laughs).issues
    assert "found an alias (*a): aliases are not allowed" in issue.message
    app = tmp_path / "bomb"
    app.mkdir()
    (app / "app.yaml").write_text("init_batch_size: &m 32\nmax_batch_size: *m\nmin_local_bsz: 1\n")
    with pytest.raises(ProfileError, match="aliases are not allowed"):
        load_app_profile(app, load_profiles().gpu_types)
