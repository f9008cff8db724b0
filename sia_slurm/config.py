"""The controller's configuration: typed, validated, loaded once and passed explicitly.

A config file (``etc/sia.yaml`` is the commented example) maps Slurm partitions to GPU types and
sets the round length, the policy and its parameters, the state directory and the managed-job
marker. :func:`load_config` returns a frozen :class:`SiaConfig` or raises :class:`ConfigError`,
which carries *every* problem found, each as ``file:line: key: what was expected, what was found``.

There is no global configuration object: whoever needs a setting receives the config (or the
piece of it) as an argument.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from sia_slurm.config_checks import (
    SLURM_NAME,
    build_dataclass,
    check_keys,
    check_name,
    check_number,
    check_positive,
    kind_of,
)
from sia_slurm.config_evolution import check_config_version, retire_keys
from sia_slurm.config_keys import default as key_default
from sia_slurm.config_keys import keys_under
from sia_slurm.policy.parameters import POLICY_PARAMS
from sia_slurm.policy.shares import EQUAL_USERS, SharesConfig, UserShareConfig
from sia_slurm.yamlsource import SourceIssue, YamlSource, parse_yaml

DEFAULT_CONFIG_PATH = Path("/etc/sia-slurm/sia.yaml")
CONFIG_ENV_VAR = "SIA_SLURM_CONFIG"
BACKEND_NAMES = ("cli", "pyslurm")


class ConfigError(ValueError):
    """A configuration file could not be used; ``issues`` lists every problem found."""

    def __init__(self, issues: list[SourceIssue]):
        self.issues = sorted(issues, key=lambda issue: issue.line or 0)  # in file order
        super().__init__("\n".join(str(issue) for issue in self.issues))


@dataclass(frozen=True)
class GpuTypeConfig:
    """A GPU type the scheduler knows, and its key in the throughput profiles."""

    name: str
    profile: str  # GPU-type key in profiles/ (e.g. "dgx" for A100); defaults to ``name``


@dataclass(frozen=True)
class PartitionConfig:
    """A Slurm partition whose nodes all carry ``gpus_per_node`` GPUs of ``gpu_type``."""

    name: str
    gpu_type: str
    gpus_per_node: int


@dataclass(frozen=True)
class PolicySettings:
    """Which allocation policy runs each round, and its parameters.

    ``params`` is the policy's own frozen config dataclass (e.g. ``SiaPolicyConfig``), built from
    the keys of the ``policy`` section other than ``name`` and validated by the policy itself, so
    each parameter and its rules are defined in exactly one place.
    """

    name: str
    params: Any


@dataclass(frozen=True)
class RestartConfig:
    """How long the controller waits for a job to checkpoint before it requeues it anyway.

    The restart cost S that the policy charges is a policy parameter
    (``policy.default_restart_cost`` for Sia) and is replaced by each job's measured cost.
    """

    checkpoint_timeout_s: float = 120.0  # wait this long for the job's acknowledgement
    # Runs of one job that Slurm may end (a refused launch, a failed node...) and the job
    # still be brought back from its checkpoint; a job whose own code fails has its own
    # budget (``sia-sbatch --max-failures``).
    max_slurm_failures: int = 10


@dataclass(frozen=True)
class SlurmConfig:
    """How the controller talks to Slurm."""

    backend: str = "cli"  # "cli": scontrol, squeue --json; "pyslurm": the binding
    bin_dir: str = ""  # directory of the Slurm commands; empty = search PATH


@dataclass(frozen=True)
class SiaConfig:
    """Everything the controller needs, validated."""

    path: Path | None
    round_seconds: float
    state_dir: Path
    managed_marker: str
    dry_run: bool
    gpu_types: tuple[GpuTypeConfig, ...]
    partitions: tuple[PartitionConfig, ...]
    policy: PolicySettings
    restart: RestartConfig
    slurm: SlurmConfig
    shares: SharesConfig = EQUAL_USERS
    shares_configured: bool = False  # False: no ``shares:`` section, every user counts the same
    # Keys the file still uses under names retired in this release (config_evolution.py):
    # the file loads, and whoever loaded it says so (`config check`, the controller's log).
    warnings: tuple[SourceIssue, ...] = ()

    def partition_of(self, gpu_type: str) -> PartitionConfig:
        """The partition that holds ``gpu_type`` (validation guarantees exactly one)."""
        for partition in self.partitions:
            if partition.gpu_type == gpu_type:
                return partition
        raise KeyError(gpu_type)

    @property
    def db_path(self) -> Path:
        return self.state_dir / "sia.db"


_TOP_LEVEL_KEYS = tuple(keys_under(""))
_REQUIRED_TOP_LEVEL = tuple(name for name, key in keys_under("").items() if key.required)


def resolve_config_path(path: str | os.PathLike[str] | None) -> Path:
    """The config file to use: the argument, else $SIA_SLURM_CONFIG, else the system default."""
    if path:
        return Path(path)
    from_env = os.environ.get(CONFIG_ENV_VAR)
    return Path(from_env) if from_env else DEFAULT_CONFIG_PATH


def load_config(path: str | os.PathLike[str]) -> SiaConfig:
    """Read and validate the config file at ``path``."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError([SourceIssue(path, None, "", "file not found")]) from None
    except OSError as exc:
        raise ConfigError([SourceIssue(path, None, "", f"cannot read: {exc.strerror}")]) from None
    return parse_config(text, path)


