"""Issue 38's ablation: Sia's variants on the artifact's workloads, pooled, against the paper's Sia.

    python benchmarks/policy_ablation.py [--workloads N] [--traces philly,helios]
        [--variant NAME=POLICY[:KEY=VALUE,...]]... [--processes P]

Each variant is a policy (``sia-paper``, ``sia``) with some of its parameters set, e.g.
``--variant repair=sia-paper:repair_placement=true``. The first variant is the baseline: every
row says its pooled average JCT, p99 JCT and makespan over that of the baseline, its finish-time
fairness (each job's JCT over its JCT alone on a 1/N share of the cluster, as in Themis:
sia_slurm/sim/finish_time_fairness.py) as plain values, already ratios with 1 as fair (mean, p99
and the fraction of jobs above 1, pooled over every job), and the job-rounds spent waiting beside
free GPUs and the unplaced allocations (issue 38's measures, summed over the workloads). The
default variants are the paper's Sia, each of sia's additions alone, and sia. Pooled means every
job of every workload run counts once (benchmarks/paper_table3.py's pooling).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.policy.registry import config_type  # noqa: E402
from sia_slurm.sim.apps import default_workloads_dir  # noqa: E402
from sia_slurm.sim.artifact_metrics import pooled_metrics  # noqa: E402
from sia_slurm.sim.inputs import load_inputs, load_sim_workloads  # noqa: E402
from sia_slurm.sim.run import SimulationConfig, SimulationResult  # noqa: E402
from sia_slurm.sim.workload_pool import WorkloadTask, run_tasks  # noqa: E402

CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
TRACES = {"philly": "philly", "helios": "saturn"}  # trace name -> folder under data/workloads
DEFAULT_VARIANTS = (
    "paper=sia-paper",
    "+waiting-not-charged=sia-paper:charge_waiting=false",
    "+repair=sia-paper:repair_placement=true",
    "sia=sia",
)


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    policy: str
    params: object

    @staticmethod
    def parse(text: str) -> Variant:
        """``NAME=POLICY[:KEY=VALUE,...]``; values are YAML-ish: true/false, null, numbers."""
        name, _, rest = text.partition("=")
        policy, _, settings = rest.partition(":")
        if not name or not policy:
            raise ValueError(f"--variant: expected NAME=POLICY[:KEY=VALUE,...], got {text!r}")
        values: dict[str, object] = {}
        for item in filter(None, settings.split(",")):
            key, _, raw = item.partition("=")
            values[key] = _value(raw)
        return Variant(name, policy, config_type(policy)(**values))


def _value(raw: str) -> object:
    lowered = raw.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none"):
        return None
    try:
        return int(raw)
    except ValueError:
        return float(raw)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", type=int, default=None, help="first N workloads per trace")
    parser.add_argument("--traces", default=",".join(TRACES))
    parser.add_argument("--variant", action="append", default=None, help="NAME=POLICY[:K=V,...]")
    parser.add_argument("--processes", type=int, default=None, help="default: number of cores")
    args = parser.parse_args()
    try:
        variants = [Variant.parse(v) for v in args.variant or DEFAULT_VARIANTS]
    except (TypeError, ValueError) as exc:
        parser.error(str(exc))
    logging.getLogger("sia_slurm").setLevel(logging.ERROR)
    inputs = load_inputs(CLUSTER)
    workloads = []
    for trace in filter(None, args.traces.split(",")):
        if trace not in TRACES:
            parser.error(f"--traces: expected names among {', '.join(TRACES)}, got {trace!r}")
        found = load_sim_workloads(default_workloads_dir() / TRACES[trace], inputs)
        workloads += [(f"{trace}-{w.name}", w) for w in found[: args.workloads or len(found)]]
    started = time.perf_counter()
    rows = []
    for variant in variants:
        config = SimulationConfig(policy=variant.policy, params=variant.params)
        tasks = [WorkloadTask(label, w, CLUSTER, config) for label, w in workloads]
        t0 = time.perf_counter()
        results = run_tasks(tasks, args.processes)
        rows.append((variant, [results[task.label] for task in tasks]))
        print(f"# {variant.name}: {len(tasks)} workloads in {time.perf_counter() - t0:.0f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    print_table(rows, len(workloads))
    print(f"\ntotal wall time {time.perf_counter() - started:.0f} s")
    return 0


def print_table(rows: list[tuple[Variant, list[SimulationResult]]], workloads: int) -> None:
    print(f"{workloads} workloads (hetero64), pooled; ratios against {rows[0][0].name}\n")
    print("| variant | policy | avg JCT h | x | p99 JCT h | x | makespan h | x | "
          "FTF mean | FTF p99 | FTF > 1 | "
          "waits beside free GPUs (job-rounds) | unplaced |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    base = None
    for variant, results in rows:
        pooled = pooled_metrics(
            [r.metrics() for r in results], [r.jobs for r in results], [r.solve_ms for r in results]
        )
        figures = (pooled.avg_jct_h, pooled.p99_jct_h, pooled.makespan_h)
        base = base or figures
        waits = sum(r.wait_totals().job_rounds for r in results)
        unplaced = sum(r.wait_totals().unplaced_allocations for r in results)
        cells = " | ".join(f"{f:.3f} | {f / b:.3f}" for f, b in zip(figures, base, strict=True))
        ftf = f"{pooled.ftf_mean:.3f} | {pooled.ftf_p99:.3f} | {pooled.ftf_unfair_fraction:.1%}"
        print(f"| {variant.name} | {variant.policy} | {cells} | {ftf} | {waits} | {unplaced} |")


if __name__ == "__main__":
    raise SystemExit(main())
