"""``sia-slurm simulate``: replay workloads on a simulated cluster under the real controller."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.policy.registry import POLICIES
from sia_slurm.sim.apptruth import SimInputError
from sia_slurm.sim.inputs import (
    SimulationInputs,
    load_inputs,
    load_sim_workloads,
    load_workload_truths,
)
from sia_slurm.sim.run import SimulationConfig, SimulationResult
from sia_slurm.sim.workload_pool import WorkloadTask, pool_results, run_tasks, workload_labels

DEFAULT_CLUSTER = Path(__file__).resolve().parents[2] / "etc" / "clusters" / "hetero64.yaml"

HELP = """\
Simulate workloads on a simulated cluster, scheduled by the real controller.

\b
Each WORKLOAD (a CSV file name,time,application,num_replicas,batch_size,
or a folder of them) is replayed on the cluster of --cluster: jobs arrive
at their submission times, and every --round seconds the same controller
round that runs on Slurm (observe, estimate, allocate, place) decides
their GPUs and batch sizes. Jobs progress at the measured speed of their
configuration (data/traces/) and the true statistical efficiency of their
batch, pay their app's restart delay on every (re)start, and report
metrics that the goodput models learn from. Docs: docs/simulator.md.

\b
Writes to --out:
  summary.json           metrics per workload and pooled (avg/p99 JCT,
                         makespan, GPU-hours/job, restarts, contention,
                         policy solve times, per-job JCTs, finish-time
                         fairness (JCT over JCT alone on a 1/N share:
                         mean, p99, max, fraction > 1, per job),
                         job-rounds waiting beside free GPUs,
                         unplaced allocations)
  rounds-NAME.jsonl      one JSON line per round and workload
  jct_cdf.png, gpus-NAME.png   with --plot (needs matplotlib)

