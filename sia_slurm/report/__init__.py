"""The static dashboard: a neutral :class:`ReportData`, its sources, and the site renderer."""

from sia_slurm.report.data import GpuTypeTotal, JobRow, ReportData, RoundPoint, Segment
from sia_slurm.report.render import default_site_dir, render_site

__all__ = [
    "GpuTypeTotal",
    "JobRow",
    "ReportData",
    "RoundPoint",
    "Segment",
    "default_site_dir",
    "render_site",
]
