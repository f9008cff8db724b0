"""Fit error of the throughput model on the Sia/Pollux traces, per app and GPU type.

Run: ``python benchmarks/trace_fit_error.py``. For every ``data/traces/<app>/placements-<type>.csv``
the model is fitted to all of the file's points and the table reports the mean relative error
of the predicted step time (T_sync, no accumulation) over the same file ("placements", in-sample),
and over ``scalability-<type>.csv`` ("scalability": larger shapes the fit never saw, so an
extrapolation check). gpt_pmp is pipeline-parallel, which this data-parallel model does not
describe; it is listed for completeness.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from sia_slurm.model.fit import Observation, fit_observations
from sia_slurm.model.throughput import ThroughputParams, sync_time
from sia_slurm.protocol.profile import read_trace_points

TRACES = Path(__file__).resolve().parents[1] / "data" / "traces"


def mean_relative_error(params: ThroughputParams, points: list[Observation]) -> float:
    """Mean |predicted - measured| / measured step time."""
    nodes = np.array([p.nodes for p in points])
    gpus = np.array([p.gpus for p in points])
    local = np.array([p.local_bsz for p in points])
    measured = np.array([p.step_time for p in points])
    predicted = sync_time(params, nodes, gpus, local)
    return float(np.mean(np.abs(predicted - measured) / measured))


def main() -> None:
    print(f"{'app':<12} {'type':<8} {'points':>6} {'placements':>10} {'scalability':>11}")
    in_sample: list[float] = []
    for app_dir in sorted(d for d in TRACES.iterdir() if d.is_dir()):
        for path in sorted(app_dir.glob("placements-*.csv")):
            gpu_type = path.stem.removeprefix("placements-")
            points = read_trace_points(path)
            params = fit_observations(points)
            error = mean_relative_error(params, points)
            far_path = app_dir / f"scalability-{gpu_type}.csv"
            far = read_trace_points(far_path) if far_path.exists() else []
            far_text = f"{mean_relative_error(params, far):.3f}" if far else "-"
            if app_dir.name != "gpt_pmp":
                in_sample.append(error)
            print(
                f"{app_dir.name:<12} {gpu_type:<8} {len(points):>6} {error:>10.3f} {far_text:>11}"
            )
    print(
        f"\nData-parallel apps: mean {np.mean(in_sample):.3f}, median "
        f"{np.median(in_sample):.3f}, max {np.max(in_sample):.3f} over {len(in_sample)} files"
    )


if __name__ == "__main__":
    main()
