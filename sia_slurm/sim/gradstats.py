"""Gradient statistics as training proceeds, and when a simulated job is done.

The artifact trained each app to completion at several fixed batch sizes and logged, once per
epoch, ``progress,iteration,metric,grad_sqr,grad_var`` (``data/traces/<app>/validation-<bsz>.csv``).
The simulator replays these to give a job the statistical efficiency it would really have.

Units. ``progress`` in the files counts *M0-equivalent iterations* (AdaScale's scale-invariant
iterations): one iteration at the app's smallest validated batch ``M0`` adds 1, a larger batch adds
its gain. Rows sit at epoch boundaries of that measure (cifar10: 391, 782, ... for 50,000 images at
M0 = 128). This module exposes progress as **M0-equivalent samples** = file progress x M0, which is
what a simulator accumulates when it adds ``goodput x seconds`` (goodput = efficiency-adjusted
samples per second, reference section 6).

Dataset size. ``samples_per_epoch`` = M0 x (last ``progress`` of the M0 file) / (its number of
rows): the M0 file has one row per epoch and, at M0, progress equals iterations. This gives
50,000.6 for cifar10 and 1,281,168 for imagenet (true sizes 50,000 and 1,281,167). A job completes
after ``max_epochs x samples_per_epoch`` M0-equivalent samples (cifar10 100 epochs, deepspeech2
80, bert 2, yolov3 50, imagenet 90, ncf 10; apps borrowing statistics borrow the epochs too).

Batch size. Statistics depend on the trajectory, so a job running at batch ``M`` reads the file of
the validated batch nearest to ``M`` on a log scale (ties go to the smaller batch). No rescaling is
applied between files: ``grad_var`` in every file is already normalised to M0 — the estimator
multiplies the replica variance by ``scale = M/M0`` (reference section 2) — so it is the variance
of an M0-sample gradient and the pair plugs straight into ``gain`` with ``scale = M/M0``. (The
imagenet files agree: late-training ``grad_var`` is 43.5 at M = 200 and 50.5 at M = 12,800.)
:meth:`AppGradStats.stats` converts to a job whose M0 differs from the app's: the variance of a mean
over ``B`` samples scales as ``1/B``, so ``grad_var_job = grad_var x M0_app / M0_job``.

Interpolation: linear in progress between rows; before the first row the first row's values,
after the last row the last row's (training has converged there).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

import numpy as np
import numpy.typing as npt

from sia_slurm.csvtable import CsvTableError, read_rows
from sia_slurm.model.efficiency import GradientStats
from sia_slurm.sim.apps import STATS_DONOR

FloatArray = npt.NDArray[np.float64]

MAX_EPOCHS = MappingProxyType(
    {"cifar10": 100, "deepspeech2": 80, "bert": 2, "yolov3": 50, "imagenet": 90, "ncf": 10}
)
_VALIDATION_NAME = re.compile(r"^validation-([1-9][0-9]*)\.csv$")
_COLUMNS = ("progress", "grad_sqr", "grad_var")


class GradStatsError(ValueError):
    """Validation traces are missing or malformed; the message names the file and line."""


@dataclass(frozen=True, eq=False)
class ValidationCurve:
    """One validation file: gradient statistics over progress, trained at ``batch_size``."""

    path: Path
    batch_size: int
    progress: FloatArray  # M0-equivalent samples, strictly increasing
    grad_sqr: FloatArray
    grad_var: FloatArray  # normalised to the app's M0

    def at(self, progress: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """(grad_sqr, grad_var) at ``progress`` (M0-equivalent samples), held at the ends."""
        x = np.asarray(progress, dtype=np.float64)
        return np.interp(x, self.progress, self.grad_sqr), np.interp(
            x, self.progress, self.grad_var
        )


@dataclass(frozen=True)
class AppGradStats:
    """Gradient statistics of one app at every validated batch size, and its completion target.

    ``app`` is the app asked for, ``stats_app`` the one whose files were read (they differ for
    borrowers such as gpt_pmp). ``init_batch_size`` is M0, the smallest validated batch.
    """

    app: str
    stats_app: str
    init_batch_size: int
    samples_per_epoch: float
    max_epochs: float
    curves: Mapping[int, ValidationCurve]

    @classmethod
    def load(
        cls, traces_dir: Path | str, app: str, *, max_epochs: float | None = None
    ) -> AppGradStats:
        """Read ``<traces_dir>/<stats app>/validation-*.csv``; ``max_epochs`` defaults per app."""
        stats_app = STATS_DONOR.get(app, app)
        epochs = MAX_EPOCHS.get(stats_app) if max_epochs is None else max_epochs
        if epochs is None or not epochs > 0:
            known = ", ".join(sorted(MAX_EPOCHS))
            raise GradStatsError(
                f"{app}: max_epochs: expected a positive number (defaults exist for {known}), "
                f"got {epochs!r}"
            )
        files = _validation_files(Path(traces_dir) / stats_app)
        m0 = min(files)
        curves = {bsz: _read_curve(path, bsz, m0) for bsz, path in sorted(files.items())}
        base = curves[m0]
        per_epoch = float(base.progress[-1]) / base.progress.size
        return cls(app, stats_app, m0, per_epoch, float(epochs), MappingProxyType(curves))

    @property
    def batch_sizes(self) -> tuple[int, ...]:
        return tuple(self.curves)

    @property
    def completion_samples(self) -> float:
        """M0-equivalent samples after which a job of this app is done."""
        return self.max_epochs * self.samples_per_epoch

    def curve_for(self, batch_size: float) -> ValidationCurve:
        """The file of the validated batch nearest ``batch_size`` in log scale (ties: smaller)."""
        if not batch_size > 0:
            raise ValueError(f"batch_size: expected a positive number, got {batch_size!r}")
        nearest = min(self.curves, key=lambda b: (abs(math.log(b / batch_size)), b))
        return self.curves[nearest]

    def at(self, batch_size: float, progress: npt.ArrayLike) -> tuple[FloatArray, FloatArray]:
        """(grad_sqr, grad_var at the app's M0) for a job at ``batch_size``; broadcasts progress."""
        return self.curve_for(batch_size).at(progress)

    def stats(
        self, batch_size: float, progress: float, *, init_batch_size: float | None = None
    ) -> GradientStats:
        """The statistics as the goodput model takes them, normalised to the job's own M0.

        ``init_batch_size`` is the job's M0 (default: the app's); see the module doc.
        """
        grad_sqr, grad_var = self.at(batch_size, progress)
        job_m0 = self.init_batch_size if init_batch_size is None else init_batch_size
        return GradientStats(float(grad_sqr), float(grad_var) * self.init_batch_size / job_m0)


def _validation_files(folder: Path) -> dict[int, Path]:
    found: dict[int, Path] = {}
    if folder.is_dir():
        for path in folder.iterdir():
            match = _VALIDATION_NAME.match(path.name)
            if match and path.is_file():
                found[int(match.group(1))] = path
    if not found:
        raise GradStatsError(f"{folder}: expected validation-<batch size>.csv files, found none")
    return found


def _read_curve(path: Path, batch_size: int, m0: int) -> ValidationCurve:
    """Read one validation file; progress must strictly increase, statistics be finite."""
    rows: list[tuple[float, float, float]] = []
    try:
        for lineno, row in read_rows(path, _COLUMNS):
            where = f"{path}:{lineno}"
            progress = _finite(where, "progress", row["progress"])
            previous = rows[-1][0] if rows else 0.0
            if progress <= previous:
                raise GradStatsError(
                    f"{where}: progress: expected more than the previous row's {previous:g}, "
                    f"got {row['progress']}"
                )
            values = [_finite(where, name, row[name]) for name in ("grad_sqr", "grad_var")]
            rows.append((progress, *values))
    except CsvTableError as exc:
        raise GradStatsError(str(exc)) from None
    if not rows:
        raise GradStatsError(f"{path}: expected one row per epoch, got none")
    table = np.array(rows, dtype=np.float64)
    return ValidationCurve(path, batch_size, table[:, 0] * m0, table[:, 1], table[:, 2])


def _finite(where: str, name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise GradStatsError(f"{where}: {name}: expected a finite number, got {text!r}")
    return value