def parse_config(text: str, path: Path | None = None) -> SiaConfig:
    """Validate config ``text``; relative paths in it are relative to ``path``'s directory."""
    source = parse_yaml(text, path)
    if source.data is None and source.issues:  # a syntax error: nothing to validate
        raise ConfigError(source.issues)
    data = source.data
    if data is None:
        data = {}
    if not isinstance(data, dict):
        source.issue((), f"expected a mapping of settings, got {kind_of(data)}")
        raise ConfigError(source.issues)
    if not check_config_version(data, source):  # a newer file: its other keys are not ours
        raise ConfigError(source.issues)
    warnings = retire_keys(data, source)
    config = _build(data, source)
    if source.issues or config is None:
        raise ConfigError(source.issues)
    return replace(config, warnings=tuple(warnings))


def _build(data: dict[str, Any], source: YamlSource) -> SiaConfig | None:
    check_keys(data, (), _TOP_LEVEL_KEYS, _REQUIRED_TOP_LEVEL, source)
    round_seconds = check_number(
        data.get("round_seconds", key_default("round_seconds")), ("round_seconds",), source
    )
    if round_seconds is not None and round_seconds <= 0:
        source.issue(
            ("round_seconds",), f"expected a positive number of seconds, got {round_seconds:g}"
        )
    state_dir = _state_dir(data.get("state_dir"), source)
    marker = data.get("managed_marker", key_default("managed_marker"))
    if not isinstance(marker, str) or not SLURM_NAME.match(marker):
        source.issue(
            ("managed_marker",),
            f"expected a word of letters, digits, '_', '.' or '-' (it goes into the job "
            f"comment), got {marker!r}",
        )
    dry_run = data.get("dry_run", key_default("dry_run"))
    if not isinstance(dry_run, bool):
        source.issue(("dry_run",), f"expected true or false, got {dry_run!r}")
    gpu_types = _gpu_types(data.get("gpu_types"), source)
    partitions = _partitions(data.get("partitions"), source)
    _cross_check(gpu_types, partitions, data, source)
    policy = _policy(data.get("policy"), source)
    restart = build_dataclass(RestartConfig, data.get("restart"), ("restart",), source)
    if restart is not None and restart.checkpoint_timeout_s < 0:
        source.issue(
            ("restart", "checkpoint_timeout_s"),
            f"expected a non-negative number of seconds, got {restart.checkpoint_timeout_s:g}",
        )
    if restart is not None and restart.max_slurm_failures < 0:
        source.issue(
            ("restart", "max_slurm_failures"),
            f"expected an integer >= 0, got {restart.max_slurm_failures}",
        )
    slurm = build_dataclass(SlurmConfig, data.get("slurm"), ("slurm",), source)
    if slurm is not None and slurm.backend not in BACKEND_NAMES:
        source.issue(
            ("slurm", "backend"),
            f"expected one of {', '.join(BACKEND_NAMES)}, got {slurm.backend!r}",
        )
    shares = _shares(data.get("shares"), source)
    if source.issues:
        return None
    assert round_seconds is not None and state_dir is not None and shares is not None
    assert policy is not None and restart is not None and slurm is not None
    return SiaConfig(
        path=source.path,
        round_seconds=round_seconds,
        state_dir=state_dir,
        managed_marker=marker,
        dry_run=dry_run,
        gpu_types=gpu_types,
        partitions=partitions,
        policy=policy,
        restart=restart,
        slurm=slurm,
        shares=shares,
        shares_configured=data.get("shares") is not None,
    )


