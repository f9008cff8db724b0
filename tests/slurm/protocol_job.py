"""A tiny job that speaks the sia-slurm job protocol, for the backend's tests on real Slurm.

Not a trainer: it counts. It does what a managed job must do (``sia_slurm/protocol/``):

* reads ``control/<id>/assignment.json`` and refuses to run (exit 3) without one or when
  Slurm's allocation disagrees with it (partition, node count, GPUs per node, and the Slurm
  run it was written for);
* resumes its counter from its checkpoint, then counts every 50 ms, and writes a metrics
  report (naming its Slurm run) to ``jobs/<id>/metrics.json`` every 0.5 s;
* adopts a rewritten assignment (a rebatch) without restarting; one written for another
  Slurm run of the job means this run was left behind (its slurmd died and the job runs
  elsewhere now): it stops at once, saving nothing, and exits 76 (``superseded``) once the
  successor reports, as sia-launch does;
* on ``stop.json`` (polled; SIGUSR1 only wakes it up) checkpoints, writes ``ack-<round>``, and
  idles until Slurm's SIGTERM (the requeue) or ``--linger`` seconds; a request not newer than
  the assignment it started with is stale and ignored (``docs/protocol.md``); with
  ``--ack-delay S`` the checkpoint takes S seconds (a slow job, for crash tests); with
  ``--exit-delay S`` it takes S seconds to exit once Slurm's SIGTERM came (as sia-launch
  tearing down torchrun does), so the job stays COMPLETING that long;
* with ``--steps N`` exits 0 once the counter reaches N (training done), and with
  ``--finish-file F`` once F exists (training done when the test says so); with
  ``--fail-at N`` exits 1 when the counter reaches N (the user's code fails);
* leaves ``jobs/<id>/exit-<run>.json`` as sia-launch does, saying how the run ended;
* on a profiling run (the assignment's ``profile_sweep``, docs/profiling.md) with
  ``--seed-profile``, writes ``jobs/<id>/profiled.json`` after ``--sweep-s`` seconds: the seed
  profile's step times at each batch of the sweep it holds, for every type measured so far
  (kept in ``profiled-state.json``, as a trainer keeps them in its checkpoint); with
  ``--profiled-doc FILE`` it writes that file's content instead (a hostile job);
* reports a step time that falls with more GPUs (``0.1 + 0.4 / gpus``), or with
  ``--seed-profile CSV`` what a real app would: the 1-GPU step time of its seed profile
  (``profiles/<app>/seed.csv``) at the assigned local batch, plus an all-reduce time that
  grows with the GPU count; ``--profile-type a100=dgx`` maps a GPU type to the profile's name.

Every event goes as one JSON line to ``jobs/<id>/events.jsonl`` for the tests to read.
Run as the batch script's ``exec python3 protocol_job.py --state-dir D --sia-id ID``.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sia_slurm.protocol import (
    Assignment,
    ExitCause,
    MetricsReport,
    ProtocolError,
    RunExit,
    StatePaths,
    StopRequest,
    exit_name,
    read_document,
    write_document,
)
from sia_slurm.safefiles import write_json_atomic

TICK_S = 0.05
REPORT_EVERY_S = 0.5
SYNC_BASE_S = 0.004  # all-reduce time of 2 GPUs on one node in --seed-profile mode
SYNC_PER_GPU_S = 0.0005  # ... and per GPU beyond 2
SYNC_INTER_NODE = 2.0  # ... times this across nodes


class SeedProfile:
    """Step times of a real app on 1 GPU per GPU type, from a ``seed.csv`` profile."""

    def __init__(self, path: Path, aliases: dict[str, str]) -> None:
        self.aliases = aliases
        self.points: dict[str, list[tuple[int, float]]] = {}
        with open(path, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row["placement"] == "1":
                    point = (int(row["local_bsz"]), float(row["step_time"]))
                    self.points.setdefault(row["gpu_type"], []).append(point)
        for points in self.points.values():
            points.sort()

    def step_time(self, gpu_type: str, local_bsz: int) -> float:
        """Linear interpolation over the local batch (clamped to the profiled range)."""
        points = self.points[self.aliases.get(gpu_type, gpu_type)]
        sizes = [size for size, _ in points]
        i = bisect.bisect_left(sizes, local_bsz)
        if i == 0:
            return points[0][1]
        if i == len(points):
            return points[-1][1]
        (b0, t0), (b1, t1) = points[i - 1], points[i]
        return t0 + (t1 - t0) * (local_bsz - b0) / (b1 - b0)


def sync_time(nodes: int, gpus: int) -> float:
    """A plausible all-reduce time: none on 1 GPU, more with more GPUs and across nodes."""
    if gpus == 1:
        return 0.0
    base = SYNC_BASE_S + SYNC_PER_GPU_S * max(gpus - 2, 0)
    return base * (SYNC_INTER_NODE if nodes > 1 else 1.0)


class ProtocolJob:
    def __init__(
        self,
        paths: StatePaths,
        sia_id: str,
        steps: int | None,
        linger: float,
        *,
        finish_file: Path | None = None,
        ack_delay: float = 0.0,
        profile: SeedProfile | None = None,
        fail_at: int | None = None,
        exit_delay: float = 0.0,
        sweep_s: float = 1.0,
        profiled_doc: Path | None = None,
    ) -> None:
        self.sweep_s = sweep_s
        self.profiled_doc = profiled_doc
        self.paths = paths
        self.sia_id = sia_id
        self.steps = steps
        self.linger = linger
        self.finish_file = finish_file
        self.ack_delay = ack_delay
        self.profile = profile
        self.fail_at = fail_at
        self.exit_delay = exit_delay
        self.checkpoint = paths.job_dir(sia_id) / "counter.json"
        self.events = paths.job_dir(sia_id) / "events.jsonl"
        self.terminated = False
        self.counter = 0

    def log(self, event: str, **fields: object) -> None:
        record = {"event": event, "time": time.time(), "counter": self.counter, **fields}
        with open(self.events, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    @property
    def restart_count(self) -> int:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0"))

    @property
    def own_run(self) -> list[str | int]:
        """This run's identity, [Slurm job id, restart count], as assignments name runs."""
        return [os.environ.get("SLURM_JOB_ID", ""), self.restart_count]

    def save(self) -> None:
        write_json_atomic(self.checkpoint, {"counter": self.counter})

    def run(self) -> int:
        """Run, then leave ``exit-<run>.json`` as sia-launch does: how this run ended."""
        status, cause = self._run()
        run = self.own_run
        if run[0]:
            record = RunExit(self.sia_id, run[0], run[1], cause.value, status, time.time())
            write_document(self.paths.job_dir(self.sia_id) / exit_name(*run), record)
        if self.terminated:
            time.sleep(self.exit_delay)
        return status

    def _run(self) -> tuple[int, ExitCause]:
        signal.signal(signal.SIGUSR1, lambda *_: None)  # a wake-up; the file is the request
        signal.signal(signal.SIGTERM, self._on_term)
        try:
            assignment = read_document(Assignment, self.paths.assignment(self.sia_id))
        except ProtocolError as exc:
            self.log("refused", reason=str(exc))
            return 3, ExitCause.REFUSED
        env = {
            "partition": os.environ.get("SLURM_JOB_PARTITION", ""),
            "nodes": int(os.environ.get("SLURM_JOB_NUM_NODES", "0")),
            "gpus_on_node": int(os.environ.get("SLURM_GPUS_ON_NODE", "0")),
        }
        env["run"] = self.own_run
        wanted = {
            "partition": assignment.partition,
            "nodes": assignment.nodes,
            "gpus_on_node": assignment.gpus_per_node,
            "run": [assignment.slurm_job_id, assignment.slurm_restart_count],
        }
        if self.checkpoint.exists():
            self.counter = json.loads(self.checkpoint.read_text())["counter"]
        self.log(
            "start",
            round=assignment.round_index,
            restarts=assignment.restarts,
            slurm_job_id=os.environ.get("SLURM_JOB_ID", ""),
            slurm_restart_count=self.restart_count,
            node_list=os.environ.get("SLURM_JOB_NODELIST", ""),
            **env,
        )
        if env != wanted:
            self.log("refused", reason=f"allocation {env} != assignment {wanted}")
            return 3, ExitCause.REFUSED
        return self._loop(assignment)

    def _loop(self, assignment: Assignment) -> tuple[int, ExitCause]:
        last_report = 0.0
        launch_round = assignment.round_index
        started = time.time()
        swept = not assignment.profile_sweep
        while not self.terminated:
            if not swept and time.time() - started >= self.sweep_s:
                self._write_profiled(assignment)
                swept = True
            stop = self._stop_request()
            if stop is not None and stop.round_index > launch_round:
                return self._stop(stop)
            assignment = self._adopt(assignment)
            successor = [assignment.slurm_job_id, assignment.slurm_restart_count]
            if successor != self.own_run:
                self.log("superseded", run=successor)
                self._await_successor(successor)
                return 76, ExitCause.SUPERSEDED
            if self.finish_file is not None and self.finish_file.exists():
                self.save()
                self.log("done")
                return 0, ExitCause.COMPLETED
            self.counter += 1
            if self.fail_at is not None and self.counter >= self.fail_at:
                self.log("crash")  # the user's code fails: nothing saved since the checkpoint
                return 1, ExitCause.FAILED
            if self.steps is not None and self.counter >= self.steps:
                self.save()
                self.log("done")
                return 0, ExitCause.COMPLETED
            now = time.time()
            if now - last_report >= REPORT_EVERY_S:
                self._report(assignment, now)
                last_report = now
            time.sleep(TICK_S)
        self.save()  # SIGTERM without a stop request (preemption): keep what we have
        self.log("terminated")
        return 143, ExitCause.TERMINATED

    def _await_successor(self, successor: list[object], wait_s: float = 60.0) -> None:
        """As sia-launch does (sia_slurm.job.runs.await_successor): exit only once the successor
        reports, Slurm terminates this run, or ``wait_s`` passes, so that the exit reaches
        slurmctld when the job runs elsewhere, not while it is still pending."""
        deadline = time.time() + wait_s
        while not self.terminated and time.time() < deadline:
            try:
                report = json.loads(self.paths.metrics(self.sia_id).read_text())
            except (OSError, ValueError):
                report = {}
            if [report.get("slurm_job_id"), report.get("slurm_restart_count")] == successor:
                return
            time.sleep(TICK_S)

    def _stop_request(self) -> StopRequest | None:
        path = self.paths.stop_request(self.sia_id)
        try:
            return read_document(StopRequest, path) if path.exists() else None
        except ProtocolError:
            return None

    def _stop(self, stop: StopRequest) -> tuple[int, ExitCause]:
        self.log("stop-seen", round=stop.round_index)
        deadline = time.time() + self.ack_delay
        while not self.terminated and time.time() < deadline:
            time.sleep(TICK_S)  # a slow checkpoint
        self.save()
        if self.terminated:
            self.log("terminated")
            return 143, ExitCause.TERMINATED
        run = self.own_run
        write_json_atomic(self.paths.ack(self.sia_id, stop.round_index, *run), {})
        self.log("acked", round=stop.round_index)
        deadline = time.time() + self.linger
        while not self.terminated and time.time() < deadline:
            time.sleep(TICK_S)
        self.log("idle-exit", terminated=self.terminated)
        return 0, ExitCause.STOPPED

    def _adopt(self, assignment: Assignment) -> Assignment:
        try:
            latest = read_document(Assignment, self.paths.assignment(self.sia_id))
        except ProtocolError:
            return assignment
        if latest.round_index > assignment.round_index:
            if latest.slurm_job_id == assignment.slurm_job_id and (
                latest.slurm_restart_count == assignment.slurm_restart_count
            ):  # for this run: a rebatch (another run's: the caller exits, superseded)
                self.log(
                    "rebatch",
                    round=latest.round_index,
                    batch_size=latest.batch_size,
                    run=self.own_run,  # who adopted it
                )
            return latest
        return assignment

    def _write_profiled(self, assignment: Assignment) -> None:
        """What a profiling run measured, as the job side writes it (docs/profiling.md)."""
        if self.profiled_doc is not None:
            self.paths.profiled(self.sia_id).write_bytes(self.profiled_doc.read_bytes())
            self.log("profiled", gpu_type=assignment.gpu_type, hostile=True)
            return
        if self.profile is None:
            return
        state_path = self.paths.job_dir(self.sia_id) / "profiled-state.json"
        state = json.loads(state_path.read_text()) if state_path.exists() else {}
        name = self.profile.aliases.get(assignment.gpu_type, assignment.gpu_type)
        largest = self.profile.points[name][-1][0]
        fits = [b for b in assignment.profile_sweep if b <= largest] or [
            assignment.profile_sweep[0]
        ]
        state[name] = [[b, self.profile.step_time(assignment.gpu_type, b)] for b in fits]
        write_json_atomic(state_path, state)
        document = {
            "format": 1,
            "app": "protocol-job",
            "init_batch_size": assignment.batch_size,
            "max_batch_size": max(assignment.batch_size, fits[-1]),
            "min_local_bsz": assignment.profile_sweep[0],
            "max_local_bsz": {t: points[-1][0] for t, points in state.items()},
            "seed": [
                {"gpu_type": t, "local_bsz": b, "placement": "1", "step_time": step,
                 "sync_time": 0.0}
                for t, points in state.items()
                for b, step in points
            ],
        }  # fmt: skip
        write_json_atomic(self.paths.profiled(self.sia_id), document)
        self.log("profiled", gpu_type=assignment.gpu_type, types=sorted(state))

    def _report(self, assignment: Assignment, now: float) -> None:
        """Write a metrics report of ``assignment`` (step times by the GPU count, or the seed
        profile's); its steps follow those times."""
        if self.profile is None:
            step_time = 0.1 + 0.4 / assignment.gpus
            sync = step_time / 10
        else:
            sync = sync_time(assignment.nodes, assignment.gpus)
            step_time = self.profile.step_time(assignment.gpu_type, assignment.local_bsz) + sync
        report = MetricsReport(
            sia_id=self.sia_id,
            time=now,
            gpu_type=assignment.gpu_type,
            nodes=assignment.nodes,
            gpus=assignment.gpus,
            local_bsz=assignment.local_bsz,
            accum_steps=assignment.accum_steps,
            step_time=step_time,
            sync_time=sync,
            grad_sqr=1.0,
            grad_var=2.0,
            # Steps at the pace its step time claims over the time it counted (the controller
            # believes no report whose steps advance far slower than its step time says).
            steps=int(self.counter * TICK_S / iteration_time(step_time, sync, assignment)),
            round_index=assignment.round_index,
            slurm_job_id=os.environ.get("SLURM_JOB_ID", ""),
            slurm_restart_count=self.restart_count,
        )
        write_document(self.paths.metrics(self.sia_id), report)

    def _on_term(self, *_: object) -> None:
        self.terminated = True


