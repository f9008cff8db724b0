"""The table of config keys (sia_slurm/config_keys.py) against what the loader does: the
sections filled from dataclasses list exactly their fields and defaults, every documented key is
accepted where it is documented, and the defaults the loader applies are the documented ones."""

from __future__ import annotations

from dataclasses import MISSING, fields
from pathlib import Path

import pytest
import yaml

from sia_slurm.config import (
    ConfigError,
    RestartConfig,
    SlurmConfig,
    load_config,
    parse_config,
)
from sia_slurm.config_keys import KEYS, NO_DEFAULT, REQUIRED, keys_under, reference_markdown
from sia_slurm.policy.parameters import POLICY_PARAMS
from sia_slurm.policy.shares import SharesConfig

MINIMAL = "state_dir: /var/lib/sia\npartitions:\n  gpu-a: {gpu_type: a100, gpus_per_node: 4}\n"


def _dataclass_defaults(cls: type) -> dict[str, object]:
    return {f.name: f.default for f in fields(cls) if f.default is not MISSING}


@pytest.mark.parametrize(
    ("parent", "policy", "cls"),
    [
        ("restart", "", RestartConfig),
        ("slurm", "", SlurmConfig),
        *[("policy", name, cls) for name, cls in POLICY_PARAMS.items()],
    ],
)
def test_a_dataclass_section_lists_its_fields_with_their_defaults(
    parent: str, policy: str, cls: type
) -> None:
    documented = (
        {name: key.default for name, key in keys_under(parent, policy).items() if key.policy}
        if policy
        else {name: key.default for name, key in keys_under(parent).items()}
    )
    assert documented == _dataclass_defaults(cls)


def test_the_shares_defaults_are_the_shares_dataclass_defaults() -> None:
    documented = {
        name: key.default
        for name, key in keys_under("shares").items()
        if key.default is not NO_DEFAULT
    }
    expected = _dataclass_defaults(SharesConfig)
    assert documented == expected
    assert SharesConfig().default_share == documented["default_share"]


def test_a_minimal_file_gets_the_documented_defaults() -> None:
    config = parse_config(MINIMAL)
    for path, value in [
        ("round_seconds", config.round_seconds),
        ("managed_marker", config.managed_marker),
        ("dry_run", config.dry_run),
        ("policy.name", config.policy.name),
    ]:
        (key,) = [key for key in KEYS if key.path == path]
        assert value == key.default, path
    assert [name for name, key in keys_under("").items() if key.required] == [
        "state_dir",
        "partitions",
    ]


def _with(text: str, extra: dict[str, object]) -> str:
    data = yaml.safe_load(text)
    for path, value in extra.items():
        node = data
        *parents, leaf = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return yaml.safe_dump(data)


@pytest.mark.parametrize(
    "key", [key for key in KEYS if key.default not in (REQUIRED, NO_DEFAULT)], ids=str
)
def test_every_documented_key_is_accepted_where_it_is_documented(key) -> None:  # type: ignore[no-untyped-def]
    path = (
        key.path.replace("<type>", "a100")
        .replace("<partition>", "gpu-a")
        .replace("<user>", "alice")
        .replace("<account>", "physics")
    )
    extra: dict[str, object] = {path: key.default if key.default != "<type>" else "dgx"}
    if key.policy:
        extra["policy.name"] = key.policy
    parse_config(_with(MINIMAL, extra))  # raises ConfigError if refused


def test_an_undocumented_key_is_refused_at_every_level() -> None:
    for path in ["colour", "restart.colour", "shares.colour", "policy.colour"]:
        with pytest.raises(ConfigError, match="unknown key"):
            parse_config(_with(MINIMAL, {path: 1}))
    with pytest.raises(ConfigError, match="unknown key"):
        parse_config(_with(MINIMAL, {"policy.name": "fifo", "policy.p": -0.5}))  # Sia's, not FIFO's


def test_the_example_config_uses_documented_keys_only() -> None:
    example = Path(__file__).resolve().parents[1] / "etc" / "sia.yaml"
    load_config(example)
    documented = {key.path for key in KEYS}
    data = yaml.safe_load(example.read_text())
    for name, settings in data["partitions"].items():
        for field in settings:
            assert f"partitions.<partition>.{field}" in documented, (name, field)
    for field in data["restart"]:
        assert f"restart.{field}" in documented


def test_the_reference_names_every_key_once_per_policy() -> None:
    text = reference_markdown()
    for key in KEYS:
        assert f"| `{key.path}` |" in text
    assert text.count("| `policy.p` |") == 3  # Sia's, the paper's Sia's and Pollux's
    assert "## `policy.name: gavel`" in text
