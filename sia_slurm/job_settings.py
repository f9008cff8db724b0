"""What the job side (``sia_slurm.job``: ``sia-sbatch``, ``sia-launch``) needs of the site's config.

The job side reads the same config file as the controller (``sia.yaml``), but needs only a
handful of its settings: where the state tree is, the marker of managed jobs, the round length,
the GPU types (and their keys in the throughput profiles) and the partitions that hold them.
:class:`JobSiteSettings` is that narrow contract; ``sia_slurm/job/settings.py`` (the job side's one
loader) builds it from a validated :class:`~sia_slurm.config.SiaConfig` with :meth:`of`, so a
bad config is reported exactly as the controller reports it.

This module imports nothing of sia-slurm at run time: the job side can depend on it without
depending on the controller's configuration types.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sia_slurm.config import SiaConfig


@dataclass(frozen=True)
class JobPartition:
    """A Slurm partition whose nodes all carry ``gpus_per_node`` GPUs of ``gpu_type``."""

    name: str
    gpu_type: str
    gpus_per_node: int


@dataclass(frozen=True)
class JobSiteSettings:
    """The site's settings the job side uses, from a validated config."""

    state_dir: Path
    managed_marker: str
    round_seconds: float
    gpu_types: Mapping[str, str]  # GPU type name -> its key in profiles/ (e.g. "a100" -> "dgx")
    partitions: Mapping[str, JobPartition]  # partition name -> partition, in the config's order

    @classmethod
    def of(cls, config: SiaConfig) -> JobSiteSettings:
        """The job side's view of ``config`` (a :class:`~sia_slurm.config.SiaConfig`)."""
        profiles = {gpu.name: gpu.profile for gpu in config.gpu_types}
        partitions = {
            p.name: JobPartition(p.name, p.gpu_type, p.gpus_per_node) for p in config.partitions
        }
        return cls(
            state_dir=config.state_dir,
            managed_marker=config.managed_marker,
            round_seconds=config.round_seconds,
            gpu_types=MappingProxyType(profiles),
            partitions=MappingProxyType(partitions),
        )

    def profile_key(self, gpu_type: str) -> str:
        """``gpu_type``'s key in the throughput profiles (its own name unless the config maps
        it, as for a type declared only by a partition)."""
        return self.gpu_types.get(gpu_type, gpu_type)

    def partition_of(self, gpu_type: str) -> JobPartition:
        """The partition that holds ``gpu_type`` (validation guarantees exactly one)."""
        for partition in self.partitions.values():
            if partition.gpu_type == gpu_type:
                return partition
        raise KeyError(gpu_type)
