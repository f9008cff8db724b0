"""Bounded cost (issue 35 item 6): what one hostile user's job directories add to a round.

Run: ``python benchmarks/bench_hostile_dirs.py [--jobs 50] [--dirs 10000] [--rounds 20]
[--with-100k] [--root DIR]``. Goal: 10,000 hostile directories add less than 1 s to a round.

Timed: ``SlurmBackend.snapshot()``, the read part of a round, on a fake Slurm answering the
three observation commands from memory (so the time is the backend's own: the job files, the
``jobs/`` scan, the logging). That is the part directories can cost: a directory reaches
``Controller.round`` only as a job (a Slurm job carries its id) or as one line of
``snapshot.rejected`` in the round that first says it, so the decision's time depends on the
jobs, not on what lies under ``jobs/``.

The state tree holds ``--jobs`` honest managed jobs (half running with an assignment and a
report, half pending under the controller's hold), then, step by step:

* four managed jobs of the hostile user whose ``metrics.json`` is a sparse 1 GiB file, 60 KB
  of garbage, a FIFO, and a file rewritten (``os.replace``) every ~1 ms by another process
  during the measurement (a valid report, garbage, a file over the size cap, in turn). A
  process, not a thread: the user's writer is never in the controller's interpreter, and a
  thread would tax the measured rounds with its share of the GIL;
* ``--dirs`` directories under ``jobs/`` that no Slurm job carries, of eleven kinds in turn
  (:data:`KINDS`): lost-submission candidates with a spec, with none, with a future mtime,
  with ``spec.json`` as a FIFO, a symlink, a sparse 1 GiB file or a directory; a 32-deep nest
  of subdirectories; names that are no sia id; a plain file; a symlink to another directory;
* the same, with the user giving every lost spec a new (old) mtime between rounds (each
  lost-submission line carries its spec's time; the scan keeps the line of its first sight,
  so re-dating makes no new one).

Each case runs on a fresh backend: its first round reads every file and logs each lost
submission once (``SlurmBackend._once``); the later rounds are the steady state. A round looks
at no more than ``LOST_SCAN_BUDGET`` (10,000) spec files (``slurm/jobfiles.LostSubmissions``),
so past that the cost is the listing of ``jobs/`` alone, and a lost submission among 100,000
directories is said within ten rounds. ``logged``
counts the warnings the ``sia_slurm`` loggers emitted (formatted, as a handler would).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.config import SiaConfig, parse_config
from sia_slurm.protocol import (
    Assignment,
    JobSpec,
    MetricsReport,
    StatePaths,
    to_json,
    write_document,
)
from sia_slurm.safefiles import MAX_FILE_BYTES
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.observe.jobfiles import SlurmRecord
from sia_slurm.slurm.runner import CommandResult
from sia_slurm.state.tree import set_up

REPO = Path(__file__).resolve().parent.parent
NODES_TEXT = REPO / "tests" / "fixtures" / "slurm-22.05" / "show-node.txt"
NODES = [f"{t}-{i}" for t in ("a100", "rtx", "t4") for i in (1, 2)]  # 4 GPUs each
KINDS = (
    "lost",  # spec.json an hour old: a lost submission, said once
    "empty",  # no spec.json
    "future",  # spec.json dated tomorrow: never old enough
    "fifo",  # spec.json a FIFO (lstat only: never opened)
    "symlink",  # spec.json a symlink to /etc/passwd (not followed)
    "huge",  # spec.json a sparse 1 GiB file
    "specdir",  # spec.json a directory
    "deep",  # a 32-deep nest of subdirectories
    "badname",  # a name that is no sia id
    "notadir",  # jobs/<id> a plain file
    "dirlink",  # jobs/<id> a symlink to another directory of the user's
)
HOSTILE_JOBS = ("m-huge", "m-garbage", "m-fifo", "m-spin")
HOUR_AGO = time.time() - 3600
GIB = 1 << 30


@dataclass(frozen=True)
class Row:
    """One case: its first round and the later ones (seconds), and what they logged."""

    case: str
    directories: int
    jobs: int
    first_s: float
    later_s: tuple[float, ...]
    first_logged: int
    later_logged: int  # the most warnings any later round logged

    @property
    def median_s(self) -> float:
        return statistics.median(self.later_s) if self.later_s else math.nan

    @property
    def p95_s(self) -> float:
        if not self.later_s:
            return math.nan
        ordered = sorted(self.later_s)
        return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]


# ------------------------------------------------------------------------------------------------
# The fake Slurm: squeue, nodes and reservations from memory


class StaticSlurm:
    """Answers the observation commands a snapshot issues; any other command is a bug here
    (the benchmark never applies)."""

    def __init__(self) -> None:
        self.jobs: list[dict[str, object]] = []
        self.runs: dict[str, tuple[int, str | None]] = {}  # sia id -> Slurm job id, node
        self.nodes_text = NODES_TEXT.read_text()

    def add(self, sia_id: str, job_id: int, node: str | None) -> None:
        """A managed job of this process's user, running on ``node`` (1 GPU) or pending under
        the controller's hold."""
        self.runs[sia_id] = (job_id, node)
        self.jobs.append(
            {
                "job_id": job_id,
                "name": "job",
                "job_state": "RUNNING" if node else "PENDING",
                "state_reason": "None" if node else "JobHeldAdmin",
                "priority": 1 if node else 0,
                "comment": f"sia-slurm:{sia_id}",
                "partition": node.split("-")[0] if node else "t4",
                "nodes": node or "",
                "node_count": 1,
                "tasks": 1,
                "cpus": 1,
                "tres_per_node": "gres:gpu:1",
                "gres_detail": ["gpu:1(IDX:0)"] if node else [],
                "required_nodes": "",
                "restart_cnt": 0,
                "submit_time": int(HOUR_AGO),
                "start_time": int(HOUR_AGO) if node else 0,
                "eligible_time": 0,
                "end_time": 0,
                "user_id": os.geteuid(),
                "group_id": os.getegid(),
                "current_working_directory": "/tmp",
                "standard_output": "/tmp/out",
            }
        )

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        argv = list(argv)
        if argv[0] == "squeue":
            out = json.dumps({"jobs": self.jobs, "errors": []})
        elif argv[:2] == ["scontrol", "-d"] or argv[:4] == ["scontrol", "-o", "show", "node"]:
            out = self.nodes_text
        elif argv[:4] == ["scontrol", "-o", "show", "reservation"]:
            out = "No reservations in the system\n"
        elif argv == ["scontrol", "show", "config"]:
            out = ""  # no slurmdbd: no accounting read
        else:
            raise AssertionError(f"the benchmark issued an unexpected command: {argv}")
        return CommandResult(tuple(argv), 0, out, "")


