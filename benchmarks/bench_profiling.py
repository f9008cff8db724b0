"""What Sia's profiling of new models costs at the paper's scale (issue 34).

Runs Sia on the workloads of the paper's Table 3 (``benchmarks/paper_table3.py``: Philly, 8
workloads, and Helios, 10, of 160 jobs each, on the 64-GPU heterogeneous cluster
``etc/clusters/hetero64.yaml``) with the simulator's three profiling modes
(``SimulationConfig.profiling``, docs/simulator.md "Profiling"):

* ``off``: every job's model starts from its app's shipped 1-GPU profile (an oracle);
* ``each``: every job is profiled on arrival, for itself, as the paper's Sia does: one GPU of
  each of the cluster's three types in turn, a sweep of per-GPU batches on each;
* ``shared``: the jobs of one app and account share one measured profile (the first profiles,
  later ones reuse it), as sia-slurm does.

Prints, per trace and mode, pooled over the trace's workloads: average JCT, p99 JCT, makespan,
the average JCT's ratio to ``off``, restarts per job, and the share of all GPU-time spent
profiling (the restarts and sweeps of profiling runs, over every GPU-second held). The goal of
issue 34: average JCT with profiling on within 5% of ``off``.

Usage: python benchmarks/bench_profiling.py [--workloads N] [--traces philly,helios]
           [--modes off,each,shared] [--processes N] [--out DIR [--resume]]

``--workloads N`` runs the first N workloads of each trace (and says so). With ``--out`` each
finished workload's jobs are saved under ``DIR/done/`` at once and ``--resume`` reuses them.
On the project's 2-core machine one Sia workload takes 10-90 s per mode, depending on load.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import asdict, dataclass
from pathlib import Path

from blas import single_threaded

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # this checkout's package, not another one installed editable
    sys.path.insert(0, str(REPO))

from sia_slurm.sim.apps import default_workloads_dir  # noqa: E402
from sia_slurm.sim.artifact_metrics import HOUR, JobOutcome, pooled_metrics, workload_metrics  # noqa: E402
from sia_slurm.sim.inputs import load_inputs, load_sim_workloads  # noqa: E402
from sia_slurm.sim.run import PROFILING_MODES, SimulationConfig, simulate  # noqa: E402

CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
TRACES = {"philly": "philly", "helios": "saturn"}  # as benchmarks/paper_table3.py
GOAL = 0.05  # average JCT with profiling on within 5% of off

Jobs = tuple[JobOutcome, ...]


def main() -> int:
    single_threaded()
    args = parse_args()
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    inputs = load_inputs(CLUSTER)
    started = time.perf_counter()
    runs: dict[tuple[str, str], list[Jobs]] = {}
    counts: dict[str, tuple[int, int]] = {}
    for trace in args.traces:
        workloads = load_sim_workloads(default_workloads_dir() / TRACES[trace], inputs)
        counts[trace] = (min(args.workloads or len(workloads), len(workloads)), len(workloads))
        workloads = workloads[: counts[trace][0]]
        for mode in args.modes:
            tasks = [Task(f"{trace}-{w.name}", w.path, mode, args.seed) for w in workloads]
            done = _load_done(args.out, tasks) if args.resume else {}
            t0 = time.perf_counter()
            todo = [task for task in tasks if task.label not in done]
            done.update(run(todo, args.processes, args.out))
            runs[(trace, mode)] = [done[task.label] for task in tasks]
            print(
                f"# {trace:6} {mode:6} {len(tasks)} workload(s) in "
                f"{time.perf_counter() - t0:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    print_table(runs, counts)
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")
    return 0


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=None, help="first N workloads per trace")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--modes", default=",".join(PROFILING_MODES))
    parser.add_argument("--processes", type=int, default=None, help="default: number of cores")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="save finished workloads here")
    parser.add_argument("--resume", action="store_true", help="reuse what --out DIR saved")
    args = parser.parse_args()
    if args.resume and not args.out:
        parser.error("--resume: needs --out DIR, where the earlier run saved its workloads")
    args.traces = [t for t in args.traces.split(",") if t]
    args.modes = [m for m in args.modes.split(",") if m]
    for trace in args.traces:
        if trace not in TRACES:
            parser.error(f"--traces: expected names among {', '.join(TRACES)}, got {trace!r}")
    for mode in args.modes:
        if mode not in PROFILING_MODES:
            parser.error(f"--modes: expected among {', '.join(PROFILING_MODES)}, got {mode!r}")
    return args


@dataclass(frozen=True)
class Task:
    """One workload under one profiling mode. Paths and names only: a SimulationConfig does not
    pickle (its SharesConfig holds mapping proxies), so each worker builds its own."""

    label: str
    workload: Path
    mode: str
    seed: int

    @property
    def key(self) -> str:
        return f"sia-{self.mode}-{self.label}"


def simulate_task(task: Task) -> Jobs:
    """Simulate one task (in a worker process); its jobs' outcomes."""
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    inputs = load_inputs(CLUSTER)
    (workload,) = load_sim_workloads(task.workload, inputs)
    config = SimulationConfig(policy="sia", seed=task.seed, profiling=task.mode)
    result = simulate(workload, inputs, config)
    if result.stopped:
        print(f"# {task.label} {task.mode}: STOPPED early: {result.stopped}", file=sys.stderr)
    return result.jobs


