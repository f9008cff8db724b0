"""A tiny job that speaks the sia-slurm job protocol, for the backend's tests on real Slurm.

Not a trainer: it counts. It does what a managed job must do (``sia_slurm/protocol.py``):

* reads ``jobs/<id>/assignment.json`` and refuses to run (exit 3) without one or when Slurm's
  allocation disagrees with it (partition, node count, GPUs per node);
* resumes its counter from its checkpoint, then counts every 50 ms, and writes a metrics
  report to ``spool/<id>.json`` every 0.5 s;
* adopts a rewritten assignment (a rebatch) without restarting;
* on ``stop.json`` (polled; SIGUSR1 only wakes it up) checkpoints, writes ``ack-<round>``, and
  idles until Slurm's SIGTERM (the requeue) or ``--linger`` seconds;
* with ``--steps N`` exits 0 once the counter reaches N (training done).

Every event goes as one JSON line to ``jobs/<id>/events.jsonl`` for the tests to read.
Run as the batch script's ``exec python3 protocol_job.py --state-dir D --sia-id ID``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sia_slurm.protocol import (
    Assignment,
    MetricsReport,
    ProtocolError,
    StatePaths,
    StopRequest,
    read_document,
    write_document,
    write_json_atomic,
)

TICK_S = 0.05
REPORT_EVERY_S = 0.5


class ProtocolJob:
    def __init__(self, paths: StatePaths, sia_id: str, steps: int | None, linger: float) -> None:
        self.paths = paths
        self.sia_id = sia_id
        self.steps = steps
        self.linger = linger
        self.checkpoint = paths.job_dir(sia_id) / "counter.json"
        self.events = paths.job_dir(sia_id) / "events.jsonl"
        self.terminated = False
        self.counter = 0

    def log(self, event: str, **fields: object) -> None:
        record = {"event": event, "time": time.time(), "counter": self.counter, **fields}
        with open(self.events, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")

    def save(self) -> None:
        write_json_atomic(self.checkpoint, {"counter": self.counter})

    def run(self) -> int:
        signal.signal(signal.SIGUSR1, lambda *_: None)  # a wake-up; the file is the request
        signal.signal(signal.SIGTERM, self._on_term)
        try:
            assignment = read_document(Assignment, self.paths.assignment(self.sia_id))
        except ProtocolError as exc:
            self.log("refused", reason=str(exc))
            return 3
        env = {
            "partition": os.environ.get("SLURM_JOB_PARTITION", ""),
            "nodes": int(os.environ.get("SLURM_JOB_NUM_NODES", "0")),
            "gpus_on_node": int(os.environ.get("SLURM_GPUS_ON_NODE", "0")),
        }
        wanted = {
            "partition": assignment.partition,
            "nodes": assignment.nodes,
            "gpus_on_node": assignment.gpus_per_node,
        }
        if self.checkpoint.exists():
            self.counter = json.loads(self.checkpoint.read_text())["counter"]
        self.log(
            "start",
            round=assignment.round_index,
            restarts=assignment.restarts,
            slurm_job_id=os.environ.get("SLURM_JOB_ID", ""),
            slurm_restart_count=int(os.environ.get("SLURM_RESTART_COUNT", "0")),
            node_list=os.environ.get("SLURM_JOB_NODELIST", ""),
            **env,
        )
        if env != wanted:
            self.log("refused", reason=f"allocation {env} != assignment {wanted}")
            return 3
        return self._loop(assignment)

    def _loop(self, assignment: Assignment) -> int:
        last_report = 0.0
        while not self.terminated:
            stop = self._stop_request()
            if stop is not None:
                return self._stop(stop)
            assignment = self._adopt(assignment)
            self.counter += 1
            if self.steps is not None and self.counter >= self.steps:
                self.save()
                self.log("done")
                return 0
            now = time.time()
            if now - last_report >= REPORT_EVERY_S:
                self._report(assignment, now)
                last_report = now
            time.sleep(TICK_S)
        self.save()  # SIGTERM without a stop request (preemption): keep what we have
        self.log("terminated")
        return 0

    def _stop_request(self) -> StopRequest | None:
        path = self.paths.stop_request(self.sia_id)
        try:
            return read_document(StopRequest, path) if path.exists() else None
        except ProtocolError:
            return None

    def _stop(self, stop: StopRequest) -> int:
        self.save()
        write_json_atomic(self.paths.ack(self.sia_id, stop.round_index), {})
        self.log("acked", round=stop.round_index)
        deadline = time.time() + self.linger
        while not self.terminated and time.time() < deadline:
            time.sleep(TICK_S)
        self.log("idle-exit", terminated=self.terminated)
        return 0

    def _adopt(self, assignment: Assignment) -> Assignment:
        try:
            latest = read_document(Assignment, self.paths.assignment(self.sia_id))
        except ProtocolError:
            return assignment
        if latest.round_index > assignment.round_index:
            self.log("rebatch", round=latest.round_index, batch_size=latest.batch_size)
            return latest
        return assignment

    def _report(self, assignment: Assignment, now: float) -> None:
        step_time = 0.1 + 0.4 / assignment.gpus
        report = MetricsReport(
            sia_id=self.sia_id,
            time=now,
            gpu_type=assignment.gpu_type,
            nodes=assignment.nodes,
            gpus=assignment.gpus,
            local_bsz=assignment.local_bsz,
            accum_steps=assignment.accum_steps,
            step_time=step_time,
            sync_time=step_time / 10,
            grad_sqr=1.0,
            grad_var=2.0,
            steps=self.counter,
            round_index=assignment.round_index,
        )
        write_document(self.paths.metrics(self.sia_id), report)

    def _on_term(self, *_: object) -> None:
        self.terminated = True


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", type=Path, required=True)
    parser.add_argument("--sia-id", required=True)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--linger", type=float, default=600.0)
    args = parser.parse_args()
    job = ProtocolJob(StatePaths(args.state_dir), args.sia_id, args.steps, args.linger)
    return job.run()


if __name__ == "__main__":
    sys.exit(main())
