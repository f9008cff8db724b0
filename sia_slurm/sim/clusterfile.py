"""Simulated cluster shapes: which GPU types, how many nodes of each, and where their data is.

A cluster file (``etc/clusters/*.yaml``) is a mapping::

    name: hetero64                # optional; defaults to the file name without .yaml
    description: free text        # optional
    gpu_types:                    # required, at least one
      t4:                         # the GPU type's name in the simulated cluster
        profile: t4               # its type in profiles/gpu_types.csv (default: the name)
        trace_key: aws            # its key in data/traces/<app>/placements-<key>.csv (required)
        gpus_per_node: 4          # positive integer (required)
        nodes: 6                  # positive integer (required)
    restart:                      # optional: the cluster's own restart time, whatever the app
      start_s: 9.0                # a Start: grant -> the job trains (launch, restore)
      move_s: 16.0                # a Move: grant -> the job trains on its new GPUs

Without ``restart`` each grant costs the app's true restart delay
(:mod:`sia_slurm.sim.restart`, the paper's measurements). ``restart`` is for a cluster whose
restart time is a property of the cluster rather than of the app, measured there: the dev
cluster, whose emulated trainers restore in a moment while Slurm's requeue floor
(``cred_expire``), srun and torchrun take what they take (``benchmarks/restart_time.py``).
Those seconds are wall-clock seconds of that cluster and are not compressed with the workload.

Loading collects every problem and raises one :class:`ClusterError` whose lines read
``etc/clusters/x.yaml:7: gpu_types.t4.nodes: expected a positive integer, got 0``. A GPU type
without ground truth for some app is fine to load (the app's jobs simply cannot use it);
:func:`check_ground_truth` lists those (app, GPU type) pairs.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sia_slurm.config_checks import check_keys
from sia_slurm.sim.groundtruth import has_ground_truth, placements_file
from sia_slurm.yamlsource import KeyPath, SourceIssue, YamlSource, parse_yaml

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_TOP_KEYS = ("name", "description", "gpu_types", "restart")
_RESTART_KEYS = ("start_s", "move_s")
_TYPE_KEYS = ("profile", "trace_key", "gpus_per_node", "nodes")


class ClusterError(ValueError):
    """A cluster file could not be used; ``issues`` lists every problem found, in file order."""

    def __init__(self, issues: list[SourceIssue]):
        self.issues = sorted(issues, key=lambda issue: issue.line or 0)
        super().__init__("\n".join(str(issue) for issue in self.issues))


@dataclass(frozen=True)
class ClusterGpuType:
    """``nodes`` identical nodes of ``gpus_per_node`` GPUs of one type."""

    name: str
    profile: str  # GPU type in profiles/ (the policy's throughput seed)
    trace_key: str  # GPU type in data/traces/ (the simulator's ground truth)
    gpus_per_node: int
    nodes: int

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes


@dataclass(frozen=True)
class ClusterRestart:
    """Seconds a grant of GPUs costs on this cluster before the job trains, whatever its app."""

    start_s: float  # a Start (first start, or a start after a stop)
    move_s: float  # a Move (stop, requeue and start again in the same round)

    def __post_init__(self) -> None:
        for name in _RESTART_KEYS:
            value = getattr(self, name)
            if not _is_seconds(value):
                raise ValueError(f"{name}: expected a number of seconds >= 0, got {value!r}")


@dataclass(frozen=True)
class ClusterSpec:
    """A simulated cluster: its GPU types in file order, and its own restart time if it has one."""

    name: str
    gpu_types: tuple[ClusterGpuType, ...]
    path: Path | None = None
    description: str = ""
    restart: ClusterRestart | None = None

    @property
    def total_gpus(self) -> int:
        return sum(t.gpus for t in self.gpu_types)

    def gpu_type(self, name: str) -> ClusterGpuType:
        """The named GPU type, or a KeyError listing the cluster's types."""
        for gpu_type in self.gpu_types:
            if gpu_type.name == name:
                return gpu_type
        known = ", ".join(t.name for t in self.gpu_types)
        raise KeyError(f"cluster {self.name!r} has no GPU type {name!r} (it has {known})")


@dataclass(frozen=True)
class MissingGroundTruth:
    """An (app, GPU type) pair of a cluster without a ground-truth file."""

    app: str
    gpu_type: str
    trace_key: str
    path: Path  # the file that would hold it

    def __str__(self) -> str:
        return f"{self.app} on {self.gpu_type} (trace key {self.trace_key}): {self.path} missing"