def run(tasks: Sequence[Task], processes: int | None, out: Path | None) -> dict[str, Jobs]:
    """Every task, ``processes`` at a time; each one's jobs saved under ``out`` once done."""
    done: dict[str, Jobs] = {}
    if not tasks:
        return done
    workers = max(1, min(processes or os.cpu_count() or 1, len(tasks)))
    with ProcessPoolExecutor(max_workers=workers, initializer=_quiet) as pool:
        futures = {pool.submit(simulate_task, task): task for task in tasks}
        for future in as_completed(futures):
            task = futures[future]
            done[task.label] = future.result()
            if out is not None:
                path = out / "done" / f"{task.key}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                jobs = [asdict(job) for job in done[task.label]]
                path.write_text(json.dumps(jobs) + "\n", encoding="utf-8")
    return done


def _quiet() -> None:
    """Workers print nothing on standard output: HiGHS (C code under scipy) writes stray lines
    to file descriptor 1, which would land in the table."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def _load_done(out: Path, tasks: Sequence[Task]) -> dict[str, Jobs]:
    done = {}
    for task in tasks:
        path = out / "done" / f"{task.key}.json"
        if path.is_file():
            data = json.loads(path.read_text(encoding="utf-8"))
            done[task.label] = tuple(JobOutcome(**job) for job in data)
    return done


def print_table(
    runs: dict[tuple[str, str], list[Jobs]], counts: dict[str, tuple[int, int]]
) -> None:
    print("\nSia with profiling of new models, hetero64 (6x4 T4, 3x8 RTX 2080Ti, 2x8 A100)")
    for trace, (run, total) in counts.items():
        subset = "all" if run == total else f"first {run} of {total}"
        print(f"  {trace}: {subset} workloads, 160 jobs each")
    header = (
        f"{'trace':7} {'profiling':9} {'avg JCT h':>9} {'p99 JCT h':>9} {'makespan h':>10} "
        f"{'avg/off':>8} {'restarts/job':>12} {'profiling GPU-time':>18}"
    )
    print(header)
    print("-" * len(header))
    averages: dict[tuple[str, str], float] = {}
    for (trace, mode), workloads in runs.items():
        metrics = [
            workload_metrics(jobs, contention=(), solve_ms=(), wall_s=0.0) for jobs in workloads
        ]
        pooled = pooled_metrics(metrics, workloads, [[] for _ in workloads])
        averages[(trace, mode)] = pooled.avg_jct_h
        off = averages.get((trace, "off"))
        ratio = f"{pooled.avg_jct_h / off:.3f}" if off else "-"
        everyone = [job for jobs in workloads for job in jobs]
        held = sum(job.gpu_seconds for job in everyone)
        profiling = sum(job.profiling_gpu_seconds for job in everyone)
        share = f"{profiling / held:.2%} ({profiling / HOUR / len(everyone):.3f} h/job)"
        print(
            f"{trace:7} {mode:9} {pooled.avg_jct_h:9.3f} {pooled.p99_jct_h:9.2f} "
            f"{pooled.makespan_h:10.2f} {ratio:>8} {pooled.restarts_per_job:12.2f} {share:>18}"
        )
    print()
    for (trace, mode), average in averages.items():
        off = averages.get((trace, "off"))
        if mode != "off" and off:
            change = average / off - 1
            verdict = "OK" if change <= GOAL else "MISSED"
            print(
                f"{trace}: {mode}: average JCT {change:+.1%} vs off "
                f"({verdict}, goal within {GOAL:.0%})"
            )


if __name__ == "__main__":
    sys.exit(main())
