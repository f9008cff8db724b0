"""The job side's one door to the site's config file: :func:`load_job_settings`.

``sia-sbatch`` and ``sia-launch`` read the controller's ``sia.yaml`` with the controller's own
loader (so a bad file is reported exactly as ``sia-slurm config check`` reports it: every
problem, as ``file:line: key: ...``), then keep only the settings the job side uses
(:class:`~sia_slurm.job_settings.JobSiteSettings`). This is the only module under ``sia_slurm/job/``
that imports :mod:`sia_slurm.config` (``tests/job/test_job_side_contract.py``).
"""

from __future__ import annotations

import os

from sia_slurm.config import ConfigError, load_config, resolve_config_path
from sia_slurm.job_settings import JobPartition, JobSiteSettings

__all__ = [
    "ConfigError",
    "JobPartition",
    "JobSiteSettings",
    "load_job_settings",
    "resolve_config_path",
]


def load_job_settings(path: str | os.PathLike[str]) -> JobSiteSettings:
    """The job side's settings from the config file at ``path``; :class:`ConfigError` (every
    problem found) if the file cannot be used."""
    return JobSiteSettings.of(load_config(path))
