"""Allocation policies (Sia, Pollux, Gavel, FIFO) and placement; see :mod:`.base` for the seam."""

from sia_slurm.policy.base import (
    Allocation,
    ClusterView,
    GpuTypeView,
    JobAllocation,
    JobView,
    NodeShare,
    NodeView,
    Policy,
    PolicyInput,
    SolveInfo,
)

__all__ = [
    "Allocation",
    "ClusterView",
    "GpuTypeView",
    "JobAllocation",
    "JobView",
    "NodeShare",
    "NodeView",
    "Policy",
    "PolicyInput",
    "SolveInfo",
]
