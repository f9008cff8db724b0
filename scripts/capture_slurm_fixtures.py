#!/usr/bin/env python3
"""Capture what a Slurm release prints, for the parser tests (tests/fixtures/slurm-<release>/).

    python3 scripts/capture_slurm_fixtures.py 24.11          # -> tests/fixtures/slurm-24.11/
    python3 scripts/capture_slurm_fixtures.py 26.05
    python3 scripts/capture_slurm_fixtures.py system --out /tmp/x   # the host's own Slurm

As root. For 24.11 and 26.05 the Debian root of that release is built (once, cached:
``sia-slurm dev-cluster root``), /proc, /dev and /sys are bound into it, and munged, slurmctld
and six slurmd (a100-[1-2], rtx-[1-2], t4-[1-2], 4 fake GPUs each, one partition per type;
slurm.conf and gres.conf rendered by dev/sia_slurm_dev/slurm_conf.py, as the dev cluster's) run
as ``chroot ROOT ...``, their files under ROOT/srv/sia-capture. Ports 26817-26823 (other
sessions' clusters use 17817-25817).

It then tries the scontrol verbs the backend relies on (recorded with exit status and the job
after each in scontrol-verbs.txt), builds a queue with a job in every state the tests use, and
saves ``squeue --json --all --states=all`` (squeue-mixed.json), ``scontrol -o show node``
(show-node.txt, then show-node-drained.txt with t4-2 drained), ``-o show partition``, ``-o
show job`` of a running job, ``-o show reservation`` (none, then one active), ``show
config``, ``sinfo --json``, and the rendered slurm.conf / gres.conf / cgroup.conf. At the end
every job is cancelled, every daemon started here is stopped by pid, what was mounted is
unmounted and ROOT/srv/sia-capture is removed (the root itself stays cached).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sia_slurm.slurm.observe.jsonparse import parse_squeue_json  # noqa: E402
from sia_slurm_dev.roots import (  # noqa: E402
    RELEASE_SUITES,
    ensure_root,
)

JOB_FIELDS = (
    "JobState",
    "Reason",
    "Priority",
    "Partition",
    "NumNodes",
    "NumTasks",
    "NumCPUs",
    "TresPerNode",
    "ReqNodeList",
    "NodeList",
    "Restarts",
    "StartTime",
)


from scripts.capture_cluster import (  # noqa: E402
    IN_ROOT_DIR,
    SLEEP,
    SPEC,
    CaptureError,
    Cluster,
    processes_in,
    say,
)

# ---- what is recorded -----------------------------------------------------------------------


class VerbLog:
    """Each scontrol step: the command, its exit status and output, and the job after it."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.lines: list[str] = []
        self.last_stderr = ""

    def section(self, title: str) -> None:
        say(title)
        self.lines += ["", f"## {title}"]

    def note(self, text: str) -> None:
        say(text)
        self.lines.append(f"# {text}")

    def show(self, job_id: str, label: str = "job") -> dict[str, str]:
        record = self.cluster.job(job_id)
        fields = " ".join(f"{k}={record.get(k, '')}" for k in JOB_FIELDS)
        self.lines.append(f"{label}: {fields}")
        return record

    def step(self, argv: Sequence[str], job_id: str | None = None) -> int:
        proc = self.cluster.run(argv, check=False)
        self.last_stderr = proc.stderr
        self.lines.append(f"$ {' '.join(argv)}")
        self.lines.append(f"exit {proc.returncode}")
        for stream in (proc.stdout, proc.stderr):
            self.lines += [f"  | {line}" for line in stream.strip().splitlines()]
        say(f"{' '.join(argv)} -> exit {proc.returncode} {proc.stderr.strip()}")
        if job_id is not None:
            time.sleep(0.5)
            self.show(job_id, "after")
        return proc.returncode


def timestamp(seconds_from_now: float) -> str:
    moment = dt.datetime.now() + dt.timedelta(seconds=seconds_from_now)
    return moment.strftime("%Y-%m-%dT%H:%M:%S")


def update_retrying(c: Cluster, log: VerbLog, argv: list[str], job_id: str) -> bool:
    """One ``scontrol update``, tried again (up to 10 times, 1 s apart) while Slurm answers
    EAGAIN (a Partition= change without accounting: V5). False when it never took."""
    for attempt in range(1, 11):
        if log.step(argv, job_id) == 0:
            return True
        if "temporarily unavailable" not in log.last_stderr:
            return False
        log.note(f"attempt {attempt} refused with EAGAIN; again in 1 s")
        time.sleep(1)
    return False


