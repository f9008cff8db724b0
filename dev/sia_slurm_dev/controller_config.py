"""The controller's ``sia.yaml`` for a dev cluster: one partition per GPU type, nothing else.

Tests, benchmarks, the demo and ``sia-slurm dev-cluster config`` all need a config that matches
the dev cluster they started; rendering it in one place keeps them from drifting apart (a
partition renamed in the spec but not in a hand-written copy silently leaves GPUs unmanaged).
The result is ordinary YAML that :func:`sia_slurm.config.load_config` validates like any other.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import yaml

from sia_slurm_dev.spec import DevClusterSpec

# The dev cluster's GPU type names -> their throughput profiles (profiles/gpu_types.csv). A type
# not listed is its own profile name; `sia-slurm config check` reports it if there is none.
DEFAULT_PROFILES: Mapping[str, str] = {"a100": "dgx", "rtx": "rtx", "t4": "t4"}

PolicyValue = str | int | float | bool


def controller_config(
    spec: DevClusterSpec,
    state_dir: Path | str,
    *,
    round_seconds: float = 60.0,
    policy: str = "sia",
    policy_params: Mapping[str, PolicyValue] | None = None,
    dry_run: bool = False,
    checkpoint_timeout_s: float = 60.0,
    profiles: Mapping[str, str] = DEFAULT_PROFILES,
    comment: str = "",
    bin_dir: Path | str | None = None,
) -> str:
    """The text of a ``sia.yaml`` managing every partition of ``spec``, state in ``state_dir``.

    ``policy_params`` are the policy's own keys (e.g. ``{"lambda_a": 0.01}``), validated by the
    policy when the config is loaded. ``bin_dir``: the Slurm commands' directory
    (``slurm.bin_dir``; a dev cluster of a root's release has its wrappers there, ``DevCluster.
    bin_dir``); None leaves it to PATH. ``comment`` becomes the first line(s), ``#``-prefixed.
    """
    if not round_seconds > 0 or not checkpoint_timeout_s >= 0:
        raise ValueError("round_seconds must be > 0 and checkpoint_timeout_s >= 0")
    params = dict(policy_params or {})
    if "name" in params:
        raise ValueError("policy_params: give the policy's name as policy=, not as a parameter")
    document = {
        "round_seconds": round_seconds,
        "state_dir": str(state_dir),
        "managed_marker": "sia-slurm",
        "dry_run": dry_run,
        "gpu_types": {
            g.gpu_type: {"profile": profiles.get(g.gpu_type, g.gpu_type)} for g in spec.groups
        },
        "partitions": {
            g.partition: {"gpu_type": g.gpu_type, "gpus_per_node": g.gpus_per_node}
            for g in spec.groups
        },
        "policy": {"name": policy, **params},
        "restart": {"checkpoint_timeout_s": checkpoint_timeout_s},
    }
    if bin_dir is not None:
        document["slurm"] = {"bin_dir": str(bin_dir)}
    header = "".join(f"# {line}\n" for line in comment.splitlines())
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=None)
