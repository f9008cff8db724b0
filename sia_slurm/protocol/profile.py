"""Reading throughput profiles: GPU types, per-app metadata, 1-GPU seed profiles, batch limits.

Both sides read them: the job side for ``sia-sbatch --app`` and ``--profile DIR`` (batch limits,
the copy it writes as ``profile.json``) and ``sia-launch``'s batch limits; the controller and the
simulator to seed each job's goodput model (:mod:`sia_slurm.model`, which touches no file).
Layout (``profiles/README.md`` documents it for sites adding their own models and GPU
types)::

    profiles/gpu_types.csv              gpu_type,gpus_per_node,trace_key,description
    profiles/<app>/app.yaml             init_batch_size, max_batch_size, min_local_bsz, description
    profiles/<app>/seed.csv             gpu_type,local_bsz,placement,step_time,sync_time
    profiles/<app>/max_local_bsz.csv    gpu_type,local_bsz  (further columns ignored)

Every error is a :class:`ProfileError` naming the file, the line, the field, what was expected and
what was found, e.g. ``profiles/cifar10/seed.csv:7: step_time: expected a positive number, got
-0.3``. Blank lines and lines starting with ``#`` in the CSV files are ignored.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

from sia_slurm.csvtable import CsvTableError, read_rows
from sia_slurm.protocol.observation import Observation
from sia_slurm.yamlsource import compose

GPU_TYPES_FILE = "gpu_types.csv"
APP_FILE = "app.yaml"
SEED_FILE = "seed.csv"
MAX_LOCAL_BSZ_FILE = "max_local_bsz.csv"
_APP_KEYS = ("init_batch_size", "max_batch_size", "min_local_bsz", "description")


class ProfileError(ValueError):
    """A profile file is missing, malformed or inconsistent; the message says where and how."""


@dataclass(frozen=True)
class GpuType:
    """A GPU type known to the profiles: its name and the node shape it usually comes in."""

    name: str
    gpus_per_node: int
    trace_key: str = ""  # name of the type in the Sia artifact's traces (data/traces/), if any
    description: str = ""


@dataclass(frozen=True)
class AppProfile:
    """What sia-slurm knows about a model before it runs: limits and 1-GPU seed measurements.

    ``init_batch_size`` is the default M0 (a job may override it), ``max_batch_size`` the largest
    global batch the job's learning-rate rule is valid for, ``min_local_bsz`` the smallest useful
    per-GPU batch, ``max_local_bsz`` the largest per-GPU batch that fits each GPU type's memory,
    and ``seed`` the profiled steps per GPU type (Sia profiles every type on 1 GPU at arrival).
    """

    name: str
    init_batch_size: int
    max_batch_size: int
    min_local_bsz: int
    max_local_bsz: Mapping[str, int]
    seed: Mapping[str, tuple[Observation, ...]]
    description: str = ""

    @property
    def gpu_types(self) -> tuple[str, ...]:
        """GPU types this app can run on (those with a memory limit), sorted."""
        return tuple(sorted(self.max_local_bsz))


@dataclass(frozen=True)
class ProfileSet:
    """All profiles under one directory."""

    root: Path
    gpu_types: Mapping[str, GpuType]
    apps: Mapping[str, AppProfile] = field(default_factory=dict)

    def app(self, name: str) -> AppProfile:
        """The named app, or a :class:`ProfileError` listing the known ones."""
        try:
            return self.apps[name]
        except KeyError:
            known = ", ".join(sorted(self.apps)) or "none"
            raise ProfileError(
                f"{self.root}: no profile for app {name!r} (known apps: {known})"
            ) from None


# Where a wheel installs the shipped profiles, under its installation scheme's data directory
# (pyproject.toml's data-files: ``profiles/`` sits beside the packages, so it cannot be package
# data without moving it, and the whole tree and its documents name it by that path).
INSTALLED_PROFILES = "share/sia-slurm/profiles"


def default_profiles_dir() -> Path:
    """The shipped profiles: the repository's ``profiles/`` (next to the ``sia_slurm`` package) in
    a checkout or an editable install, else the copy an installed wheel put under
    ``INSTALLED_PROFILES``, found through the distribution's own file list so that a venv, a
    ``--user`` or a ``--prefix`` install all work. With neither, the checkout's path, so that
    the error names the directory a site would expect."""
    checkout = Path(__file__).resolve().parents[2] / "profiles"
    if checkout.is_dir():
        return checkout
    return _installed_profiles_dir() or checkout


def _installed_profiles_dir() -> Path | None:
    """``INSTALLED_PROFILES`` of the installed sia-slurm distribution, if it has one."""
    import importlib.metadata  # only an installed wheel gets here

    try:
        files = importlib.metadata.files("sia-slurm") or []
    except importlib.metadata.PackageNotFoundError:
        return None
    marker = f"{INSTALLED_PROFILES}/gpu_types.csv"
    for entry in files:
        if entry.as_posix().endswith(marker):
            return Path(str(entry.locate())).resolve().parent
    return None


def parse_placement(text: str) -> tuple[int, int]:
    """``"44"`` (GPUs per node, one digit per node) -> (nodes=2, gpus=8)."""
    if not text or not text.isdigit() or "0" in text:
        raise ValueError(f"expected digits 1-9, one per node (e.g. 44), got {text!r}")
    return len(text), sum(int(c) for c in text)


# --------------------------------------------------------------------------------------------
# CSV helpers


def _csv_rows(path: Path, required: tuple[str, ...]) -> Iterator[tuple[int, dict[str, str]]]:
    """Yield (line number, row) for each data line; checks the header names ``required``."""
    try:
        yield from read_rows(path, required)
    except CsvTableError as exc:
        raise ProfileError(str(exc)) from None


def _positive_int(where: str, name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1 or str(value) != text.lstrip("+"):
        raise ProfileError(f"{where}: {name}: expected a positive integer, got {text!r}")
    return value


def _trace_int(where: str, name: str, text: str) -> int:
    """Integers in the artifact's traces are sometimes written as floats (``20.0``)."""
    value = _number(where, name, text, positive=True)
    if value != int(value):
        raise ProfileError(f"{where}: {name}: expected a positive integer, got {text!r}")
    return int(value)


