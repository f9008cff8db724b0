"""What profiling costs, and how well its profile predicts, with a real PyTorch job on the dev
cluster (issue 34; docs/profiling.md, "Measured").

One dev cluster (a100, rtx, t4: 2 nodes x 4 fake GPUs each; the TaskProlog gives the types their
speed factors and emulated memory) and the real controller (``sia-slurm controller run``, rounds
of ``--round-s``). The job is the transformer example (``sia_slurm/job/examples/transformer.py``,
ElasticTrainer, gloo) under one app name:

1. **overhead**: the job alone and held at one GPU (the dev cluster's GPUs share this
   machine's cores: growth would confound the comparison), first with no profile anywhere (it
   is profiled, then scheduled), then again with the profile the first run left (scheduled at
   once): the JCTs, the time the first spent profiling and the restarts, side by side;
2. **accuracy**: pinned jobs of the app at 1 and 2 GPUs on every type, one after another; each
   job's reports (the ones its model was fed, from the state database) give its measured step
   time and throughput, set against the prediction of the model built from the kept profile
   alone (before any report), and at 2 GPUs also against Sia's bootstrap: the same model fed
   the other types' pinned jobs' reports, so that the type's 2-GPU throughput is projected
   from another type's measured scaling (reference section 3);
3. **the machine's noise**, first: the app's own step (:func:`machine_noise`: the
   transformer's forward, backward and optimizer step at a batch of 64, in this process, the
   cluster idle) timed for a minute, and the spread of its mean over windows of 0.25 s (what
   the sweep times a batch for) to 30 s. On a shared VM it bounds what any profile can
   predict: the same step's 0.25 s means spread by 18% (coefficient of variation), its 10 s
   means by 6% (docs/profiling.md, "Accuracy"). Over minutes the machine also drifts: the same
   step timed for 5 s around the profiled run and around each pinned run (:func:`machine_speed`)
   gives each run's drift, and the accuracy table's "steady" columns take it out (what the run
   would have measured at the profile's moment), leaving the model's own error.

Run as root (it starts the daemons): ``python -m benchmarks.profiling_live`` (about 20 minutes on
2 cores). Prints three tables.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from sia_slurm.cli.report_cmd import gpu_history
from sia_slurm.controller import EstimatorFactory
from sia_slurm.controller.reports import iteration_time
from sia_slurm.core import Configuration
from sia_slurm.job.examples.transformer import VOCAB, TinyLanguageModel, make_dataset
from sia_slurm.protocol import JobSpec, MetricsReport, StatePaths, from_json
from sia_slurm.protocol.observation import Observation
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.report import report_from_db
from sia_slurm.state.profiles import ProfileStore
from sia_slurm.state.tree import set_up
from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec, controller_config
from sia_slurm_dev.controller_config import DEFAULT_PROFILES
from sia_slurm_dev.speed import emulation

APP = "bench-lm"
TYPES = ("a100", "rtx", "t4")


class Bench:
    """The dev cluster, the controller's config and state, and the job submissions."""

    def __init__(self, root: Path, port_base: int, round_s: float) -> None:
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        self.root = root
        self.spec = DevClusterSpec.parse(DEFAULT_SPEC)
        self.cluster = DevCluster(root / "cluster", port_base=port_base)
        self.paths = StatePaths(root / "state")
        self.config = root / "sia.yaml"
        self.round_s = round_s
        self.seen: dict[str, dict[float, MetricsReport]] = {}

    def up(self) -> None:
        self.cluster.up(self.spec)
        set_up(self.paths.state_dir, os.getuid(), os.getgid())
        self.config.write_text(
            controller_config(self.spec, self.paths.state_dir, round_seconds=self.round_s)
        )

    def env(self) -> dict[str, str]:
        return {**os.environ, **self.cluster.env}

    def submit(self, name: str, *options: str, steps: int, batch: int) -> str:
        """A transformer job of the app; its sia id."""
        argv = [
            sys.executable, "-m", "sia_slurm.job.sbatch", "--config", str(self.config),
            "--app", APP, "--batch-size", str(batch), "--max-batch-size", str(8 * batch),
            "--job-name", name, f"--output={self.root / (name + '.out')}",
            "--export=ALL,SIA_METRICS_INTERVAL_S=1", *options, "--",
            sys.executable, "-m", "sia_slurm.job.examples.transformer",
            "--epochs", "100000", "--max-steps", str(steps), "--dataset-size", "2048",
        ]  # fmt: skip
        done = subprocess.run(argv, env=self.env(), capture_output=True, text=True, check=True)
        return done.stderr.strip().split()[-1]  # "sia-sbatch: sia job <id>"

    def run_until_done(self, sia_ids: list[str], timeout_s: float = 900.0) -> None:
        """The controller, as a service, until every job of ``sia_ids`` has finished."""
        log = self.root / "controller.jsonl"
        controller = subprocess.Popen(
            [sys.executable, "-m", "sia_slurm.cli", "controller", "run", "--config",
             str(self.config), "--log-file", str(log)],
            env=self.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + timeout_s
            while self._unfinished(sia_ids):
                for sia_id in sia_ids:  # a finished job's reports leave the database with it
                    for report in self._stored_reports(sia_id):
                        self.seen.setdefault(sia_id, {})[report.time] = report
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not finished after {timeout_s:.0f} s: {sia_ids}")
                time.sleep(2)
        finally:
            controller.send_signal(signal.SIGTERM)
            controller.wait(timeout=120)

    def _unfinished(self, sia_ids: list[str]) -> list[str]:
        db = self.paths.state_dir / "sia.db"
        if not db.exists():
            return sia_ids
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            done = {
                row[0]
                for row in conn.execute("SELECT sia_id, phase FROM jobs")
                if row[1] in ("done", "failed", "gone")
            }
        return [s for s in sia_ids if s not in done]

    def rows(self) -> dict[str, Any]:
        return {row.id: row for row in report_from_db(self.paths.state_dir / "sia.db").jobs}

    def reports(self, sia_id: str) -> list[MetricsReport]:
        """The reports the controller's model was fed for the job while it ran, oldest first."""
        return [report for _, report in sorted(self.seen.get(sia_id, {}).items())]

    def _stored_reports(self, sia_id: str) -> list[MetricsReport]:
        db = self.paths.state_dir / "sia.db"
        if not db.exists():
            return []
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            rows = conn.execute("SELECT report FROM reports WHERE sia_id = ?", (sia_id,))
            return [from_json(MetricsReport, json.loads(r[0]), "reports") for r in rows]


def app_steps(seconds: float, batch: int = 64) -> list[tuple[float, float]]:
    """The app's step (the transformer example's forward, backward and AdamW step at
    ``batch``, one thread) back to back for ``seconds`` after ten warm-up steps, in this
    process: each step's (start, seconds)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    inputs, targets = make_dataset(batch, 0).tensors
    model = TinyLanguageModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    steps: list[tuple[float, float]] = []
    end = time.perf_counter() + seconds
    for index in itertools.count():
        start = time.perf_counter()
        if start > end:
            break
        loss = F.cross_entropy(model(inputs).reshape(-1, VOCAB), targets.reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if index >= 10:
            steps.append((start, time.perf_counter() - start))
    return steps


def machine_noise(seconds: float = 60.0, batch: int = 64) -> list[list[str]]:
    """How steady this machine runs the app's step: :func:`app_steps` for ``seconds``, and per
    window length the spread of the windows' mean step times."""
    return noise_rows(app_steps(seconds, batch), (0.25, 1.0, 2.0, 10.0, 30.0))


def machine_speed(seconds: float = 5.0) -> float:
    """The app's mean step (s) on the idle cluster now: :func:`app_steps` for ``seconds``.

    Timed right before and after a run, it tells how much faster or slower the machine ran
    then than when the profile was measured: on this shared VM the same step's time drifts by
    tens of percent over minutes (docs/profiling.md, "Accuracy"), which no profile can know."""
    return statistics.mean(took for _, took in app_steps(seconds))


def noise_rows(steps: list[tuple[float, float]], windows: tuple[float, ...]) -> list[list[str]]:
    """Per window length: how many whole windows, their mean step's coefficient of variation,
    its smallest and largest (ms); windows of fewer than 4 steps, and the last, are left out."""
    first = steps[0][0]
    rows = []
    for window in windows:
        buckets: dict[int, list[float]] = {}
        for start, took in steps:
            buckets.setdefault(int((start - first) / window), []).append(took)
        means = [statistics.mean(v) for _, v in sorted(buckets.items())[:-1] if len(v) >= 4]
        if len(means) < 2:
            continue
        spread = statistics.pstdev(means) / statistics.mean(means)
        rows.append([
            f"{window:g}", str(len(means)), f"{spread:.1%}",
            f"{min(means) * 1000:.2f}", f"{max(means) * 1000:.2f}",
        ])  # fmt: skip
    return rows


def overhead(bench: Bench, steps: int, batch: int) -> tuple[list[list[str]], float]:
    """The job alone, profiled then from the kept profile, each held at one GPU: the dev
    cluster's GPUs share this machine's cores, so a job grown to several is not faster, and
    growth would confound what profiling costs. Also the machine's speed
    (:func:`machine_speed`) while the profile was measured: the mean of before and after the
    profiled run."""
    lines = []
    profiling_speed = 0.0
    for mode in ("profiled", "kept profile"):
        before = machine_speed() if mode == "profiled" else None
        sia_id = bench.submit(f"lm-{mode.split()[0]}", "--max-gpus", "1", steps=steps, batch=batch)
        bench.run_until_done([sia_id])
        if before is not None:
            profiling_speed = (before + machine_speed()) / 2
        row = bench.rows()[sia_id]
        profiling = "-" if row.profiling_s is None else f"{row.profiling_s:.0f}"
        jct = f"{row.jct_s:.0f}" if row.jct_s is not None else "-"
        lines.append([mode, jct, profiling, str(row.restarts), gpu_history(row)])
    return lines, profiling_speed


Runs = dict[tuple[str, int], list[MetricsReport]]
# Per (type, GPUs): the machine's speed during the run over its speed while the profile was
# measured (:func:`machine_speed`'s mean steps; above 1: the machine ran slower).
Drift = dict[tuple[str, int], float]


def pinned_runs(bench: Bench, steps: int, batch: int, profiling_speed: float) -> tuple[Runs, Drift]:
    """A pinned job of the app at 1 and 2 GPUs of every type, one after another: per (type,
    GPUs), its reports (the first, the warm-up's, off), and the machine's drift since the
    profile (:func:`machine_speed` before and after the run, over ``profiling_speed``).

    ``steps`` are the slowest type's; a type of speed factor ``f`` runs ``steps * f /
    f_slowest`` of them, so that every run lasts about as long and writes several reports (at 3,000
    steps of a few milliseconds, a100's 1-GPU run ended after the warm-up's report alone)."""
    factors = {row.gpu_type: row.speed or 1.0 for row in emulation(TYPES)}
    slowest = min(factors.values())
    runs: Runs = {}
    drift: Drift = {}
    for gpu_type in TYPES:
        type_steps = round(steps * factors[gpu_type] / slowest)
        for gpus in (1, 2):
            before = machine_speed()
            sia_id = bench.submit(
                f"lm-{gpu_type}-{gpus}", "--kind", "pinned", "--gpu-type", gpu_type,
                "--num-gpus", str(gpus), "--min-gpus", str(gpus), "--max-gpus", str(gpus),
                steps=type_steps, batch=batch,
            )  # fmt: skip
            bench.run_until_done([sia_id])
            runs[(gpu_type, gpus)] = [r for r in bench.reports(sia_id) if r.gpus == gpus][1:]
            drift[(gpu_type, gpus)] = (before + machine_speed()) / 2 / profiling_speed
    return runs, drift


def accuracy(
    factory: EstimatorFactory,
    spec: JobSpec,
    kept: Mapping[str, Any],
    runs: Runs,
    drift: Drift | None = None,
) -> list[list[str]]:
    """Each run's measured step against the kept profile's prediction alone and, at 2 GPUs,
    against Sia's bootstrap: the model fed the other types' runs' reports (1 and 2 GPUs) as
    the controller would, so that this type's 2-GPU throughput is projected from another
    type's measured scaling (reference section 3), not taken as linear.

    With ``drift``, both again with the machine's drift taken out: every run's times divided
    by its drift (what it would have measured at the profile's moment), so that what is left
    is the model's error, not the machine's."""
    lines = []
    for (gpu_type, gpus), reports in runs.items():
        if not reports:
            lines.append([gpu_type, str(gpus), "-", "-", "no report", "-", "-", "-", "-", "-"])
            continue
        config = Configuration(gpu_type, 1, gpus)
        row = factory(spec, kept).evaluate([config], fixed_batch=True)  # the profile alone
        measured_step = statistics.median(iteration_time(r) for r in reports)
        samples = reports[0].gpus * reports[0].local_bsz * (reports[0].accum_steps + 1)
        measured = samples / measured_step
        predicted = float(row.throughput[0])
        predicted_step = float(row.batch_size[0]) / predicted
        bootstrapped = shown_drift = steady_error = steady_bootstrapped = "-"
        if gpus > 1:
            projected = bootstrap(factory, spec, kept, runs, gpu_type, config)
            bootstrapped = f"{projected / measured - 1:+.1%}"
        if drift is not None:
            shown_drift = f"{drift[(gpu_type, gpus)]:.3f}"
            steady = measured * drift[(gpu_type, gpus)]  # at the profile's moment
            steady_error = f"{predicted / steady - 1:+.1%}"
            if gpus > 1:
                projected = bootstrap(factory, spec, kept, runs, gpu_type, config, drift)
                steady_bootstrapped = f"{projected / steady - 1:+.1%}"
        lines.append([
            gpu_type, str(gpus), f"{reports[0].local_bsz}x{reports[0].accum_steps + 1}",
            f"{predicted_step * 1000:.1f} / {measured_step * 1000:.1f}",
            f"{predicted:.0f} / {measured:.0f}", f"{predicted / measured - 1:+.1%}",
            bootstrapped, shown_drift, steady_error, steady_bootstrapped,
        ])  # fmt: skip
    return lines


def bootstrap(
    factory: EstimatorFactory,
    spec: JobSpec,
    kept: Mapping[str, Any],
    runs: Runs,
    gpu_type: str,
    config: Configuration,
    drift: Drift | None = None,
) -> float:
    """``config``'s throughput from the kept profile and the other types' runs' reports (each
    divided by its run's drift, with ``drift``)."""
    model = factory(spec, kept)
    for key, others in runs.items():
        if key[0] != gpu_type:
            scale = 1.0 if drift is None else drift[key]
            model.observe_many(key[0], (observation(r, scale) for r in others))
    return float(model.evaluate([config], fixed_batch=True).throughput[0])


def observation(report: MetricsReport, scale: float = 1.0) -> Observation:
    """A report as the controller feeds it to the job's model (``JobState.ingest``), its
    times divided by ``scale``."""
    return Observation(
        nodes=report.nodes, gpus=report.gpus, local_bsz=report.local_bsz,
        step_time=report.step_time / scale, sync_time=report.sync_time / scale,
        accum_steps=report.accum_steps,
    )  # fmt: skip


def table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in [header, *rows]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/sia-profiling-bench"))
    parser.add_argument("--port-base", type=int, default=26817)
    parser.add_argument("--round-s", type=float, default=15.0)
    parser.add_argument("--steps", type=int, default=3000, help="the overhead runs' steps")
    parser.add_argument(
        "--accuracy-steps", type=int, default=3000, help="each pinned job's, on the slowest type"
    )
    parser.add_argument("--batch", type=int, default=64, help="M0 (the largest batch: 8x)")
    parser.add_argument("--no-accuracy", action="store_true", help="the overhead part only")
    args = parser.parse_args()
    print("this machine's noise (the app's step back to back for a minute, before the cluster):")
    print(table(["window s", "windows", "spread (cv)", "min ms", "max ms"], machine_noise()))
    bench = Bench(args.dir, args.port_base, args.round_s)
    bench.up()
    try:
        print(f"dev cluster {DEFAULT_SPEC}, rounds of {args.round_s:g} s, M0 {args.batch}")
        print("\noverhead (seconds; the same job alone, profiled vs from the kept profile):")
        rows, profiling_speed = overhead(bench, args.steps, args.batch)
        print(table(["run", "JCT", "profiling", "restarts", "GPU type:count"], rows))
        if args.no_accuracy:
            return
        kept = ProfileStore(bench.paths.state_dir).get("", APP)
        if kept is None:
            raise RuntimeError("the profiled run kept no profile")
        factory = EstimatorFactory(load_profiles(), dict(DEFAULT_PROFILES))
        spec = JobSpec("x", APP, init_batch_size=args.batch, max_batch_size=8 * args.batch)
        runs, drift = pinned_runs(bench, args.accuracy_steps, args.batch, profiling_speed)
        print("\naccuracy (pinned jobs; the kept profile's prediction / the measured median;")
        print("bootstrapped: the error once the other types' pinned jobs are observed;")
        print("steady: both with the machine's drift since the profile taken out, the drift")
        print("being the app's step timed on the idle cluster around each run over around the")
        print(f"profiled run, {profiling_speed * 1000:.2f} ms):")
        print(table(["type", "GPUs", "local x steps", "step ms (pred / meas)",
                     "samples/s (pred / meas)", "error", "bootstrapped", "drift",
                     "error, steady", "bootstrapped, steady"],
                    accuracy(factory, spec, kept, runs, drift)))  # fmt: skip
    finally:
        bench.cluster.down()


if __name__ == "__main__":
    main()