def try_verbs(c: Cluster, log: VerbLog) -> str:
    """The scontrol steps of the backend's start and move paths; returns the TresPerNode form
    that took (``gres:gpu:K`` on 22.05)."""
    log.section("V1 reshape + retype a held job that never ran, then release")
    v1 = c.sbatch("--hold", "-p", "t4", "-N", "1", "--gpus-per-node=1", "--comment=sia-slurm:v1")
    log.show(v1, "submitted")
    tres = "gres:gpu:{}"
    update = [
        "scontrol",
        "update",
        f"JobId={v1}",
        "Partition=a100",
        "NumNodes=2-2",
        "NumTasks=2",
        "NumCPUs=2",
        "TresPerNode=gres:gpu:2",
        "ReqNodeList=a100-[1-2]",
    ]
    if not update_retrying(c, log, update, v1):
        tres = "gres/gpu:{}"
        update_retrying(c, log, [*update[:-2], "TresPerNode=gres/gpu:2", update[-1]], v1)
    log.step(["scontrol", "release", v1], v1)
    with contextlib.suppress(CaptureError):
        took = c.wait_state(v1, "RUNNING", timeout_s=30)
        log.note(f"RUNNING {took:.1f} s after release; gres_detail {c.gres_detail(v1)}")
    log.show(v1, "then")
    c.run(["scancel", v1])

    log.section("V2 requeuehold a running 2-node job, admin hold, shrink + retype, release")
    v2 = c.sbatch(
        "-p", "a100", "-N", "2", "--ntasks-per-node=1", "--gpus-per-node=2", "--requeue",
        "--comment=sia-slurm:v2",
    )  # fmt: skip
    c.wait_state(v2, "RUNNING")
    log.show(v2, "running")
    log.step(["scontrol", "requeuehold", v2])
    seen: list[str] = []

    def pending() -> bool:
        state = c.job_state(v2)
        if not seen or seen[-1] != state:
            seen.append(state)
        return state == "PENDING"

    took = c.wait("requeued job PENDING", pending, 60)
    log.note(f"states after requeuehold: {' -> '.join(seen)} ({took:.1f} s to PENDING)")
    log.show(v2, "pending")
    log.step(["scontrol", "hold", v2], v2)
    shrink = [
        "scontrol", "update", f"JobId={v2}", "Partition=t4", "NumNodes=1-1", "NumTasks=1",
        "NumCPUs=1", f"TresPerNode={tres.format(1)}", "ReqNodeList=t4-1",
    ]  # fmt: skip
    update_retrying(c, log, shrink, v2)
    log.step(["scontrol", "release", v2], v2)
    log.step(["scontrol", "update", f"JobId={v2}", "StartTime=now"], v2)
    with contextlib.suppress(CaptureError):
        took = c.wait_state(v2, "RUNNING", timeout_s=60)
        log.note(f"RUNNING {took:.1f} s after StartTime=now; gres_detail {c.gres_detail(v2)}")
    log.show(v2, "then")
    c.run(["scancel", v2])

    log.section("V3 requeue (not hold) a running job, then StartTime=<a time 5 s ahead>")
    v3 = c.sbatch("-p", "t4", "--gpus-per-node=1", "--requeue", "--comment=sia-slurm:v3")
    c.wait_state(v3, "RUNNING")
    log.step(["scontrol", "requeue", v3])
    c.wait("requeued job PENDING", lambda: c.job_state(v3) == "PENDING", 60)
    log.show(v3, "pending")
    log.step(["scontrol", "update", f"JobId={v3}", f"StartTime={timestamp(5)}"], v3)
    with contextlib.suppress(CaptureError):
        took = c.wait_state(v3, "RUNNING", timeout_s=60)
        log.note(f"RUNNING {took:.1f} s after the StartTime update")
    log.show(v3, "then")
    c.run(["scancel", v3])

    log.section("V5 Partition= updates of a held pending job, 20 times each way")
    v5 = c.sbatch("--hold", "-p", "t4", "--gpus-per-node=1", "--comment=sia-slurm:v5")
    for fields in (("Partition=a100", "Partition=t4"), ("NumTasks=1", "NumTasks=1")):
        refused = []
        for index in range(20):
            proc = c.run(["scontrol", "update", f"JobId={v5}", fields[index % 2]], check=False)
            if proc.returncode != 0:
                refused.append(f"{fields[index % 2]}: {proc.stderr.strip()}")
        log.note(f"{' / '.join(fields)}: {len(refused)} of 20 refused {sorted(set(refused))}")
    c.run(["scancel", v5])
    return tres