def make_config(state_dir: Path) -> SiaConfig:
    return parse_config(
        f"state_dir: {state_dir}\npartitions:\n"
        "  a100: {gpu_type: a100, gpus_per_node: 4}\n"
        "  rtx: {gpu_type: rtx, gpus_per_node: 4}\n"
        "  t4: {gpu_type: t4, gpus_per_node: 4}\n"
    )


# ------------------------------------------------------------------------------------------------
# The state tree


def report(sia_id: str, job_id: int, node: str, at: float) -> MetricsReport:
    return MetricsReport(
        sia_id=sia_id,
        time=at,
        gpu_type=node.split("-")[0],
        nodes=1,
        gpus=1,
        local_bsz=32,
        accum_steps=0,
        step_time=0.2,
        sync_time=0.02,
        grad_sqr=1.0,
        grad_var=2.0,
        slurm_job_id=str(job_id),
    )


def add_managed(paths: StatePaths, slurm: StaticSlurm, sia_id: str, node: str | None) -> int:
    """A managed job as the controller knows it after its first round: its spec, its record,
    and, running, its assignment and a report of this run."""
    job_id = 1000 + len(slurm.jobs)
    slurm.add(sia_id, job_id, node)
    paths.job_dir(sia_id).mkdir(mode=0o755)
    write_document(paths.spec(sia_id), JobSpec(sia_id=sia_id, app="cifar10"))
    paths.control(sia_id).mkdir()
    SlurmRecord(str(job_id), os.geteuid(), HOUR_AGO).write(paths.slurm_record(sia_id))
    if node is not None:
        gpu_type = node.split("-")[0]
        assignment = Assignment(
            sia_id, 1, gpu_type, gpu_type, 1, 1, (node,), 32, 32, 0, slurm_job_id=str(job_id)
        )
        write_document(paths.assignment(sia_id), assignment)
        write_document(paths.metrics(sia_id), report(sia_id, job_id, node, time.time()))
    return job_id