def _state_dir(value: Any, source: YamlSource) -> Path | None:
    if value is None:
        return None  # reported as missing by check_keys
    if not isinstance(value, str) or not value.strip():
        source.issue(("state_dir",), f"expected a directory path, got {value!r}")
        return None
    state_dir = Path(value)
    if not state_dir.is_absolute() and source.path is not None:
        state_dir = source.path.parent / state_dir
    return state_dir


def _gpu_types(value: Any, source: YamlSource) -> tuple[GpuTypeConfig, ...]:
    """``gpu_types`` is optional: types named by partitions are declared implicitly."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        source.issue(
            ("gpu_types",), f"expected a mapping of GPU type name to settings, got {kind_of(value)}"
        )
        return ()
    result = []
    for name, settings in value.items():
        keypath = ("gpu_types", name)
        check_name(name, keypath, "GPU type", source)
        if settings is None:
            settings = {}
        if not isinstance(settings, dict):
            source.issue(
                keypath, f"expected a mapping like {{profile: {name}}}, got {kind_of(settings)}"
            )
            continue
        check_keys(settings, keypath, keys_under("gpu_types.<type>"), (), source)
        profile = settings.get("profile", name)
        if not isinstance(profile, str) or not profile:
            source.issue((*keypath, "profile"), f"expected a profile GPU-type key, got {profile!r}")
            continue
        result.append(GpuTypeConfig(name=name, profile=profile))
    return tuple(result)


def _partitions(value: Any, source: YamlSource) -> tuple[PartitionConfig, ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not value:
        source.issue(
            ("partitions",),
            "expected a non-empty mapping of Slurm partition name to "
            f"{{gpu_type, gpus_per_node}}, got {kind_of(value)}",
        )
        return ()
    result = []
    for name, settings in value.items():
        keypath = ("partitions", name)
        check_name(name, keypath, "partition", source)
        if not isinstance(settings, dict):
            source.issue(
                keypath,
                "expected a mapping like {gpu_type: a100, gpus_per_node: 4}, "
                f"got {kind_of(settings)}",
            )
            continue
        allowed = keys_under("partitions.<partition>")
        required = tuple(name for name, key in allowed.items() if key.required)
        check_keys(settings, keypath, allowed, required, source)
        gpu_type = settings.get("gpu_type")
        gpus = settings.get("gpus_per_node")
        ok = True
        if "gpu_type" in settings and (not isinstance(gpu_type, str) or not gpu_type):
            source.issue((*keypath, "gpu_type"), f"expected a GPU type name, got {gpu_type!r}")
            ok = False
        if "gpus_per_node" in settings and (
            isinstance(gpus, bool) or not isinstance(gpus, int) or gpus <= 0
        ):
            source.issue((*keypath, "gpus_per_node"), f"expected a positive integer, got {gpus!r}")
            ok = False
        if ok and gpu_type is not None and gpus is not None:
            result.append(PartitionConfig(name=name, gpu_type=gpu_type, gpus_per_node=gpus))
    return tuple(result)


def _cross_check(
    gpu_types: tuple[GpuTypeConfig, ...],
    partitions: tuple[PartitionConfig, ...],
    data: dict[str, Any],
    source: YamlSource,
) -> None:
    """One partition per GPU type, and every declared GPU type has its partition."""
    declared = {gpu.name for gpu in gpu_types}
    owner: dict[str, str] = {}
    for partition in partitions:
        keypath = ("partitions", partition.name, "gpu_type")
        if declared and partition.gpu_type not in declared:
            source.issue(
                keypath,
                f"GPU type {partition.gpu_type!r} is not declared under "
                f"gpu_types (declared: {', '.join(sorted(declared))})",
            )
        if partition.gpu_type in owner:
            source.issue(
                keypath,
                f"GPU type {partition.gpu_type!r} is already mapped by "
                f"partition {owner[partition.gpu_type]!r}; sia-slurm needs exactly one "
                "partition per GPU type",
            )
        owner.setdefault(partition.gpu_type, partition.name)
    raw = data.get("partitions")
    if isinstance(raw, dict) and raw:
        # Count partitions that failed their own checks too, so one mistake is reported once.
        named = {s.get("gpu_type") for s in raw.values() if isinstance(s, dict)}
        for gpu in gpu_types:
            if gpu.name not in named:
                source.issue(
                    ("gpu_types", gpu.name),
                    "GPU type has no partition: map a partition to it under partitions, "
                    "or remove it",
                )


def _policy(value: Any, source: YamlSource) -> PolicySettings | None:
    """``name`` picks the policy; the other keys are the fields of its config dataclass."""
    if value is None:
        value = {}
    if not isinstance(value, dict):
        source.issue(("policy",), f"expected a mapping of settings, got {kind_of(value)}")
        return None
    name = value.get("name", "sia")
    if name not in POLICY_PARAMS:
        source.issue(
            ("policy", "name"), f"expected one of {', '.join(POLICY_PARAMS)}, got {name!r}"
        )
        return None
    params = build_dataclass(
        POLICY_PARAMS[name],
        {k: v for k, v in value.items() if k != "name"},
        ("policy",),
        source,
        extra_keys=("name",),
    )
    return None if params is None else PolicySettings(name=name, params=params)


def _shares(value: Any, source: YamlSource) -> SharesConfig | None:
    """``shares: {accounts: {name: share}, users: {name: {account, share}}, default_share,
    usage_half_life_s}``; absent: every user the same share."""
    if value is None:
        return EQUAL_USERS
    if not isinstance(value, dict):
        source.issue(("shares",), f"expected a mapping of settings, got {kind_of(value)}")
        return None
    check_keys(value, ("shares",), keys_under("shares"), (), source)
    accounts: dict[str, float] = {}
    raw_accounts = value.get("accounts") or {}
    if not isinstance(raw_accounts, dict):
        source.issue(
            ("shares", "accounts"), f"expected account: share, got {kind_of(raw_accounts)}"
        )
        raw_accounts = {}
    for name, share in raw_accounts.items():
        keypath = ("shares", "accounts", name)
        check_name(str(name), keypath, "Slurm account", source)
        number = check_positive(share, keypath, source)
        if number is not None:
            accounts[str(name)] = number
    users: dict[str, UserShareConfig] = {}
    raw_users = value.get("users") or {}
    if not isinstance(raw_users, dict):
        source.issue(
            ("shares", "users"), f"expected user: {{account, share}}, got {kind_of(raw_users)}"
        )
        raw_users = {}
    for name, settings in raw_users.items():
        keypath = ("shares", "users", name)
        check_name(str(name), keypath, "user", source)
        if not isinstance(settings, dict):
            source.issue(
                keypath,
                f"expected a mapping like {{account: a, share: 1}}, got {kind_of(settings)}",
            )
            continue
        check_keys(settings, keypath, keys_under("shares.users.<user>"), (), source)
        account = settings.get("account")
        if account is not None and (not isinstance(account, str) or not SLURM_NAME.match(account)):
            source.issue((*keypath, "account"), f"expected a Slurm account name, got {account!r}")
            continue
        share = check_positive(
            settings.get("share", key_default("shares.users.<user>.share")),
            (*keypath, "share"),
            source,
        )
        if share is not None:
            users[str(name)] = UserShareConfig(account=account, share=share)
    default_share = check_positive(
        value.get("default_share", key_default("shares.default_share")),
        ("shares", "default_share"),
        source,
    )
    half_life = check_positive(
        value.get("usage_half_life_s", key_default("shares.usage_half_life_s")),
        ("shares", "usage_half_life_s"),
        source,
    )
    limit = check_number(
        value.get("usage_factor_limit", key_default("shares.usage_factor_limit")),
        ("shares", "usage_factor_limit"),
        source,
    )
    if limit is not None and limit < 1:
        source.issue(("shares", "usage_factor_limit"), f"expected a number >= 1, got {limit:g}")
        limit = None
    if default_share is None or half_life is None or limit is None:
        return None
    return SharesConfig(
        accounts,
        users,
        default_share=default_share,
        usage_half_life_s=half_life,
        usage_factor_limit=limit,
    )
