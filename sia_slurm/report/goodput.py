"""The measured and predicted goodput of a job, a pair that means the same thing (issue 34).

Goodput is throughput times statistical efficiency. Both columns of the dashboard are for the
shape the job's newest metrics report measured, and both apply the efficiency of that report's
gradient statistics at its batch relative to M0: measured, the report's throughput times it;
predicted, the throughput the controller predicted for that shape, times it
(:func:`goodput_pair` says why not the last decision's own goodput).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sia_slurm.model.efficiency import GradientStats, efficiency
from sia_slurm.protocol import MetricsReport


@dataclass(frozen=True)
class DecisionPoint:
    """One job's decision in one round, as the timeline needs it: ``after`` is the
    configuration the job has after the round (for a quarantined job the one it held)."""

    round_index: int
    time: float
    after: str
    batch_size: int
    goodput: float
    quarantined: bool = False
    profiling: bool = False  # the job was profiling (docs/profiling.md)
    local_bsz: int = 0
    accum_steps: int = 0
    throughput: float = 0.0  # predicted raw samples/s of ``after`` (0: not kept, schema 1)


def measured_goodput(report: MetricsReport, init_batch_size: int) -> float:
    """Goodput of a reported shape: samples per second times statistical efficiency at M0.

    One optimizer step runs ``accum_steps`` non-synchronising micro-batches (compute only) and
    one synchronising one (``step_time``, sync included). Without an M0 (0) the efficiency is
    taken as 1 (the throughput is shown).
    """
    batch = report.gpus * report.local_bsz * (report.accum_steps + 1)
    iteration = report.accum_steps * (report.step_time - report.sync_time) + report.step_time
    return batch / iteration * report_efficiency(report, init_batch_size)


def report_efficiency(report: MetricsReport, init_batch_size: int) -> float:
    """Statistical efficiency of the report's gradient statistics at the report's global
    batch, relative to M0 (1.0 without an M0): the one factor both goodput columns apply."""
    if init_batch_size <= 0:
        return 1.0
    batch = report.gpus * report.local_bsz * (report.accum_steps + 1)
    stats = GradientStats(report.grad_sqr, report.grad_var)
    return float(efficiency(stats, init_batch_size, batch))


def goodput_pair(
    report: MetricsReport, decisions: Sequence[DecisionPoint], init_batch_size: int
) -> tuple[float | None, float]:
    """(predicted, measured) goodput of the shape ``report`` measured, on the same statistics.

    Why not the last decision's goodput against the report (what the dashboard showed before,
    2-21x apart on the demo's short jobs): that decision may be a rebatch or a move the job
    never ran (it finished first), and its goodput carries the statistics of its round, while
    the report's are the job's newest; an emulated demo job goes through its app's whole
    statistical trajectory in minutes (ncf: efficiency 0.37 at the decision, 0.999 at its
    last report). So the prediction is taken from the newest decision that assigned exactly
    the reported shape (not a quarantined or profiling round, whose numbers are placeholders),
    and its predicted throughput is put on the report's statistical efficiency, the factor
    the measured side applies too. ``None`` when no decision assigned that shape (nothing was
    predicted for it). A decision without a kept throughput (schema 1) gives its own goodput.
    """
    measured = measured_goodput(report, init_batch_size)
    shape = (f"{report.gpu_type}:{report.nodes}x{report.gpus}", report.local_bsz)
    for point in reversed(decisions):
        if point.quarantined or point.profiling or point.goodput <= 0:
            continue
        if ((point.after, point.local_bsz), point.accum_steps) != (shape, report.accum_steps):
            continue
        if point.throughput <= 0:  # decided before decisions kept it: the goodput it had
            return point.goodput, measured
        return point.throughput * report_efficiency(report, init_batch_size), measured
    return None, measured