def honest_tree(root: Path, jobs: int) -> tuple[StatePaths, StaticSlurm]:
    paths = StatePaths(root / "state")
    set_up(paths.state_dir, os.geteuid(), os.getegid())
    slurm = StaticSlurm()
    running = min(jobs // 2, 4 * len(NODES) - len(HOSTILE_JOBS))
    for i in range(jobs):
        add_managed(paths, slurm, f"honest-{i:05d}", NODES[i % len(NODES)] if i < running else None)
    return paths, slurm


def add_hostile_jobs(paths: StatePaths, slurm: StaticSlurm) -> None:
    """The hostile user's managed jobs; ``m-spin``'s file is left to :func:`rewrite_metrics`."""
    for sia_id in HOSTILE_JOBS:
        add_managed(paths, slurm, sia_id, NODES[-1])
    for sia_id in HOSTILE_JOBS[:3]:
        paths.metrics(sia_id).unlink()
    with open(paths.metrics("m-huge"), "wb") as file:
        file.truncate(GIB)
    junk = bytes(range(256)) * (60 * 1024 // 256)
    paths.metrics("m-garbage").write_bytes(b'{"sia_id": "m-garbage", ' + junk)
    os.mkfifo(paths.metrics("m-fifo"))


# The user's writer, run by another interpreter (``python -c WRITER path report too_big``):
# ``path`` replaced every ~1 ms by a valid report (its time moved on), garbage, or a file over
# the cap, in turn, until killed. No project import: it starts in milliseconds.
WRITER = """
import json, os, sys, time
path, report, too_big = sys.argv[1], json.loads(sys.argv[2]), b" " * int(sys.argv[3])
tmp, count = path + ".tmp", 0
while True:
    if count % 3 == 0:
        report["time"] = time.time()
        data = json.dumps(report).encode()
    elif count % 3 == 1:
        data = b'{"sia_id": "m-spin", "steps": ' + str(count).encode() + b", oops"
    else:
        data = too_big
    with open(tmp, "wb") as file:
        file.write(data)
    os.replace(tmp, path)
    count += 1
    time.sleep(0.001)
"""


@contextmanager
def metrics_writer(paths: StatePaths, slurm: StaticSlurm) -> Iterator[None]:
    """Runs :data:`WRITER` on ``m-spin``'s metrics file while the block runs."""
    job_id, node = slurm.runs["m-spin"]
    valid = json.dumps(to_json(report("m-spin", job_id, node or NODES[-1], time.time())))
    target = paths.metrics("m-spin")
    before = target.stat().st_mtime_ns
    argv = [sys.executable, "-c", WRITER, str(target), valid, str(MAX_FILE_BYTES + 1)]
    writer = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + 30
        while target.stat().st_mtime_ns == before:  # wait for it to be writing
            if time.monotonic() > deadline or writer.poll() is not None:
                raise RuntimeError("the metrics writer did not start")
            time.sleep(0.01)
        yield
    finally:
        writer.kill()
        writer.wait()


def add_hostile_dirs(paths: StatePaths, start: int, count: int) -> list[Path]:
    """Directories ``start`` .. ``start + count - 1`` of the hostile user (kinds in turn); the
    lost specs, for :func:`redate`."""
    jobs_dir, lost = paths.jobs_dir, []
    for i in range(start, start + count):
        kind = KINDS[i % len(KINDS)]
        name = f"h{i:06d}"
        where = jobs_dir / name
        spec = where / "spec.json"
        if kind == "badname":
            bad = (f"-{name}", f"{name} x", "x" * 64 + name, f"{name}\n", f"\u202e{name}")
            (jobs_dir / bad[i % len(bad)]).mkdir()
            continue
        if kind == "notadir":
            where.write_text("not a directory\n")
            continue
        if kind == "dirlink":
            where.symlink_to(jobs_dir / f"h{i + 1 - len(KINDS):06d}")  # a "lost" one
            continue
        where.mkdir()
        if kind == "lost":
            write_document(spec, JobSpec(sia_id=name, app="cifar10"))
            lost.append(spec)
        elif kind == "future":
            write_document(spec, JobSpec(sia_id=name, app="cifar10"))
            os.utime(spec, (time.time() + 86400,) * 2)
            continue
        elif kind == "fifo":
            os.mkfifo(spec)
        elif kind == "symlink":
            spec.symlink_to("/etc/passwd")
        elif kind == "huge":
            with open(spec, "wb") as file:
                file.truncate(GIB)
        elif kind == "specdir":
            spec.mkdir()
        elif kind == "deep":
            (where / "/".join(["d"] * 32)).mkdir(parents=True)
            continue
        else:  # empty
            continue
        os.utime(spec, (HOUR_AGO, HOUR_AGO), follow_symlinks=False)
    return lost


def redate(specs: Sequence[Path], round_index: int) -> None:
    """The user gives every lost spec another old mtime (untimed: the user's own work)."""
    old = HOUR_AGO - round_index
    for spec in specs:
        os.utime(spec, (old, old), follow_symlinks=False)


# ------------------------------------------------------------------------------------------------
# Measuring


class CountingHandler(logging.Handler):
    """Formats each record (as the daemon's handler would) and counts it."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.format(record)
        self.count += 1

    def take(self) -> int:
        count, self.count = self.count, 0
        return count


@contextmanager
def counted_logs() -> Iterator[CountingHandler]:
    """The ``sia_slurm`` warnings, counted and kept off stderr while the block runs."""
    log = logging.getLogger("sia_slurm")
    handler = CountingHandler()
    saved = log.propagate
    log.addHandler(handler)
    log.propagate = False
    try:
        yield handler
    finally:
        log.removeHandler(handler)
        log.propagate = saved


def time_case(
    case: str,
    paths: StatePaths,
    slurm: StaticSlurm,
    directories: int,
    rounds: int,
    redated: Sequence[Path] = (),
) -> Row:
    """``rounds`` snapshots on a fresh backend; ``redated`` specs get a new mtime before each
    round after the first."""
    backend = SlurmBackend(make_config(paths.state_dir), slurm)
    times, logged = [], []
    with counted_logs() as handler:
        for index in range(rounds):
            if index and redated:
                redate(redated, index)
            start = time.perf_counter()
            backend.snapshot()
            times.append(time.perf_counter() - start)
            logged.append(handler.take())
    return Row(
        case,
        directories,
        len(slurm.jobs),
        times[0],
        tuple(times[1:]),
        logged[0],
        max(logged[1:], default=0),
    )


def measure(root: Path, jobs: int, sizes: Sequence[int], rounds: int) -> list[Row]:
    """The table's rows: honest jobs; with the hostile jobs; then, for each size in
    ``sizes`` (growing), that many hostile directories, and the same with lost specs
    re-dated every round."""
    paths, slurm = honest_tree(root, jobs)
    rows = [time_case("honest jobs only", paths, slurm, 0, rounds)]
    add_hostile_jobs(paths, slurm)
    with metrics_writer(paths, slurm):
        rows.append(time_case("+ hostile metrics (4 jobs)", paths, slurm, 0, rounds))
        made, lost = 0, []
        for size in sorted(sizes):
            lost += add_hostile_dirs(paths, made, size - made)
            made = size
            rows.append(time_case("+ hostile dirs", paths, slurm, made, rounds))
            rows.append(time_case("+ hostile dirs, re-dated", paths, slurm, made, rounds, lost))
    return rows


def table(rows: Sequence[Row]) -> list[str]:
    base = rows[0].median_s
    lines = [
        f"{'case':<28} {'dirs':>7} {'jobs':>5} {'first ms':>9} {'median ms':>10} "
        f"{'p95 ms':>8} {'added ms':>9} {'logged 1st':>10} {'later max':>9}"
    ]
    for row in rows:
        lines.append(
            f"{row.case:<28} {row.directories:>7} {row.jobs:>5} {row.first_s * 1e3:>9.1f} "
            f"{row.median_s * 1e3:>10.1f} {row.p95_s * 1e3:>8.1f} "
            f"{(row.median_s - base) * 1e3:>9.1f} {row.first_logged:>10} {row.later_logged:>9}"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50, help="honest managed jobs")
    parser.add_argument("--dirs", type=int, default=10_000, help="hostile directories")
    parser.add_argument("--rounds", type=int, default=20, help="snapshots per case")
    parser.add_argument("--with-100k", action="store_true", help="also 100,000 directories")
    parser.add_argument("--root", type=Path, default=None, help="where to build the trees")
    args = parser.parse_args()
    sizes = [args.dirs, 100_000] if args.with_100k else [args.dirs]
    root = Path(tempfile.mkdtemp(prefix="sia-bench-hostile-", dir=args.root))
    rows = measure(root, args.jobs, sizes, args.rounds)
    print(
        f"SlurmBackend.snapshot() on a fake Slurm, {args.jobs} honest jobs, {args.rounds} rounds "
        f"per case ({os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, tree in {root})"
    )
    print("\n".join(table(rows)))
    print(
        "first: the first round on a fresh backend; median/p95: the later rounds; added: median "
        "minus the honest median; logged: sia_slurm warnings in the first round, and the most "
        "in any later round"
    )


if __name__ == "__main__":
    main()