def iteration_time(step_time: float, sync_time: float, assignment: Assignment) -> float:
    """Seconds per optimizer step: the extra micro-batches without the all-reduce, then the
    synchronising one (sia_slurm.controller.reports.iteration_time)."""
    return assignment.accum_steps * (step_time - sync_time) + step_time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--sia-id", required=True)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--linger", type=float, default=600.0)
    parser.add_argument("--finish-file", type=Path, default=None)
    parser.add_argument("--ack-delay", type=float, default=0.0)
    parser.add_argument("--fail-at", type=int, default=None, help="exit 1 at this count")
    parser.add_argument("--exit-delay", type=float, default=0.0, help="seconds to exit on TERM")
    parser.add_argument("--seed-profile", type=Path, default=None)
    parser.add_argument("--sweep-s", type=float, default=1.0, help="a profiling sweep's time")
    parser.add_argument("--profiled-doc", type=Path, default=None, help="write this instead")
    parser.add_argument("--profile-type", action="append", default=[], metavar="TYPE=PROFILE")
    args = parser.parse_args()
    aliases = {}
    for item in args.profile_type:
        name, sep, profile_name = item.partition("=")
        if not sep or not name or not profile_name:
            parser.error(f"--profile-type: expected TYPE=PROFILE, got {item!r}")
        aliases[name] = profile_name
    profile = SeedProfile(args.seed_profile, aliases) if args.seed_profile else None
    job = ProtocolJob(
        StatePaths(args.state_dir),
        args.sia_id,
        args.steps,
        args.linger,
        finish_file=args.finish_file,
        ack_delay=args.ack_delay,
        profile=profile,
        fail_at=args.fail_at,
        exit_delay=args.exit_delay,
        sweep_s=args.sweep_s,
        profiled_doc=args.profiled_doc,
    )
    return job.run()


if __name__ == "__main__":
    sys.exit(main())
