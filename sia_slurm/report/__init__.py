"""The static dashboard: a neutral :class:`ReportData`, its sources, and the site renderer."""

from sia_slurm.report.from_db import report_from_db
from sia_slurm.report.from_sim import report_from_sim
from sia_slurm.report.report_data import GpuTypeTotal, JobRow, ReportData, RoundPoint, Segment
from sia_slurm.report.sources import ReportSourceError
from sia_slurm.report.static_site import default_site_dir, render_site

__all__ = [
    "GpuTypeTotal",
    "JobRow",
    "ReportData",
    "ReportSourceError",
    "RoundPoint",
    "Segment",
    "default_site_dir",
    "render_site",
    "report_from_db",
    "report_from_sim",
]