def _number(where: str, name: str, text: str, *, positive: bool) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    ok = math.isfinite(value) and (value > 0 if positive else value >= 0)
    if not ok:
        what = "a positive number" if positive else "a number >= 0"
        raise ProfileError(f"{where}: {name}: expected {what}, got {text}")
    return value


def _known_type(where: str, text: str, gpu_types: Mapping[str, GpuType], source: str) -> str:
    if text not in gpu_types:
        known = ", ".join(sorted(gpu_types))
        raise ProfileError(f"{where}: gpu_type: expected one of {known} ({source}), got {text!r}")
    return text


# --------------------------------------------------------------------------------------------
# Loaders


def load_gpu_types(path: Path) -> dict[str, GpuType]:
    """Read ``gpu_types.csv``."""
    types: dict[str, GpuType] = {}
    for lineno, row in _csv_rows(path, ("gpu_type", "gpus_per_node")):
        where = f"{path}:{lineno}"
        name = row["gpu_type"]
        if not name or not all(c.isalnum() or c in "-_." for c in name):
            raise ProfileError(
                f"{where}: gpu_type: expected a name of letters, digits, '-', '_' or '.', "
                f"got {name!r}"
            )
        if name in types:
            raise ProfileError(f"{where}: gpu_type: expected a unique name, got {name!r} again")
        types[name] = GpuType(
            name=name,
            gpus_per_node=_positive_int(where, "gpus_per_node", row["gpus_per_node"]),
            trace_key=row.get("trace_key", ""),
            description=row.get("description", ""),
        )
    if not types:
        raise ProfileError(f"{path}: expected at least one GPU type, got none")
    return types


