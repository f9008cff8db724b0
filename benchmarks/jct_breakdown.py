"""Where a policy's job completion time goes, from a ``paper_table3.py --out DIR`` run.

    python benchmarks/jct_breakdown.py DIR

For every (policy, trace) saved in ``DIR`` (``done/POLICY-TRACE-WORKLOAD.json`` and the round
logs ``rounds-POLICY-TRACE-WORKLOAD.jsonl``), the sum of every job's JCT split into:

* **queued**: from submission to the round that first gives the job GPUs;
* **held back**: later rounds in which the job, still active, holds no GPUs (a stop or a
  preemption), a round's length each;
* **restarting**: the simulator's restart delay of its app (``sia_slurm/sim/restart.py``), paid
  on the first start and on every restart after it;
* **running**: the rest, training on GPUs.

Issue 38 asks for 15% lower average JCT than the paper's Sia. A policy can only shorten what
is not running at the speed its allocation gives; this table says how much of the JCT that is
(docs/concepts/policies.md). The split is to the round (60 s): a job that finishes inside the
round of an action is counted whole.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.sim.restart import restart_delay  # noqa: E402

NAME = re.compile(r"^(.+)-(philly|helios)-(.+)$")  # paper_table3.py's POLICY-TRACE-WORKLOAD


@dataclass
class Split:
    """Seconds summed over jobs."""

    jobs: int = 0
    jct: float = 0.0
    queued: float = 0.0
    held_back: float = 0.0
    restarting: float = 0.0
    restarts: int = 0

    def add(self, other: Split) -> None:
        for name in ("jobs", "jct", "queued", "held_back", "restarting", "restarts"):
            setattr(self, name, getattr(self, name) + getattr(other, name))


def workload_split(done: dict, rounds_path: Path) -> Split:
    """One saved workload's split (module doc)."""
    jobs = {job["name"]: job for job in done["jobs"] if job["finish_time"] is not None}
    first: dict[str, float] = {}
    unheld: dict[str, int] = defaultdict(int)
    round_s = None
    with rounds_path.open(encoding="utf-8") as lines:
        previous_time = None
        for line in lines:
            record = json.loads(line)
            if previous_time is not None and round_s is None:
                round_s = record["time"] - previous_time
            previous_time = record["time"]
            holding = set(record["goodput"])
            for name in holding:
                first.setdefault(name, record["time"])
            for name, job in jobs.items():
                started = first.get(name)
                if (
                    started is not None
                    and name not in holding
                    and record["time"] < job["finish_time"]
                ):
                    unheld[name] += 1
    split = Split()
    for name, job in jobs.items():
        delay = restart_delay(job["app"]).true_s
        start = first.get(name, job["submit_time"])
        split.jobs += 1
        split.jct += job["finish_time"] - job["submit_time"]
        split.queued += max(start - job["submit_time"], 0.0)
        split.held_back += unheld[name] * (round_s or 60.0)
        split.restarting += delay * (job["restarts"] + 1)
        split.restarts += job["restarts"]
    return split


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a paper_table3.py --out folder")
    args = parser.parse_args()
    splits: dict[tuple[str, str], Split] = {}
    for path in sorted((args.out / "done").glob("*.json")):
        found = NAME.match(path.stem)
        if found is None:
            print(f"{path}: not POLICY-TRACE-WORKLOAD.json; skipped", file=sys.stderr)
            continue
        policy, trace, _ = found.groups()
        done = json.loads(path.read_text(encoding="utf-8"))
        rounds = args.out / f"rounds-{path.stem}.jsonl"
        if not rounds.is_file():
            print(f"{rounds}: no round log; skipped", file=sys.stderr)
            continue
        for key in ((policy, trace), (policy, "both")):
            splits.setdefault(key, Split()).add(workload_split(done, rounds))
    if not splits:
        parser.error(f"{args.out}: no saved workloads with round logs (paper_table3.py --out)")
    print("| policy | trace | jobs | avg JCT h | queued | held back | restarting | running | "
          "restarts/job |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (policy, trace), s in sorted(splits.items()):
        running = s.jct - s.queued - s.held_back - s.restarting
        shares = " | ".join(
            f"{part / s.jct:.1%}" for part in (s.queued, s.held_back, s.restarting, running)
        )
        print(f"| {policy} | {trace} | {s.jobs} | {s.jct / s.jobs / 3600:.3f} | {shares} | "
              f"{s.restarts / s.jobs:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
