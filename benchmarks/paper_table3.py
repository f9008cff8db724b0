"""The Sia paper's Table 3, reproduced with the simulator: a printed table beside the paper's.

Runs Sia, Pollux, Gavel and FIFO on the Philly (``data/workloads/philly/``, 8 workloads) and
Helios (``data/workloads/saturn/``, 10 workloads) traces on the 64-GPU heterogeneous cluster
(``etc/clusters/hetero64.yaml``) and prints avg JCT (+- std of the per-workload means), p99 JCT,
makespan and GPU-hours per job, measured and from the paper (reference section 6), then the two
checks the project sets: Sia's avg JCT within 15% of the paper's, and Sia < Pollux < Gavel.

Every (trace, policy) pools its workloads as the artifact does (docs/simulator.md). Workloads run
in parallel processes. On 2 cores the full run takes tens of minutes (Pollux's genetic search
dominates); ``--workloads N`` runs the first N workloads of each trace and says so.

Usage: python benchmarks/paper_table3.py [--workloads N] [--policies sia,pollux,gavel,fifo]
           [--traces philly,helios] [--processes N] [--out DIR [--resume]]

With ``--out`` each finished workload is saved under ``DIR/done/`` at once; ``--resume`` reuses
them, so a long run (Pollux) can be interrupted and continued, or run policy by policy into one
folder and printed together.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's package, not another one installed editable
    sys.path.insert(0, str(REPO))

from sia_slurm.sim.apps import default_workloads_dir  # noqa: E402
from sia_slurm.sim.artifact_metrics import (  # noqa: E402
    JobOutcome,
    PooledMetrics,
    WaitTotals,
    WorkloadMetrics,
    pooled_metrics,
    workload_metrics,
)
from sia_slurm.sim.inputs import load_inputs, load_sim_workloads  # noqa: E402
from sia_slurm.sim.run import SimulationConfig, SimulationResult  # noqa: E402
from sia_slurm.sim.workload_pool import WorkloadTask, run_tasks  # noqa: E402

CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
TRACES = {"philly": "philly", "helios": "saturn"}  # trace name -> folder under data/workloads
# sia-paper is the paper's Sia, compared with its numbers; sia, the default, beside it (issue 38).
POLICIES = ("sia-paper", "sia", "pollux", "gavel", "fifo")

# Reference section 6 (pre-publication Table 3, hours): avg JCT, p99 JCT, makespan, GPU-h/job.
PAPER: dict[tuple[str, str], tuple[float, float, float, float]] = {
    ("philly", "sia-paper"): (0.6, 9.5, 14.2, 4.0),
    ("philly", "pollux"): (1.0, 14.9, 24.5, 5.6),
    ("philly", "gavel"): (1.9, 30.0, 33.8, 9.0),
    ("helios", "sia-paper"): (0.7, 10.9, 14.9, 4.8),
    ("helios", "pollux"): (1.0, 15.0, 25.5, 5.9),
    ("helios", "gavel"): (2.5, 38.7, 43.0, 12.1),
}
SIA_TOLERANCE = 0.15


def main() -> int:
    args = parse_args()
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    inputs = load_inputs(CLUSTER)
    measured: dict[tuple[str, str], PooledMetrics] = {}
    counts: dict[str, tuple[int, int]] = {}
    partial: dict[tuple[str, str], int] = {}  # with --only-done: workloads found per row
    runs: dict[str, list[_Done]] = {}  # policy -> its workloads of every trace
    started = time.perf_counter()
    for trace in args.traces:
        workloads = load_sim_workloads(default_workloads_dir() / TRACES[trace], inputs)
        counts[trace] = (min(args.workloads or len(workloads), len(workloads)), len(workloads))
        workloads = workloads[: counts[trace][0]]
        if args.names:
            workloads = [w for w in workloads if w.name in args.names]
        for policy in args.policies:
            config = SimulationConfig(policy=policy, seed=args.seed)
            tasks = [
                WorkloadTask(
                    f"{trace}-{w.name}",
                    w,
                    CLUSTER,
                    config,
                    log_path=args.out / f"rounds-{policy}-{trace}-{w.name}.jsonl"
                    if args.out
                    else None,
                )
                for w in workloads
            ]
            t0 = time.perf_counter()
            done = _load_done(args.out, policy, tasks) if args.resume else {}
            if args.only_done:
                tasks = [task for task in tasks if task.label in done]
                if not tasks:
                    continue
                partial[(trace, policy)] = len(tasks)
            todo = [task for task in tasks if task.label not in done]
            results = run_tasks(todo, args.processes, on_done=_saver(args.out, policy))
            ordered = [done.get(task.label) or _Done.of(results[task.label]) for task in tasks]
            runs.setdefault(policy, []).extend(ordered)
            measured[(trace, policy)] = pooled_metrics(
                [d.metrics() for d in ordered],
                [d.jobs for d in ordered],
                [d.solve_ms for d in ordered],
            )
            elapsed = time.perf_counter() - t0
            print(
                f"# {trace:6} {policy:6} {len(tasks)} workload(s) in {elapsed:.0f} s"
                + _stopped_note(ordered),
                file=sys.stderr,
                flush=True,
            )
            if args.out:
                payload = {d.workload: d.metrics().to_json() for d in ordered}
                path = args.out / f"summary-{policy}-{trace}.json"
                path.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    print_table(measured, counts, args, partial)
    print_both_traces(runs)
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=None, help="first N workloads per trace")
    parser.add_argument("--policies", default=",".join(POLICIES))
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--processes", type=int, default=None, help="default: number of cores")
    parser.add_argument(
        "--names",
        default="",
        help="only the workloads of these names, comma-separated (e.g. workload-5,workload-6)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write round logs here")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="reuse the workloads an earlier run with the same --out finished (needs --out)",
    )
    parser.add_argument(
        "--only-done",
        action="store_true",
        help="with --resume: print the saved workloads only, run nothing (rows say how many)",
    )
    args = parser.parse_args()
    if args.resume and not args.out:
        parser.error("--resume: needs --out DIR, where the earlier run saved its workloads")
    if args.only_done and not args.resume:
        parser.error("--only-done: needs --resume --out DIR")
    args.policies = [p for p in args.policies.split(",") if p]
    args.traces = [t for t in args.traces.split(",") if t]
    args.names = {n for n in args.names.split(",") if n}
    for trace in args.traces:
        if trace not in TRACES:
            parser.error(f"--traces: expected names among {', '.join(TRACES)}, got {trace!r}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    return args


def _stopped_note(results: list[_Done]) -> str:
    stopped = [r.workload for r in results if r.stopped]
    return f" (STOPPED early: {', '.join(stopped)})" if stopped else ""


@dataclass(frozen=True)
class _Done:
    """What the table needs of one simulated workload; saved as JSON as each one finishes, so
    an interrupted run (Pollux takes hours on a shared machine) resumes with ``--resume``."""

    workload: str
    jobs: tuple[JobOutcome, ...]
    contention: tuple[int, ...]
    solve_ms: tuple[float, ...]
    wall_s: float
    stopped: str
    # Job-rounds waiting beside free GPUs and unplaced allocations (issue 38's measures);
    # None in files saved before they were kept.
    waits: WaitTotals | None = None

    @classmethod
    def of(cls, result: SimulationResult) -> _Done:
        return cls(
            result.workload,
            result.jobs,
            tuple(r.contention for r in result.rounds),
            tuple(result.solve_ms),
            result.wall_s,
            result.stopped,
            result.wait_totals(),
        )

    def metrics(self) -> WorkloadMetrics:
        return workload_metrics(
            self.jobs,
            contention=self.contention,
            solve_ms=self.solve_ms,
            wall_s=self.wall_s,
            waits=self.waits,
        )

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "jobs": [asdict(job) for job in self.jobs]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Done:
        return cls(
            data["workload"],
            tuple(JobOutcome(**job) for job in data["jobs"]),
            tuple(data["contention"]),
            tuple(data["solve_ms"]),
            data["wall_s"],
            data["stopped"],
            None if data.get("waits") is None else WaitTotals(**data["waits"]),
        )


def _done_path(out: Path, policy: str, label: str) -> Path:
    return out / "done" / f"{policy}-{label}.json"


def _saver(out: Path | None, policy: str) -> Callable[[WorkloadTask, SimulationResult], None]:
    def save(task: WorkloadTask, result: SimulationResult) -> None:
        if out is not None:
            path = _done_path(out, policy, task.label)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(_Done.of(result).to_json()) + "\n", encoding="utf-8")

    return save


def _load_done(out: Path, policy: str, tasks: list[WorkloadTask]) -> dict[str, _Done]:
    """Workloads an earlier run with the same ``--out`` finished (``--resume``)."""
    done = {}
    for task in tasks:
        path = _done_path(out, policy, task.label)
        if path.is_file():
            done[task.label] = _Done.from_json(json.loads(path.read_text(encoding="utf-8")))
    if done:
        print(f"# {policy}: {len(done)} workload(s) from {out / 'done'}", file=sys.stderr)
    return done


def print_table(
    measured: dict[tuple[str, str], PooledMetrics],
    counts: dict[str, tuple[int, int]],
    args: argparse.Namespace,
    partial: dict[tuple[str, str], int] | None = None,
) -> None:
    print(
        "\nTable 3: 64-GPU heterogeneous cluster (hetero64: 6x4 T4, 3x8 RTX 2080Ti, 2x8 A100), "
        "hours; measured (paper)"
    )
    for trace, (run, total) in counts.items():
        subset = "all" if run == total else f"first {run} of {total}"
        print(f"  {trace}: {subset} workloads, 160 jobs each")
    header = (
        f"{'trace':7} {'policy':9} {'avg JCT':>17} {'p99 JCT':>13} {'makespan':>13} "
        f"{'GPU-h/job':>12} {'restarts/job':>12} {'solve ms p50/p95':>17}"
    )
    print(header)
    print("-" * len(header))
    for (trace, policy), m in measured.items():
        paper = PAPER.get((trace, policy))
        cells = [
            f"{m.avg_jct_h:.2f}+-{m.avg_jct_std_h:.2f}",
            f"{m.p99_jct_h:.1f}",
            f"{m.makespan_h:.1f}",
            f"{m.gpu_hours_per_job:.1f}",
        ]
        if paper:
            cells = [f"{c} ({p:g})" for c, p in zip(cells, paper, strict=True)]
        solve = f"{m.solve_ms_median:.0f}/{m.solve_ms_p95:.0f}"
        found = (partial or {}).get((trace, policy))
        if found is not None and found != counts[trace][0]:
            solve += f"  ({found} of {counts[trace][0]} workloads)"
        print(
            f"{trace:7} {policy:9} {cells[0]:>17} {cells[1]:>13} {cells[2]:>13} {cells[3]:>12} "
            f"{m.restarts_per_job:12.2f} {solve:>17}"
        )
    print()
    for trace in counts:
        sia = measured.get((trace, "sia-paper"))
        if sia is not None:
            paper = PAPER[(trace, "sia-paper")][0]
            error = (sia.avg_jct_h - paper) / paper
            verdict = "OK" if abs(error) <= SIA_TOLERANCE else "OFF"
            print(
                f"{trace}: the paper's Sia avg JCT {sia.avg_jct_h:.2f} h vs paper {paper} h: "
                f"{error:+.0%} ({verdict}, tolerance {SIA_TOLERANCE:.0%})"
            )
        default = measured.get((trace, "sia"))
        if sia is not None and default is not None:
            print(
                f"{trace}: sia (the default) avg JCT {default.avg_jct_h:.2f} h: "
                f"{default.avg_jct_h / sia.avg_jct_h:.3f}x the paper's Sia"
            )
        order = [p for p in ("sia-paper", "pollux", "gavel") if (trace, p) in measured]
        if len(order) == 3:
            jcts = [measured[(trace, p)].avg_jct_h for p in order]
            verdict = "OK" if jcts[0] < jcts[1] < jcts[2] else "NOT MET"
            print(
                f"{trace}: ordering Sia < Pollux < Gavel by avg JCT: "
                f"{' < '.join(f'{j:.2f}' for j in jcts)} ({verdict})"
            )


def print_both_traces(runs: dict[str, list[_Done]]) -> None:
    """Issue 38's comparison: every policy pooled over all its workloads of both traces (every
    job counts once), ratios against the paper's Sia, with finish-time fairness, the job-rounds
    waiting beside free GPUs and the unplaced allocations."""
    if not runs:
        return
    pooled = {
        policy: pooled_metrics([d.metrics() for d in done], [d.jobs for d in done],
                               [d.solve_ms for d in done])
        for policy, done in runs.items()
    }  # fmt: skip
    base = pooled.get("sia-paper")
    print("\nBoth traces pooled (every job once); x: against sia-paper")
    print("| policy | workloads | avg JCT h | x | p99 JCT h | x | makespan h | x | "
          "FTF mean | FTF p99 | FTF > 1 | waits beside free GPUs | unplaced |")  # fmt: skip
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for policy, m in pooled.items():
        figures = (m.avg_jct_h, m.p99_jct_h, m.makespan_h)
        against = (base.avg_jct_h, base.p99_jct_h, base.makespan_h) if base else figures
        cells = " | ".join(f"{f:.3f} | {f / b:.3f}" for f, b in zip(figures, against, strict=True))
        waits = [d.waits for d in runs[policy]]
        known = all(w is not None for w in waits)
        total = sum((w for w in waits if w is not None), WaitTotals())
        wait_cells = (
            f"{total.job_rounds} | {total.unplaced_allocations}" if known else "not kept | not kept"
        )
        print(
            f"| {policy} | {m.workloads} | {cells} | {m.ftf_mean:.3f} | {m.ftf_p99:.3f} | "
            f"{m.ftf_unfair_fraction:.1%} | {wait_cells} |"
        )


if __name__ == "__main__":
    sys.exit(main())
