"""Parsing a large Slurm's snapshot: ``squeue --json`` of 10,000 jobs and 2,000 nodes.

No real cluster of that size is at hand, so the outputs are generated from the captured ones
(``tests/fixtures/slurm-<release>/squeue-mixed.json`` and ``show-node.txt``): the captured job
records are repeated in turn with fresh job ids and their node lists moved onto a cluster of
``--nodes`` nodes (hostlist ranges like ``a100-[37-38]``, ``gres_detail`` kept in step), and the
captured node records are repeated with new names. Every record is one Slurm really printed,
so every version's field shapes are exercised.

Prints, per Slurm release, the time to parse the jobs (``parse_squeue_json``: JSON decoding
included), the nodes (``parse_nodes`` of ``scontrol -o show node``) and to count the GPUs the
jobs hold per node. Goal (issue 16): the whole snapshot parse under 1 s on 2 cores.

Usage: PYTHONPATH=. python benchmarks/bench_parse.py [--jobs 10000] [--nodes 2000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from blas import single_threaded

from sia_slurm.slurm.observe.capacity import gpus_held
from sia_slurm.slurm.observe.hostlist import expand_hostlist
from sia_slurm.slurm.observe.inventory import parse_nodes
from sia_slurm.slurm.observe.jsonparse import parse_squeue_json

FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
RELEASES = ("22.05", "24.11", "26.05")
TYPES = ("a100", "rtx", "t4")


def node_names(count: int) -> dict[str, int]:
    """Nodes per GPU type for a ``count``-node cluster of the captured types."""
    per_type = {t: count // len(TYPES) for t in TYPES}
    per_type[TYPES[0]] += count - sum(per_type.values())
    return per_type


def squeue_text(release: str, jobs: int, nodes: int) -> str:
    """``squeue --json`` of ``jobs`` jobs, the captured records repeated on a larger cluster."""
    path = FIXTURES / f"slurm-{release}" / "squeue-mixed.json"
    payload = json.loads(path.read_text())
    templates = payload["jobs"]
    per_type = node_names(nodes)
    out = []
    for i in range(jobs):
        record: dict[str, Any] = copy.deepcopy(templates[i % len(templates)])
        record["job_id"] = 100000 + i
        names = expand_hostlist(record.get("nodes") or "")
        if names:
            gpu_type = re.sub(r"-\d+$", "", names[0])
            size = per_type.get(gpu_type, nodes)
            first = 1 + (i * 7) % max(1, size - len(names))
            last = first + len(names) - 1
            record["nodes"] = (
                f"{gpu_type}-{first}" if first == last else (f"{gpu_type}-[{first}-{last}]")
            )
        out.append(record)
    payload["jobs"] = out
    return json.dumps(payload)


def show_node_text(release: str, nodes: int) -> str:
    """``scontrol -o show node`` of ``nodes`` nodes, from the captured records."""
    lines = (FIXTURES / f"slurm-{release}" / "show-node.txt").read_text().splitlines()
    by_type: dict[str, str] = {}
    for line in lines:
        name = line.split()[0].removeprefix("NodeName=")
        by_type.setdefault(re.sub(r"-\d+$", "", name), line)
    out = []
    for gpu_type, count in node_names(nodes).items():
        template = by_type[gpu_type]
        old = template.split()[0]
        for k in range(1, count + 1):
            out.append(template.replace(old, f"NodeName={gpu_type}-{k}", 1))
    return "\n".join(out) + "\n"


clock: Callable[[], float] = time.perf_counter


def best_of(repeat: int, function: Callable[[], Any]) -> tuple[float, Any]:
    """Median seconds over ``repeat`` runs (of ``clock``), and the last result."""
    times, result = [], None
    for _ in range(repeat):
        started = clock()
        result = function()
        times.append(clock() - started)
    return statistics.median(times), result


def main() -> None:
    single_threaded()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--clock", choices=("wall", "cpu"), default="wall", help="cpu: this process's CPU time"
    )
    args = parser.parse_args()
    global clock
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print(
        "| Slurm | jobs | nodes | squeue JSON MB | parse jobs ms | parse nodes ms | "
        "GPUs held ms | total ms | problems |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for release in RELEASES:
        jobs_text = squeue_text(release, args.jobs, args.nodes)
        nodes_text = show_node_text(release, args.nodes)
        jobs_s, result = best_of(args.repeat, lambda t=jobs_text: parse_squeue_json(t))
        nodes_s, parsed = best_of(args.repeat, lambda t=nodes_text: parse_nodes(t))
        held_s, _ = best_of(args.repeat, lambda r=result: gpus_held(r.jobs))
        assert len(result.jobs) + len(result.problems) == args.jobs and len(parsed) == args.nodes
        total = jobs_s + nodes_s + held_s
        print(
            f"| {release} | {args.jobs} | {args.nodes} | {len(jobs_text) / 1e6:.1f} | "
            f"{jobs_s * 1e3:.0f} | {nodes_s * 1e3:.0f} | {held_s * 1e3:.0f} | "
            f"{total * 1e3:.0f} | {len(result.problems)} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
