"""A paper workload and cluster scaled up together: k times the GPUs, k times the jobs.

The Sia paper's simulations run 160-job workloads (8 h of arrivals) on 64 GPUs. To see a round
at 2,048 GPUs under load of the same kind, this writes

- ``hetero<64k>.yaml``: the paper's heterogeneous cluster (``etc/clusters/hetero64.yaml``) with
  every type's node count multiplied by ``k``;
- ``<trace>-x<k>.csv``: ``k`` workloads of the trace (its files taken in turn, repeated as
  needed) merged on their own submission times, so the arrival rate grows ``k``-fold over the same
  8 hours and the jobs' mix (apps, sizes, batch sizes) stays the trace's. Names get ``-w<i>``.

Usage: ``python benchmarks/scaled_workload.py --scale 32 --trace saturn --out DIR``
(``saturn`` is the Helios sample, ``philly`` the Philly one). Then e.g.
``python -m sia_slurm.cli simulate DIR/saturn-x32.csv --cluster DIR/hetero2048.yaml --out OUT``.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CLUSTER = REPO / "etc" / "clusters" / "hetero64.yaml"
WORKLOADS = REPO / "data" / "workloads"


def scaled_cluster_text(scale: int, source: Path = CLUSTER) -> str:
    """The cluster file with each ``nodes:`` multiplied by ``scale`` and a new name."""
    lines = []
    total = 0
    per_node = 0
    for line in source.read_text().splitlines():
        key, _, value = line.strip().partition(":")
        if key == "gpus_per_node":
            per_node = int(value.split("#")[0])
        if key == "nodes":
            indent = line[: len(line) - len(line.lstrip())]
            nodes = int(value.split("#")[0]) * scale
            total += nodes * per_node
            line = f"{indent}nodes: {nodes}"
        lines.append(line)
    text = "\n".join(lines) + "\n"
    text = text.replace("name: hetero64", f"name: hetero{total}")
    return text.replace(
        "description: Sia paper, simulated heterogeneous cluster (64 GPUs)",
        f"description: Sia paper's heterogeneous cluster scaled {scale}x ({total} GPUs)",
    )


def scaled_rows(trace: str, scale: int) -> list[dict[str, str]]:
    """``scale`` workloads of ``trace`` merged by submission time (stable: file order on ties)."""
    files = sorted(
        (WORKLOADS / trace).glob("workload-*.csv"), key=lambda p: int(p.stem.split("-")[1])
    )
    if not files:
        raise SystemExit(f"{WORKLOADS / trace}: no workload-*.csv files")
    rows: list[dict[str, str]] = []
    for i in range(scale):
        with files[i % len(files)].open(newline="") as handle:
            for row in csv.DictReader(handle):
                rows.append({**row, "name": f"{row['name']}-w{i}"})
    rows.sort(key=lambda row: float(row["time"]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=32)
    parser.add_argument("--trace", default="saturn", choices=("saturn", "philly"))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.scale < 1:
        raise SystemExit(f"--scale: expected a positive integer, got {args.scale}")
    args.out.mkdir(parents=True, exist_ok=True)
    cluster = scaled_cluster_text(args.scale)
    name = cluster.split("name: ", 1)[1].split("\n", 1)[0]
    (args.out / f"{name}.yaml").write_text(cluster)
    rows = scaled_rows(args.trace, args.scale)
    path = args.out / f"{args.trace}-x{args.scale}.csv"
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(f"{args.out / (name + '.yaml')}: {name}; {path}: {len(rows)} jobs")


if __name__ == "__main__":
    main()