def load_cluster(path: Path | str, *, profile_types: Collection[str] | None = None) -> ClusterSpec:
    """Read and validate a cluster file; ``profile_types`` (if given) are the valid profiles."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ClusterError([SourceIssue(path, None, "", "file not found")]) from None
    except OSError as exc:
        raise ClusterError([SourceIssue(path, None, "", f"cannot read: {exc.strerror}")]) from None
    return parse_cluster(text, path, profile_types=profile_types)


def parse_cluster(
    text: str, path: Path | None = None, *, profile_types: Collection[str] | None = None
) -> ClusterSpec:
    """Validate cluster-file ``text`` (``path`` is only used in messages and the default name)."""
    source = parse_yaml(text, path)
    if source.data is None and source.issues:
        raise ClusterError(source.issues)
    data = source.data
    if not isinstance(data, dict):
        source.issue((), f"expected a mapping with keys {', '.join(_TOP_KEYS)}, got {data!r}")
        raise ClusterError(source.issues)
    check_keys(data, (), _TOP_KEYS, (), source)
    default_name = path.stem if path is not None else "cluster"
    name = _name(data.get("name", default_name), ("name",), source)
    description = data.get("description", "")
    if not isinstance(description, str):
        source.issue(("description",), f"expected text, got {description!r}")
    gpu_types = _gpu_types(data.get("gpu_types"), source, profile_types)
    restart = _restart(data["restart"], source) if "restart" in data else None
    if source.issues:
        raise ClusterError(source.issues)
    return ClusterSpec(name, gpu_types, path, str(description), restart)


def check_ground_truth(
    cluster: ClusterSpec, apps: Iterable[str], traces_dir: Path | str
) -> tuple[MissingGroundTruth, ...]:
    """The (app, GPU type) pairs of ``cluster`` with no placements file under ``traces_dir``."""
    missing = []
    for app in apps:
        for gpu_type in cluster.gpu_types:
            if not has_ground_truth(Path(traces_dir), app, gpu_type.trace_key):
                where = placements_file(Path(traces_dir), app, gpu_type.trace_key)
                missing.append(MissingGroundTruth(app, gpu_type.name, gpu_type.trace_key, where))
    return tuple(missing)


def _gpu_types(
    value: Any, source: YamlSource, profile_types: Collection[str] | None
) -> tuple[ClusterGpuType, ...]:
    keypath: KeyPath = ("gpu_types",)
    if value is None:
        source.issue(keypath, "expected a mapping of GPU type name to its settings, got nothing")
        return ()
    if not isinstance(value, dict) or not value:
        source.issue(keypath, f"expected a non-empty mapping of GPU types, got {value!r}")
        return ()
    types = []
    for type_name, settings in value.items():
        here = (*keypath, type_name)
        _name(type_name, here, source)
        if not isinstance(settings, dict):
            source.issue(
                here, f"expected a mapping with keys {', '.join(_TYPE_KEYS)}, got {settings!r}"
            )
            continue
        check_keys(settings, here, _TYPE_KEYS, (), source)
        profile = _name(settings.get("profile", type_name), (*here, "profile"), source)
        if profile_types is not None and profile not in profile_types:
            source.issue(
                (*here, "profile"),
                f"expected one of {', '.join(sorted(profile_types))} (profiles/gpu_types.csv), "
                f"got {profile!r}",
            )
        trace_key = ""
        if "trace_key" in settings:
            trace_key = _name(settings["trace_key"], (*here, "trace_key"), source)
        else:
            source.issue(
                (*here, "trace_key"),
                "expected the GPU type's key in data/traces/ (e.g. aws), got nothing (missing)",
            )
        gpus_per_node = _positive_int(
            settings.get("gpus_per_node"), (*here, "gpus_per_node"), source
        )
        nodes = _positive_int(settings.get("nodes"), (*here, "nodes"), source)
        types.append(ClusterGpuType(type_name, profile, trace_key, gpus_per_node, nodes))
    return tuple(types)


def _is_seconds(value: Any) -> bool:
    """A finite number of seconds >= 0 (YAML's ``yes`` is a bool, not a number)."""
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value >= 0
    )


def _restart(value: Any, source: YamlSource) -> ClusterRestart | None:
    keypath: KeyPath = ("restart",)
    if not isinstance(value, dict):
        source.issue(keypath, f"expected a mapping with keys start_s, move_s, got {value!r}")
        return None
    check_keys(value, keypath, _RESTART_KEYS, (), source)
    seconds = {}
    for key in _RESTART_KEYS:
        number = value.get(key)
        if not _is_seconds(number):
            source.issue((*keypath, key), f"expected a number of seconds >= 0, got {number!r}")
        else:
            seconds[key] = float(number)
    if len(seconds) != len(_RESTART_KEYS):
        return None
    return ClusterRestart(**seconds)


def _name(value: Any, keypath: KeyPath, source: YamlSource) -> str:
    if isinstance(value, str) and _NAME.match(value):
        return value
    source.issue(keypath, f"expected a name of letters, digits, '_', '.' or '-', got {value!r}")
    return str(value)


def _positive_int(value: Any, keypath: KeyPath, source: YamlSource) -> int:
    if value is None:
        source.issue(keypath, "expected a positive integer, got nothing (missing)")
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        source.issue(keypath, f"expected a positive integer, got {value!r}")
        return 0
    return value
