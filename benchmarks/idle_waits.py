"""How often jobs wait beside free GPUs they could use: the baseline of issue 38.

Runs one policy (default: Sia) on the artifact's Helios and Philly workloads on the 64-GPU
heterogeneous cluster, as ``benchmarks/paper_table3.py`` does, and prints per workload: its jobs,
the rounds simulated, the active job-rounds, the job-rounds in which an active job held no GPUs
while GPUs of a type it may use (enough for its smallest run) were free after the round's
actions, the rounds with at least one such job, the allocations placement could not honour
(also as a share of the job-rounds), and the waits by where the round left the job out
(``sia_slurm/controller/idle_waits.py``: ``not_allocated`` = the policy gave it nothing;
``unplaced``, ``refused``, ``not_decided``).

Usage: python benchmarks/idle_waits.py [--workloads N] [--policy sia] [--traces helios,philly]
           [--jobs N] [--processes N]

Workloads run one at a time unless ``--processes`` says otherwise (the project's machine is
shared). ``--workloads 2`` takes about a minute for Sia on 2 cores.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's package, not another one installed editable
    sys.path.insert(0, str(REPO))

from sia_slurm.policy.registry import POLICIES  # noqa: E402
from sia_slurm.sim.apps import default_workloads_dir  # noqa: E402
from sia_slurm.sim.artifact_metrics import WaitTotals  # noqa: E402
from sia_slurm.sim.inputs import load_inputs, load_sim_workloads  # noqa: E402
from sia_slurm.sim.run import SimulationConfig, SimulationResult  # noqa: E402
from sia_slurm.sim.workload_pool import WorkloadTask, run_tasks  # noqa: E402

CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
TRACES = {"helios": "saturn", "philly": "philly"}  # trace name -> folder under data/workloads


@dataclass(frozen=True)
class Row:
    """One line of the table: a workload's (or a trace's pooled) counts."""

    name: str
    jobs: int
    rounds: int
    job_rounds: int
    waits: WaitTotals

    @staticmethod
    def of(name: str, result: SimulationResult) -> Row:
        active = sum(r.contention for r in result.rounds)
        return Row(name, len(result.jobs), len(result.rounds), active, result.wait_totals())

    def __add__(self, other: Row) -> Row:
        return Row(
            self.name,
            self.jobs + other.jobs,
            self.rounds + other.rounds,
            self.job_rounds + other.job_rounds,
            self.waits + other.waits,
        )


def main() -> int:
    args = parse_args()
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    inputs = load_inputs(CLUSTER)
    config = SimulationConfig(policy=args.policy, seed=args.seed)
    started = time.perf_counter()
    rows: list[Row] = []
    for trace in args.traces:
        workloads = load_sim_workloads(
            default_workloads_dir() / TRACES[trace], inputs, max_jobs=args.jobs
        )
        chosen = workloads[: args.workloads] if args.workloads else workloads
        tasks = [WorkloadTask(f"{trace}-{w.name}", w, CLUSTER, config) for w in chosen]
        results = run_tasks(tasks, args.processes, on_done=_progress)
        trace_rows = [Row.of(task.label, results[task.label]) for task in tasks]
        rows.extend(trace_rows)
        total = sum(trace_rows[1:], trace_rows[0])
        rows.append(replace(total, name=f"{trace}, {len(trace_rows)} workloads"))
    print_table(rows, args)
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")
    return 0


def _progress(task: WorkloadTask, result: SimulationResult) -> None:
    note = f" (STOPPED: {result.stopped})" if result.stopped else ""
    print(
        f"# {task.label}: {len(result.rounds)} rounds in {result.wall_s:.0f} s{note}",
        file=sys.stderr,
        flush=True,
    )


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=None, help="first N workloads per trace")
    parser.add_argument("--policy", choices=sorted(POLICIES), default="sia")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--jobs", type=int, default=None, help="first N jobs of each workload")
    parser.add_argument("--processes", type=int, default=1, help="workloads at once (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    args.traces = [t for t in args.traces.split(",") if t]
    for trace in args.traces:
        if trace not in TRACES:
            parser.error(f"--traces: expected names among {', '.join(TRACES)}, got {trace!r}")
    for name in ("workloads", "jobs", "processes"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name}: expected a positive integer, got {value}")
    return args


def _share(count: int, of: int) -> str:
    return f"{count / of:.2%}" if of else "-"


def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    """A Markdown table (pasted into docs/policy.md as it prints)."""
    jobs = f", first {args.jobs} jobs each" if args.jobs else ""
    print(f"\n{args.policy} on hetero64 (6x4 T4, 3x8 RTX 2080Ti, 2x8 A100){jobs}\n")
    print(
        "| workload | jobs | rounds | job-rounds | job-rounds waiting beside free GPUs | "
        "rounds with such waits | unplaced allocations | unplaced / job-rounds | "
        "waits by cause |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for row in rows:
        w = row.waits
        causes = ", ".join(f"{cause} {n}" for cause, n in w.by_cause.items()) or "-"
        print(
            f"| {row.name} | {row.jobs} | {row.rounds} | {row.job_rounds} | "
            f"{w.job_rounds} ({_share(w.job_rounds, row.job_rounds)}) | {w.rounds} | "
            f"{w.unplaced_allocations} | {_share(w.unplaced_allocations, row.job_rounds)} | "
            f"{causes} |"
        )


if __name__ == "__main__":
    sys.exit(main())
