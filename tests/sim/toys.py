"""A toy app the simulator's tests can work out by hand: one trace key (``x``), GPU type
``fast``, two per-GPU batches on one and two GPUs of a node, flat gradient statistics."""

from __future__ import annotations

from pathlib import Path

from sia_slurm.sim.apptruth import AppTruth
from sia_slurm.sim.gradstats import AppGradStats
from sia_slurm.sim.groundtruth import GroundTruth
from sia_slurm.sim.restart import RestartDelay

PLACEMENTS = """\
placement,local_bsz,step_time,sync_time
1,10,1.0,0.0
1,20,2.0,0.0
2,10,1.5,0.5
2,20,2.5,0.5
"""


def toy_truth(
    tmp_path: Path,
    *,
    grad_var: float = 0.0,
    calibration: float = 1.0,
    assumed_restart_s: float = 20.0,
) -> AppTruth:
    """The toy app's ground truth from traces written under ``tmp_path`` (a restart takes
    30 s; the policy assumes ``assumed_restart_s``)."""
    folder = tmp_path / "traces" / "toy"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "placements-x.csv").write_text(PLACEMENTS)
    for batch in (10, 20):
        (folder / f"validation-{batch}.csv").write_text(
            f"progress,grad_sqr,grad_var\n100,1.0,{grad_var}\n200,1.0,{grad_var}\n"
        )
    traces = tmp_path / "traces"
    return AppTruth(
        app="toy",
        speed={"fast": GroundTruth.load(traces, "toy", "x", calibration=1.0)},
        stats=AppGradStats.load(traces, "toy", max_epochs=3),
        restart=RestartDelay(true_s=30.0, assumed_s=assumed_restart_s),
        calibration=calibration,
    )