def build_queue(c: Cluster, log: VerbLog, tres: str) -> dict[str, str]:
    """A job in every state the tests use; returns comment/label -> job id."""
    jobs: dict[str, str] = {}
    gpus = "--gpus-per-node=1"
    log.section("Q finished jobs: done-1 (exit 0), failed-1 (exit 1), requeued-done-1")
    jobs["done-1"] = c.sbatch("-p", "t4", gpus, "--comment=sia-slurm:done-1", wrap="true")
    jobs["failed-1"] = c.sbatch("-p", "t4", gpus, "--comment=sia-slurm:failed-1", wrap="exit 1")
    done2 = c.sbatch("-p", "t4", gpus, "--comment=sia-slurm:requeued-done-1", wrap="true")
    jobs["requeued-done-1"] = done2
    for label in ("done-1", "failed-1", "requeued-done-1"):
        c.wait_state(jobs[label], "COMPLETED", "FAILED")
    log.section("V4 requeuehold of a job that already COMPLETED")
    log.show(done2, "finished")
    log.step(["scontrol", "requeuehold", done2], done2)

    log.section("Q running: run-1 on a100-1 (-w, 2 GPUs), multi on rtx-[1-2] (typed rtx:3)")
    jobs["run-1"] = c.sbatch(
        "-p", "a100", "-w", "a100-1", "--gpus-per-node=2", "--requeue",
        "--comment=sia-slurm:run-1",
    )  # fmt: skip
    jobs["multi"] = c.sbatch("-p", "rtx", "-N", "2", "--gpus-per-node=rtx:3", "--job-name=multi")
    for label in ("run-1", "multi"):
        c.wait_state(jobs[label], "RUNNING")

    log.section("Q held and pending: pend-1 (sbatch --hold), admin-1 (+ scontrol hold), ...")
    jobs["pend-1"] = c.sbatch("--hold", "-p", "t4", gpus, "--comment=sia-slurm:pend-1")
    jobs["admin-1"] = c.sbatch("--hold", "-p", "t4", gpus, "--comment=sia-slurm:admin-1")
    log.step(["scontrol", "hold", jobs["admin-1"]], jobs["admin-1"])
    jobs["x1"] = c.sbatch("--hold", "-p", "t4", gpus, "--comment=sia-slurm:x1")
    jobs["released-1"] = c.sbatch(
        "--hold", "-p", "a100", "-N", "2", "--gpus-per-node=4", "--comment=sia-slurm:released-1"
    )
    log.step(["scontrol", "release", jobs["released-1"]], jobs["released-1"])

    log.section("Q requeued-1: requeuehold of a running job; cancelled-1; alloc-1 exclusive")
    jobs["requeued-1"] = c.sbatch(
        "-p", "t4", "-w", "t4-1", gpus, "--requeue", "--comment=sia-slurm:requeued-1"
    )
    jobs["cancelled-1"] = c.sbatch(
        "-p", "t4", "-w", "t4-1", gpus, "--comment=sia-slurm:cancelled-1"
    )
    for label in ("requeued-1", "cancelled-1"):
        c.wait_state(jobs[label], "RUNNING")
    log.step(["scontrol", "requeuehold", jobs["requeued-1"]])
    c.run(["scancel", jobs["cancelled-1"]])
    c.wait("requeued-1 PENDING", lambda: c.job_state(jobs["requeued-1"]) == "PENDING", 60)
    c.wait_state(jobs["cancelled-1"], "CANCELLED")
    jobs["alloc-1"] = c.sbatch("-p", "t4", "-w", "t4-1", "--exclusive", gpus, "--job-name=alloc")
    c.wait_state(jobs["alloc-1"], "RUNNING")

    log.section("Q requeue-1 and completing-1 on rtx (1 GPU each), running until the capture")
    jobs["requeue-1"] = c.sbatch(
        "-p", "rtx", "-w", "rtx-1", gpus, "--requeue", "--comment=sia-slurm:requeue-1"
    )
    jobs["completing-1"] = c.sbatch(
        "-p", "rtx", "-w", "rtx-2", gpus, "--comment=sia-slurm:completing-1",
        wrap=f"trap '' TERM; {SLEEP}",
    )  # fmt: skip
    for label in ("requeue-1", "completing-1"):
        c.wait_state(jobs[label], "RUNNING")
    return jobs


