"""The chaos soak's plan: which faults strike when, and which jobs are submitted when.

Pure and seeded (``tests/test_chaos_bench.py`` checks it without Slurm): the same ``--seed``
gives the same schedule and the same jobs, so a soak that found something can be run again.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import asdict, dataclass

# The issue's soak: every kind of fault and how often.
FAULT_KINDS = (
    "controller_kill",  # SIGKILL the controller loop (a supervisor restarts it, as systemd)
    "slurmctld_restart",  # SIGKILL slurmctld, start it again without -c
    "slurmd_kill",  # SIGKILL a busy node's slurmd (alternately with its jobs), restart later
    "drain",  # drain a busy node, resume it later
    "job_kill",  # SIGKILL a job's rank-0 worker: the job's own failure
    "checkpoint_kill",  # SIGKILL rank 0 while it writes a checkpoint
)
ISSUE_FAULTS: dict[str, int] = {
    "controller_kill": 10,
    "slurmctld_restart": 2,
    "slurmd_kill": 2,
    "drain": 2,
    "job_kill": 2,
    "checkpoint_kill": 1,
}


# Emulated jobs cycle through the demo's apps: (app, max GPUs, epochs, dataset at scale 4).
APPS = (
    ("cifar10", 4, 20, 32768),
    ("ncf", 4, 20, 131072),
    ("deepspeech2", 4, 6, 800),
    ("bert", 4, 4, 480),
    ("yolov3", 4, 6, 480),
    ("imagenet", 4, 8, 8000),
)
# The demo's two real PyTorch jobs: (name, app, module and options, dataset at scale 4; 0: its own)
REAL = (
    ("cnn-real", "cifar10", ["-m", "sia_slurm.job.examples.cnn", "--epochs", "20"], 4096),
    ("transformer-real", "bert", ["-m", "sia_slurm.job.examples.transformer", "--epochs", "6"], 0),
)
# Every 8th emulated job (from the 4th) may fail once (--max-failures 1): the checkpoint kill's
# candidates, which must come back from their previous checkpoint. The others fail at once.
RETRY_EVERY = 8
ARRIVALS = 0.85  # jobs arrive in this share of the fault window, so some run until its end


class ChaosError(ValueError):
    """An option or an input cannot be used; the message names it."""


# ----------------------------------------------------------------------------------------------
# The fault schedule


@dataclass(frozen=True)
class Fault:
    """One fault to inject ``at_s`` seconds after the soak's start; ``index`` counts per kind."""

    at_s: float
    kind: str
    index: int


def parse_fault_counts(text: str) -> dict[str, int]:
    """``kind=N,kind=N`` (kinds of :data:`FAULT_KINDS`; unnamed kinds get 0)."""
    counts = dict.fromkeys(FAULT_KINDS, 0)
    for item in filter(None, (part.strip() for part in text.split(","))):
        kind, sep, number = item.partition("=")
        if not sep or kind not in counts or not number.isdigit():
            raise ChaosError(
                f"--faults: expected kind=N items separated by commas (kinds: "
                f"{', '.join(FAULT_KINDS)}); got {item!r}"
            )
        counts[kind] = int(number)
    return counts


def fault_schedule(
    counts: Mapping[str, int], start_s: float, end_s: float, seed: int, min_gap_s: float = 10.0
) -> list[Fault]:
    """The faults at seeded random times in ``[start_s, end_s]``, at least ``min_gap_s`` apart
    (a fault's effects, e.g. a restart, are then under way before the next), kinds in seeded
    random order. The same seed gives the same schedule."""
    kinds = [kind for kind in FAULT_KINDS for _ in range(counts.get(kind, 0))]
    if not kinds:
        return []
    span = end_s - start_s - (len(kinds) - 1) * min_gap_s
    if span < 0:
        raise ChaosError(
            f"{len(kinds)} faults {min_gap_s:g} s apart do not fit between {start_s:g} s and "
            f"{end_s:g} s: give more --minutes or fewer faults"
        )
    rng = random.Random(seed)
    rng.shuffle(kinds)
    offsets = sorted(rng.uniform(0.0, span) for _ in kinds)
    seen: dict[str, int] = {}
    faults = []
    for i, (offset, kind) in enumerate(zip(offsets, kinds, strict=True)):
        seen[kind] = seen.get(kind, 0) + 1
        faults.append(Fault(round(start_s + offset + i * min_gap_s, 3), kind, seen[kind]))
    return faults


# ----------------------------------------------------------------------------------------------
# The jobs


@dataclass(frozen=True)
class JobPlan:
    """One job of the soak: what ``sia-sbatch`` submits and when."""

    name: str
    app: str
    max_gpus: int
    command: tuple[str, ...]  # after the interpreter
    max_failures: int
    real: bool
    submit_at_s: float


def job_plans(jobs: int, real_jobs: int, scale: float, window_s: float, seed: int) -> list[JobPlan]:
    """``jobs`` emulated and ``real_jobs`` PyTorch jobs, submitted at seeded random times in the
    first :data:`ARRIVALS` of the fault window (the last ones still run while the last faults
    land)."""
    rng = random.Random(seed + 1)
    plans = []
    for i in range(jobs):
        app, gpus, epochs, dataset = APPS[i % len(APPS)]
        size = max(64, round(dataset * 4 / scale))
        command = ("-m", "sia_slurm.job.examples.emulated", "--progress", "raw",
                   "--epochs", str(epochs), "--dataset-size", str(size))  # fmt: skip
        retry = 1 if i % RETRY_EVERY == 3 else 0
        plans.append(JobPlan(f"{app}-{i:02d}", app, gpus, command, retry, False, 0.0))
    for name, app, argv, dataset in REAL[:real_jobs]:
        extra = ("--dataset-size", str(max(256, round(dataset * 4 / scale)))) if dataset else ()
        plans.append(JobPlan(name, app, 2, (*argv, *extra), 0, True, 0.0))
    times = sorted(rng.uniform(0.0, ARRIVALS * window_s) for _ in plans)
    rng.shuffle(plans)
    return [
        JobPlan(**{**asdict(p), "submit_at_s": round(t, 1)})
        for p, t in zip(plans, times, strict=True)
    ]
