"""The training applications of the Sia artifact, and where their measured data lives.

The simulator replays measured data of seven applications (``data/README.md``): six data-parallel
ones and ``gpt_pmp``, a pipeline-parallel GPT whose gradient statistics are borrowed from bert
because the artifact measured none for it. Per-app numbers (completion epochs, restart delays,
calibration factors) live next to the code that uses them; this module only names the apps.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

DATA_PARALLEL_APPS: tuple[str, ...] = (
    "bert",
    "cifar10",
    "deepspeech2",
    "imagenet",
    "ncf",
    "yolov3",
)
APPS: tuple[str, ...] = (*DATA_PARALLEL_APPS, "gpt_pmp")

# Apps without their own validation traces take another app's gradient statistics (and epochs).
STATS_DONOR = MappingProxyType({"gpt_pmp": "bert"})


def default_traces_dir() -> Path:
    """The repository's ``data/traces/`` directory (one folder per app)."""
    return Path(__file__).resolve().parents[2] / "data" / "traces"


def default_workloads_dir() -> Path:
    """The repository's ``data/workloads/`` directory."""
    return Path(__file__).resolve().parents[2] / "data" / "workloads"
