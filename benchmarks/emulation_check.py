"""Do the emulated trainers of a dev-cluster run follow their profiles? (issue 19)

Reads a finished (or running) controller state, as ``sia-slurm report`` does: the demo's
(``scripts/demo.sh``) or a fidelity run's (``benchmarks/fidelity.py``), and checks the newest
metrics report of each job that runs the emulated trainer two ways:

1. **Step time vs the profile.** Where the report's shape is one the app's profile measured
   (1 GPU, a per-GPU batch within the seed's range for that GPU type, interpolated linearly as
   the emulator does), the reported step time divided by the run's time scale must be within
   ``--tolerance`` (10%) of the profile's step time. Multi-GPU reports are not checked: their
   all-reduce is real (gloo on the dev cluster), the profile has no such shape.
2. **The dashboard's columns.** The predicted and the measured goodput of ``sia-slurm
   report``'s job table must agree within the tolerance. Both are of the shape the job's
   newest report measured, on that report's statistical efficiency (issue 34,
   ``sia_slurm/report/goodput.py`` ``goodput_pair``), so they differ by the throughput
   model's error there: this one measures the goodput model's fit, not only the emulation.
   On the demo of 2026-11-26, yolov3's prediction was 30% off what it measured at the step
   time its profile gives (the model's worst fit, docs/concepts/goodput.md).

Usage: python benchmarks/emulation_check.py --config DIR/sia.yaml
           [--time-scale calibration|FACTOR] [--tolerance 0.10]

The demo's and the fidelity benchmark's trainers report the profile's step times
(``--time-scale 1``, the default here; the benchmark slows its steps by the app's calibration
factor where the step timer does not see it, as the simulator does). Runs of the benchmark
before that change reported step times stretched by the factor: ``--time-scale calibration``
reads those. Exit status 1 when a check fails, 2 on bad input.
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.config import load_config
from sia_slurm.protocol import MetricsReport, StatePaths
from sia_slurm.protocol.profile import (
    GPU_TYPES_FILE,
    AppProfile,
    default_profiles_dir,
    load_app_profile,
    load_gpu_types,
)
from sia_slurm.report.from_db import (  # the dashboard's own readers: the same reports it shows
    _last_report,
    _stored_reports,
    report_from_db,
)
from sia_slurm.sim.groundtruth import default_calibration
from sia_slurm.state import Store


@dataclass(frozen=True)
class StepCheck:
    job: str
    app: str
    gpu_type: str
    local_bsz: int
    measured_s: float  # reported step time / time scale
    profile_s: float

    @property
    def error(self) -> float:
        return self.measured_s / self.profile_s - 1.0


def profile_step_time(profile: AppProfile, profile_type: str, local_bsz: int) -> float | None:
    """The profile's 1-GPU step time at ``local_bsz`` (linear between its points), or ``None``
    outside the measured range."""
    points = sorted(
        (obs.local_bsz, obs.step_time)
        for obs in profile.seed.get(profile_type, ())
        if obs.gpus == 1
    )
    if not points or not points[0][0] <= local_bsz <= points[-1][0]:
        return None
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if x0 <= local_bsz <= x1:
            return y0 if x1 == x0 else y0 + (y1 - y0) * (local_bsz - x0) / (x1 - x0)
    return points[0][1]


EMULATED = "sia_slurm.job.examples.emulated"


def newest_reports(db_path: Path, state_dir: Path) -> dict[str, MetricsReport]:
    """The newest report of every job that runs the emulated trainer (others, e.g. the demo's
    real PyTorch jobs, take the time their CPU work takes and are not checked)."""
    store = Store.open(db_path, create=False)
    try:
        reports = _stored_reports(store)
        emulated = {
            job.sia_id for job in store.jobs() if EMULATED in " ".join(job.spec.get("command", []))
        }
    finally:
        store.close()
    paths = StatePaths(state_dir)
    for job in emulated - set(reports):
        report = _last_report(paths, job)
        if report is not None:
            reports[job] = report
    return {job: report for job, report in reports.items() if job in emulated}


def main() -> int:
    args = parse_args()
    try:
        config = load_config(args.config)
    except (OSError, ValueError) as exc:
        print(f"error: --config {args.config}: {exc}", file=sys.stderr)
        return 2
    profile_of = {t.name: t.profile for t in config.gpu_types}
    root = default_profiles_dir()
    gpu_types = load_gpu_types(root / GPU_TYPES_FILE)
    data = report_from_db(config.db_path, state_dir=config.state_dir)
    reports = newest_reports(config.db_path, config.state_dir)
    steps: list[StepCheck] = []
    pairs: list[tuple[str, float, float]] = []
    for row in data.jobs:
        report = reports.get(row.id)
        if report is None or not row.app:
            continue
        scale = default_calibration(row.app) if args.time_scale == "calibration" else args.factor
        profile_type = profile_of.get(report.gpu_type, report.gpu_type)
        if report.gpus == 1 and report.nodes == 1 and (root / row.app).is_dir():
            profile = load_app_profile(root / row.app, gpu_types)
            expected = profile_step_time(profile, profile_type, report.local_bsz)
            if expected is not None:
                steps.append(
                    StepCheck(
                        row.id,
                        row.app,
                        report.gpu_type,
                        report.local_bsz,
                        report.step_time / scale,
                        expected,
                    )
                )
        # Both columns are of the report's shape (None where nothing predicted it).
        if row.goodput_predicted and row.goodput_measured:
            pairs.append((row.id, row.goodput_predicted, row.goodput_measured))
    return print_results(steps, pairs, args.tolerance)


def print_results(
    steps: list[StepCheck], pairs: list[tuple[str, float, float]], tolerance: float
) -> int:
    failed = 0
    print("step time vs profile (1-GPU reports; measured / time scale):")
    print(f"  {'job':22} {'app':12} {'type':6} {'local':>7} {'measured':>9} {'profile':>9} err")
    for c in steps:
        bad = abs(c.error) > tolerance
        failed += bad
        print(
            f"  {c.job:22} {c.app:12} {c.gpu_type:6} {c.local_bsz:7d} {c.measured_s:9.4f} "
            f"{c.profile_s:9.4f} {c.error:+.1%}{'  OFF' if bad else ''}"
        )
    print("dashboard: predicted vs measured goodput (the newest report's shape):")
    for job, predicted, measured in pairs:
        error = measured / predicted - 1.0
        bad = abs(error) > tolerance
        failed += bad
        print(f"  {job:22} {predicted:12.1f} {measured:12.1f} {error:+.1%}{'  OFF' if bad else ''}")
    checked = len(steps) + len(pairs)
    print(f"{checked} checks, {failed} outside {tolerance:.0%}")
    return 1 if failed else 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, required=True, help="the run's sia.yaml")
    parser.add_argument("--time-scale", default="1", help="calibration, or a factor (1)")
    parser.add_argument("--tolerance", type=float, default=0.10)
    args = parser.parse_args()
    if args.time_scale != "calibration":
        try:
            args.factor = float(args.time_scale)
        except ValueError:
            parser.error(
                f"--time-scale: expected 'calibration' or a number, got {args.time_scale!r}"
            )
        if not (math.isfinite(args.factor) and args.factor > 0):
            parser.error(f"--time-scale: expected a positive factor, got {args.time_scale!r}")
    if not args.tolerance > 0:
        parser.error(f"--tolerance: expected > 0, got {args.tolerance}")
    return args


if __name__ == "__main__":
    sys.exit(main())