def _load_app_yaml(path: Path) -> dict[str, Any]:
    """Read ``app.yaml`` and validate its keys and values (line numbers from the YAML nodes)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ProfileError(f"{path}: file not found") from None
    try:
        node = compose(text)
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: expected valid YAML, got: {exc}") from None
    if not isinstance(node, yaml.MappingNode):
        raise ProfileError(f"{path}: expected a mapping of {', '.join(_APP_KEYS)}, got {text!r}")
    values: dict[str, Any] = {}
    lines: dict[str, int] = {}
    for key_node, value_node in node.value:
        key = key_node.value
        where = f"{path}:{key_node.start_mark.line + 1}"
        if key not in _APP_KEYS:
            raise ProfileError(
                f"{where}: {key}: expected one of {', '.join(_APP_KEYS)}, got {key!r}"
            )
        if key == "description":
            values[key] = str(value_node.value)
        else:
            values[key] = _positive_int(where, key, str(value_node.value))
        lines[key] = key_node.start_mark.line + 1
    for key in ("init_batch_size", "max_batch_size", "min_local_bsz"):
        if key not in values:
            raise ProfileError(f"{path}: {key}: expected a positive integer, got nothing (missing)")
    if not values["min_local_bsz"] <= values["init_batch_size"] <= values["max_batch_size"]:
        raise ProfileError(
            f"{path}:{lines['init_batch_size']}: init_batch_size: expected min_local_bsz "
            f"({values['min_local_bsz']}) <= init_batch_size <= max_batch_size "
            f"({values['max_batch_size']}), got {values['init_batch_size']}"
        )
    return values


def _load_max_local_bsz(
    path: Path, gpu_types: Mapping[str, GpuType], types_source: str
) -> tuple[dict[str, int], dict[str, int]]:
    """Read ``max_local_bsz.csv``: limit per type, and the line each limit came from."""
    limits: dict[str, int] = {}
    lines: dict[str, int] = {}
    for lineno, row in _csv_rows(path, ("gpu_type", "local_bsz")):
        where = f"{path}:{lineno}"
        name = _known_type(where, row["gpu_type"], gpu_types, types_source)
        if name in limits:
            raise ProfileError(
                f"{where}: gpu_type: expected one row per type, got {name!r} again "
                f"(first on line {lines[name]})"
            )
        limits[name] = _positive_int(where, "local_bsz", row["local_bsz"])
        lines[name] = lineno
    return limits, lines


def _load_seed(
    path: Path,
    gpu_types: Mapping[str, GpuType],
    types_source: str,
    limits: Mapping[str, int],
    limit_lines: Mapping[str, int],
    limits_path: Path,
) -> dict[str, tuple[Observation, ...]]:
    """Read ``seed.csv`` into observations per GPU type, checked against the batch limits."""
    seed: dict[str, list[Observation]] = {}
    for lineno, row in _csv_rows(
        path, ("gpu_type", "local_bsz", "placement", "step_time", "sync_time")
    ):
        where = f"{path}:{lineno}"
        name = _known_type(where, row["gpu_type"], gpu_types, types_source)
        if name not in limits:
            raise ProfileError(
                f"{where}: gpu_type: expected a type with a row in {limits_path}, got {name!r}"
            )
        local_bsz = _positive_int(where, "local_bsz", row["local_bsz"])
        if local_bsz > limits[name]:
            raise ProfileError(
                f"{where}: local_bsz: expected at most {limits[name]} (max_local_bsz of {name}, "
                f"{limits_path}:{limit_lines[name]}), got {local_bsz}"
            )
        try:
            nodes, gpus = parse_placement(row["placement"])
        except ValueError as exc:
            raise ProfileError(f"{where}: placement: {exc}") from None
        step = _number(where, "step_time", row["step_time"], positive=True)
        sync = _number(where, "sync_time", row["sync_time"], positive=False)
        if sync >= step:
            raise ProfileError(
                f"{where}: sync_time: expected less than step_time ({row['step_time']}), "
                f"got {row['sync_time']}"
            )
        seed.setdefault(name, []).append(Observation(nodes, gpus, local_bsz, step, sync))
    return {name: tuple(points) for name, points in seed.items()}


def load_app_profile(
    app_dir: Path, gpu_types: Mapping[str, GpuType], types_source: str = ""
) -> AppProfile:
    """Read and cross-check one app directory: ``app.yaml``, ``seed.csv``, ``max_local_bsz.csv``."""
    source = types_source or GPU_TYPES_FILE
    meta = _load_app_yaml(app_dir / APP_FILE)
    limits_path = app_dir / MAX_LOCAL_BSZ_FILE
    limits, limit_lines = _load_max_local_bsz(limits_path, gpu_types, source)
    seed = _load_seed(app_dir / SEED_FILE, gpu_types, source, limits, limit_lines, limits_path)
    return AppProfile(
        name=app_dir.name,
        init_batch_size=meta["init_batch_size"],
        max_batch_size=meta["max_batch_size"],
        min_local_bsz=meta["min_local_bsz"],
        max_local_bsz=MappingProxyType(dict(sorted(limits.items()))),
        seed=MappingProxyType(dict(sorted(seed.items()))),
        description=meta.get("description", ""),
    )


def load_profiles(root: Path | str | None = None) -> ProfileSet:
    """Load ``gpu_types.csv`` and every app directory under ``root`` (default: the repo's)."""
    base = Path(root) if root is not None else default_profiles_dir()
    if not base.is_dir():
        raise ProfileError(f"{base}: expected a profiles directory, got no such directory")
    types_path = base / GPU_TYPES_FILE
    gpu_types = load_gpu_types(types_path)
    apps = {
        d.name: load_app_profile(d, gpu_types, str(types_path))
        for d in sorted(base.iterdir())
        if d.is_dir() and not d.name.startswith((".", "_"))
    }
    return ProfileSet(
        root=base,
        gpu_types=MappingProxyType(gpu_types),
        apps=MappingProxyType(apps),
    )


def read_trace_points(path: Path | str) -> list[Observation]:
    """Read an artifact trace (``placements-*.csv`` or ``scalability-*.csv``) as observations.

    Placements files give the shape as a ``placement`` string, scalability files as
    ``num_nodes,num_replicas``; columns may come in any order.
    """
    file = Path(path)
    with file.open(encoding="utf-8") as f:
        header = next(csv.reader([f.readline()]))
    shape_columns = ("placement",) if "placement" in header else ("num_nodes", "num_replicas")
    points = []
    for lineno, row in _csv_rows(file, ("local_bsz", "step_time", "sync_time", *shape_columns)):
        where = f"{file}:{lineno}"
        if "placement" in row:
            try:
                nodes, gpus = parse_placement(row["placement"])
            except ValueError as exc:
                raise ProfileError(f"{where}: placement: {exc}") from None
        else:
            nodes = _trace_int(where, "num_nodes", row["num_nodes"])
            gpus = _trace_int(where, "num_replicas", row["num_replicas"])
        step = _number(where, "step_time", row["step_time"], positive=True)
        sync = min(_number(where, "sync_time", row["sync_time"], positive=False), step * 0.999)
        local_bsz = _trace_int(where, "local_bsz", row["local_bsz"])
        points.append(Observation(nodes, gpus, local_bsz, step, sync))
    return points