def capture(release: str, c: Cluster, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    log = VerbLog(c)
    files = c.write_files(release)
    c.mount()
    c.up()
    version = c.run(["scontrol", "--version"]).stdout.strip()
    log.lines.append(f"# {version}; {dt.date.today().isoformat()}")

    def save(name: str, text: str) -> None:
        (out / name).write_text(text)
        say(f"wrote {out / name} ({len(text)} bytes)")

    save("show-reservation-none.txt", c.run(["scontrol", "-o", "show", "reservation"]).stdout)
    tres = try_verbs(c, log)
    jobs = build_queue(c, log, tres)
    save("show-job.txt", c.run(["scontrol", "-o", "show", "job", jobs["run-1"]]).stdout)
    save("show-node.txt", c.run(["scontrol", "-o", "show", "node"]).stdout)
    save("show-partition.txt", c.run(["scontrol", "-o", "show", "partition"]).stdout)
    save("sinfo.json", c.run(["sinfo", "--json"]).stdout)
    save("show-config.txt", c.run(["scontrol", "show", "config"]).stdout)

    log.section("Q the capture: requeue requeue-1, scancel completing-1 (ignores SIGTERM)")
    log.step(["scontrol", "requeue", jobs["requeue-1"]])
    c.run(["scancel", jobs["completing-1"]])
    time.sleep(1.0)
    text = c.squeue_json()
    log.show(jobs["completing-1"], "completing-1 at the capture")
    log.show(jobs["requeue-1"], "requeue-1 at the capture")
    save("squeue-mixed.json", text)

    c.run(["scontrol", "update", "NodeName=t4-2", "State=DRAIN", "Reason=fan failure"])
    save("show-node-drained.txt", c.run(["scontrol", "-o", "show", "node"]).stdout)
    c.run(
        [
            "scontrol", "create", "reservation", "ReservationName=maint", "StartTime=now",
            "Duration=60", "Nodes=a100-2", "Users=root", "Flags=MAINT,IGNORE_JOBS",
        ]
    )  # fmt: skip
    save("show-reservation.txt", c.run(["scontrol", "-o", "show", "reservation"]).stdout)
    for name, body in files.items():
        save(name, body)
    lines = ["# scontrol verbs, run by scripts/capture_slurm_fixtures.py", *log.lines]
    save("scontrol-verbs.txt", "\n".join(lines) + "\n")
    save("jobs.json", json.dumps(jobs, indent=2) + "\n")

    result = parse_squeue_json(text)
    for problem in result.problems:
        say(f"PARSE PROBLEM: {problem}")
    for job in result.jobs:
        say(
            f"  {job.job_id:>3} {job.comment or job.name:<28} {job.state:<10} {job.flags} "
            f"{job.reason} held={job.held} nodes={job.nodes} gpus={job.gpus_per_node} "
            f"req={job.requested_gpus_per_node} restarts={job.restart_count}"
        )


@contextlib.contextmanager
def cluster_for(
    release: str, cache_dir: Path | None, port_base: int
) -> Iterator[tuple[str, Cluster]]:
    if release == "system":
        version = subprocess.run(
            ["slurmctld", "-V"], capture_output=True, text=True, check=True
        ).stdout.split()[-1]
        run_dir = Path(f"/tmp/sia-capture-{version}")
        cluster = Cluster(None, run_dir, port_base)
        release = ".".join(version.split(".")[:2])
    else:
        built = ensure_root(release, cache_dir, log=say)
        if processes_in(built.path):
            raise CaptureError(
                f"something already runs in {built.path}: {processes_in(built.path)}"
            )
        cluster = Cluster(built.path, IN_ROOT_DIR, port_base)
    try:
        yield release, cluster
    finally:
        cluster.down()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("release", choices=[*sorted(RELEASE_SUITES), "system"])
    parser.add_argument("--out", type=Path, help="default: tests/fixtures/slurm-<release>")
    parser.add_argument("--cache-dir", type=Path, default=None)
    parser.add_argument("--port-base", type=int, default=26817)
    args = parser.parse_args()
    if os.geteuid() != 0:
        parser.error("run as root (chroot, mount, Slurm's daemons)")
    for port in range(args.port_base, args.port_base + 1 + len(SPEC.node_names())):
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                parser.error(f"port {port} is in use: pass another --port-base")
    with cluster_for(args.release, args.cache_dir, args.port_base) as (release, cluster):
        out = args.out or REPO / "tests" / "fixtures" / f"slurm-{release}"
        capture(release, cluster, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
