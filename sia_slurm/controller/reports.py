"""Which metrics reports the controller believes: a report is the job's word, checked.

A job's rank 0 writes its own metrics (step and sync times, gradient statistics), so a user
can write anything there: a report describing 8 GPUs while the job runs on 1, step times that
make it look faster than it is, gradient statistics that make its scaling look perfect. The
goodput model would believe it and take GPUs from honest jobs. So a report counts only if:

- it describes the job's current configuration and batch (GPU type, nodes, GPUs, per-GPU
  batch, accumulation): what the controller assigned and the cluster says it runs;
- the optimizer steps it claims per second agree with the steps its reports advance per
  second on the controller's clock: over at least :data:`PACE_WINDOW_S` on one shape, the
  claimed rate may exceed the observed one at most :data:`PACE_TOLERANCE` times (overheads
  outside the timed step, data loading and checkpoints, make every honest job a bit slower
  than its step time says; a job that claims to be several times faster is lying). A gross
  lie is judged sooner, from :data:`PACE_EARLY_S` (the second report at 60 s rounds), at twice
  the tolerance: a report is written every 30 s and read every round, so one round's reports
  may show as little as half the steps the job made in it, and doubling the tolerance keeps
  an honest job's margin what it is at the full window. Without it a job claiming ten times
  its pace held the GPUs a 4x growth cap gave it for two more rounds (issue 38).

The first report on a shape is kept in the state database with the job (``pace:<sia id>``), so
the check holds under cron's ``--once`` too, where every round is a new process.

A job whose report is refused as a lie (another configuration, an implausible pace) is held at
its minimum GPU count until a report is believed again (``JobRecord.distrusted``): refusing
its reports alone would leave it on its profile's prediction, which may promise more than the
truth, so lying would still pay. A report refused only for its batch (one the job has not
switched to yet after a rebatch) is no lie.

Gradient statistics are clamped (:func:`clamped_stats`) to a noise scale of at most
:data:`MAX_NOISE_SCALE_BATCHES` times the job's largest batch: past that the efficiency at the
largest batch differs by under 0.1% (the artifact's traces reach 31 times their largest batch
for ncf, and infinity where ``grad_sqr`` is 0 for deepspeech2), so an honest job loses
nothing, and no value makes the model divide by zero.

What this cannot catch: statistics cannot be checked against anything the controller sees (a
job lying about them gains at most what perfect scaling within its own batch limits would
give: statistical efficiency never exceeds 1), and a job that inflates its step counter as
much as its step times are shrunk passes the pace check (nothing the controller sees counts
steps independently). ``benchmarks/bench_lying_job.py`` measures each lie. The simulator's
reports pass the same checks (one code path), and are honest by construction.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sia_slurm.cluster import JobSnapshot
from sia_slurm.model import GradientStats
from sia_slurm.protocol import MetricsReport

PACE_WINDOW_S = 120.0  # controller seconds on one shape before the pace is judged
PACE_EARLY_S = 50.0  # ... judged from here at twice the tolerance (one 60 s round)
PACE_MIN_STEPS = 20.0  # ... and enough claimed steps in them to judge by
PACE_TOLERANCE = 4.0  # claimed steps/s over observed steps/s that is still believed
MAX_NOISE_SCALE_BATCHES = 1000.0  # the gradient noise scale, in largest batches


def mismatch(report: MetricsReport, job: JobSnapshot) -> tuple[str, str]:
    """Why ``report`` does not describe what ``job`` runs now (``""`` if it does), and the
    same text again if that is a lie rather than a report one step behind: a run describes
    its own GPUs truthfully or not at all (the backend takes reports of the current run
    only), but its per-GPU batch lags an assignment it has not applied yet."""
    if not job.phase.holds_gpus or job.config is None:
        return f"the job holds no GPUs ({job.phase.value})", ""
    config = job.config
    said = (report.gpu_type, report.nodes, report.gpus)
    if said != (config.gpu_type, config.nodes, config.gpus):
        lie = (
            f"describes {report.gpu_type}:{report.nodes}x{report.gpus}, but the job runs on "
            f"{config}"
        )
        return lie, lie
    batch = job.batch
    if batch is not None and (report.local_bsz, report.accum_steps) != (
        batch.local_bsz,
        batch.accum_steps,
    ):
        return (
            f"describes a per-GPU batch of {report.local_bsz} x{report.accum_steps + 1}, but "
            f"the job was assigned {batch.local_bsz} x{batch.accum_steps + 1}"
        ), ""
    return "", ""


def iteration_time(report: MetricsReport) -> float:
    """Seconds per optimizer step the report claims: ``accum_steps`` micro-batches without
    the all-reduce, then the synchronising one."""
    return report.accum_steps * (report.step_time - report.sync_time) + report.step_time


@dataclass
class Pace:
    """The first report the controller took on one shape of a job, on its own clock."""

    shape: tuple[object, ...]
    time: float
    steps: int

    @staticmethod
    def shape_of(report: MetricsReport) -> tuple[object, ...]:
        return (
            report.slurm_job_id, report.slurm_restart_count, report.gpu_type, report.nodes,
            report.gpus, report.local_bsz, report.accum_steps,
        )  # fmt: skip

    def implausible(self, report: MetricsReport, now: float) -> str:
        """Why the rate ``report`` claims is not what its steps show since :attr:`time`
        (``""`` when it agrees, or when too little time has passed to judge)."""
        elapsed = now - self.time
        claimed = 1.0 / iteration_time(report)
        if elapsed < PACE_EARLY_S or claimed * elapsed < PACE_MIN_STEPS:
            return ""
        tolerance = PACE_TOLERANCE if elapsed >= PACE_WINDOW_S else 2 * PACE_TOLERANCE
        observed = max(report.steps - self.steps, 0) / elapsed
        if claimed <= tolerance * observed:
            return ""
        return (
            f"claims {claimed:.3g} steps/s (step_time {report.step_time:.4g} s), but its steps "
            f"advanced {observed:.3g}/s over {elapsed:.0f} s on the controller's clock "
            f"(tolerance {tolerance:g}x)"
        )

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "time": self.time, "steps": self.steps}

    @classmethod
    def from_json(cls, data: Any) -> Pace:
        """The pace :meth:`to_json` wrote (``ValueError`` if ``data`` is not one)."""
        if not isinstance(data, dict) or set(data) != {"shape", "time", "steps"}:
            raise ValueError(f"not a pace: {data!r:.200}")
        shape, time, steps = data["shape"], data["time"], data["steps"]
        if not isinstance(shape, list) or len(shape) != 7:
            raise ValueError(f"pace: shape {shape!r:.200} is not a list of 7 values")
        if not isinstance(time, int | float) or not math.isfinite(time):
            raise ValueError(f"pace: time {time!r:.200} is not a finite number")
        if not isinstance(steps, int) or isinstance(steps, bool):
            raise ValueError(f"pace: steps {steps!r:.200} is not an integer")
        return cls(tuple(shape), float(time), steps)


def clamped_stats(
    report: MetricsReport, init_batch_size: int, max_batch_size: int
) -> GradientStats:
    """The report's gradient statistics, with the noise scale ``M0 * var / sqr`` at most
    :data:`MAX_NOISE_SCALE_BATCHES` times ``max_batch_size`` (a zero ``grad_sqr`` with any
    variance is the largest noise scale, not a division by zero)."""
    sqr, var = report.grad_sqr, report.grad_var
    most = MAX_NOISE_SCALE_BATCHES * max_batch_size / max(init_batch_size, 1)  # var / sqr
    if var > most * sqr:
        sqr = var / most
    return GradientStats(sqr, var)