\b
Workloads run in parallel processes (--processes, default: all cores).
Bad inputs (unknown app, missing column, unsorted times, GPU type without
ground truth, empty workload) are reported with file and line; exit 2.
"""


@click.command("simulate", context_settings=CONTEXT_SETTINGS, help=HELP)
@click.argument("workloads", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option(
    "--cluster",
    type=click.Path(dir_okay=False, path_type=Path),
    default=DEFAULT_CLUSTER,
    show_default="etc/clusters/hetero64.yaml",
    help="Cluster file (format: sia_slurm/sim/clusterfile.py).",
)
@click.option(
    "--policy",
    type=click.Choice(sorted(POLICIES)),
    default="sia",
    show_default=True,
    help="Allocation policy.",
)
@click.option(
    "--round",
    "round_length",
    type=click.FloatRange(min=0, min_open=True),
    default=60.0,
    show_default=True,
    help="Round length in seconds.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of randomised policies.")
@click.option(
    "--jobs",
    "max_jobs",
    type=click.IntRange(min=1),
    default=None,
    help="Simulate only the first N jobs of each workload.",
)
@click.option(
    "-j",
    "--processes",
    type=click.IntRange(min=1),
    default=None,
    help="Parallel worker processes [default: number of cores].",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Output folder (created if missing).",
)
@click.option("--plot", is_flag=True, help="Also draw PNG figures (needs matplotlib).")
@click.option(
    "--profiles",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Profiles folder the controller learns from [default: profiles/].",
)
@click.option(
    "--traces",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Ground-truth traces folder [default: data/traces/].",
)
@click.option("-v", "--verbose", is_flag=True, help="Show the controller's warnings.")
def simulate_command(
    workloads: tuple[Path, ...],
    cluster: Path,
    policy: str,
    round_length: float,
    seed: int,
    max_jobs: int | None,
    processes: int | None,
    out: Path,
    plot: bool,
    profiles: Path | None,
    traces: Path | None,
    verbose: bool,
) -> None:
    try:
        inputs = load_inputs(cluster, profiles_dir=profiles, traces_dir=traces)
        loaded = [
            w for path in workloads for w in load_sim_workloads(path, inputs, max_jobs=max_jobs)
        ]
        load_workload_truths(loaded, inputs)  # every (app, GPU type) has ground truth
        if plot:
            from sia_slurm.sim.plots import require_matplotlib

            require_matplotlib()
    except (SimInputError, RuntimeError) as exc:
        _fail(str(exc))
    config = SimulationConfig(policy=policy, round_length=round_length, seed=seed)
    out.mkdir(parents=True, exist_ok=True)
    labels = workload_labels(loaded)
    tasks = [
        WorkloadTask(
            label, w, cluster, config, out / f"rounds-{label}.jsonl", profiles, traces, verbose
        )
        for label, w in zip(labels, loaded, strict=True)
    ]
    workers = min(processes or os.cpu_count() or 1, len(tasks))
    click.echo(
        f"simulating {len(tasks)} workload(s) on {inputs.cluster.name} "
        f"({inputs.cluster.total_gpus} GPUs) with {policy}, {workers} process(es)"
    )
    results = run_tasks(tasks, workers, on_done=_Progress(len(tasks)))
    summary = write_summary(out, results, labels, tasks, inputs, config, max_jobs)
    pooled = summary["pooled"]
    click.echo(
        f"pooled: avg JCT {pooled['avg_jct_h']:.2f} h (+-{pooled['avg_jct_std_h']:.2f}), "
        f"p99 {pooled['p99_jct_h']:.1f} h, makespan {pooled['makespan_h']:.1f} h, "
        f"{pooled['gpu_hours_per_job']:.2f} GPU-h/job, FTF {pooled['ftf_mean']:.2f} "
        f"(p99 {pooled['ftf_p99']:.2f}, {pooled['ftf_unfair_fraction']:.0%} > 1) "
        f"-> {out / 'summary.json'}"
    )
    if plot:
        _plot(out, [results[label] for label in labels], labels)
    if any(result.stopped for result in results.values()):
        raise SystemExit(1)


def _fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise SystemExit(2)


class _Progress:
    """Prints one line per finished workload (workers report only when done)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.done = 0

    def __call__(self, task: WorkloadTask, result: SimulationResult) -> None:
        self.done += 1
        finished = sum(job.finish_time is not None for job in result.jobs)
        metrics = result.metrics()
        line = (
            f"[{self.done}/{self.total}] {task.label}: {finished}/{len(result.jobs)} jobs done "
            f"in {len(result.rounds)} rounds; avg JCT {metrics.avg_jct_h:.2f} h, makespan "
            f"{metrics.makespan_h:.1f} h ({result.wall_s:.1f} s)"
        )
        click.echo(line + (f"; STOPPED: {result.stopped}" if result.stopped else ""))
        sys.stdout.flush()


def write_summary(
    out: Path,
    results: dict[str, SimulationResult],
    labels: list[str],
    tasks: list[WorkloadTask],
    inputs: SimulationInputs,
    config: SimulationConfig,
    max_jobs: int | None,
) -> dict[str, Any]:
    """Write ``summary.json`` (per workload and pooled metrics) and return its content."""
    ordered = [results[label] for label in labels]
    per_workload = [result.metrics() for result in ordered]
    pooled = pool_results(ordered)
    summary: dict[str, Any] = {
        "policy": config.policy,
        "cluster": inputs.cluster.name,
        "cluster_file": str(inputs.cluster.path),
        "round_s": config.round_length,
        "seed": config.seed,
        "jobs_limit": max_jobs,
        "workloads": {
            task.label: {
                "file": str(task.workload.path),
                "stopped": result.stopped,
                "metrics": metrics.to_json(),
            }
            for task, result, metrics in zip(tasks, ordered, per_workload, strict=True)
        },
        "pooled": pooled.to_json(),
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    return summary


def _plot(out: Path, results: list[SimulationResult], labels: list[str]) -> None:
    from sia_slurm.sim.plots import plot_gpus, plot_jct_cdf

    written = [plot_jct_cdf(results, out / "jct_cdf.png")]
    for result, label in zip(results, labels, strict=True):
        written.append(plot_gpus(result, out / f"gpus-{label}.png"))
    click.echo(f"figures: {', '.join(p.name for p in written)}")
