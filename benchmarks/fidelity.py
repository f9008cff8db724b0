"""Sim-vs-real fidelity: the phoebe workload on the dev cluster and in the simulator.

    python benchmarks/fidelity.py [--jobs 30] [--scale 10] [--sim-only] [--slurm system]

Both worlds run the same jobs on the same cluster shape (``etc/clusters/dev.yaml`` = the dev
cluster's 2 x 4 a100, 2 x 4 rtx, 2 x 4 t4) with the same controller (Sia), compressed in time by
``--scale`` k so that a run takes minutes (``docs/fidelity.md`` says why each piece is so):

* submissions at ``time / k``, rounds of ``60 / k`` s;
* **simulator**: the paper's world compressed k times: every job makes progress k times faster
  (its app's calibration factor divided by k) and restart delays (true and assumed) are divided
  by k. Everything else (traces, gradient statistics, policy) is unchanged;
* **dev cluster**: each job is an emulated trainer (``sia_slurm/job/examples/emulated.py``) whose
  micro-batch takes the app's profiled time on the assigned GPU type times the app's calibration
  factor (as the simulator slows progress by it), done after ``completion samples / k``
  M0-equivalent samples (the app's epochs x samples per epoch, divided by k), each step weighted
  by the app's true statistical efficiency at its batch and progress, as in the simulator
  (``--progress efficiency``); submitted with ``sia-sbatch`` at its scaled time; the real
  controller (``sia-slurm controller run``) schedules it.

Prints average JCT and makespan of both, in seconds of the compressed run, and the relative
difference; writes ``fidelity.json`` and both dashboards under ``--dir``. The dev cluster runs
the host's Slurm, or with ``--slurm 24.11`` (``26.05``) that release from its Debian root
(``sia-slurm dev-cluster up --slurm``; the controller reaches it through ``slurm.bin_dir``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.dev_release import (  # noqa: E402
    SLURM_RELEASES,
    cluster_env,
    release_problem,
    slurm_bin_dir,
)
from benchmarks.restart_measure import grant_delays, summarize  # noqa: E402
from sia_slurm.report import render_site, report_from_db  # noqa: E402
from sia_slurm.sim.apptruth import AppTruth  # noqa: E402
from sia_slurm.sim.clusterfile import ClusterRestart, load_cluster  # noqa: E402
from sia_slurm.sim.inputs import load_inputs, load_workload_truths  # noqa: E402
from sia_slurm.sim.restart import RestartDelay  # noqa: E402
from sia_slurm.sim.run import SimulationConfig, simulate  # noqa: E402
from sia_slurm.sim.workload import Workload, WorkloadJob, load_workload  # noqa: E402
from sia_slurm.state.tree import set_up  # noqa: E402
from sia_slurm_dev import DevClusterSpec, controller_config  # noqa: E402
from sia_slurm_dev.chroot import SYSTEM  # noqa: E402

PHOEBE = REPO / "data" / "workloads" / "phoebe.csv"
DEV_CLUSTER = REPO / "etc" / "clusters" / "dev.yaml"
DEV_SPEC = "a100:2x4,rtx:2x4,t4:2x4"
MIN_DATASET = 64
# Slurm's requeue floor on the dev cluster: the value benchmarks/restart_time.py calibrated
# etc/clusters/dev.yaml's restart section with (Slurm's default is 120 s, the tests' 30 s).
CRED_EXPIRE_S = 5


def scaled_workload(jobs: int, scale: float) -> Workload:
    """The first ``jobs`` phoebe jobs, submitted ``scale`` times sooner."""
    full = load_workload(PHOEBE)
    rows = tuple(
        dataclasses.replace(job, submit_time=job.submit_time / scale) for job in full.jobs[:jobs]
    )
    return Workload(full.path, rows)


def compressed_truth(truth: AppTruth, scale: float) -> AppTruth:
    """The app's world ``scale`` times faster: progress, and the restart delays (true and
    assumed) of the app. A cluster file's own ``restart`` section, when used, replaces the true
    delay in the simulated cluster; the delay the policy assumes stays the app's / k."""
    restart = RestartDelay(truth.restart.true_s / scale, truth.restart.assumed_s / scale)
    return dataclasses.replace(truth, calibration=truth.calibration / scale, restart=restart)


# ----------------------------------------------------------------------------------------------
# The simulator


def run_sim(
    workload: Workload, scale: float, out: Path, name: str, restart: ClusterRestart | None
) -> dict[str, Any]:
    """Simulate the compressed workload on the dev cluster's shape; ``restart`` is the
    cluster's own restart time (None: each app's delay / k, the paper's world compressed)."""
    inputs = load_inputs(DEV_CLUSTER)
    inputs = dataclasses.replace(
        inputs, cluster=dataclasses.replace(inputs.cluster, restart=restart)
    )
    truths = load_workload_truths([workload], inputs)
    scaled = {app: compressed_truth(t, scale) for app, t in truths.items()}
    # Restart costs reach the policy through the job specs, built from these truths.
    config = SimulationConfig(policy="sia", round_length=60.0 / scale)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / f"rounds-{name}.jsonl", "w", encoding="utf-8") as log:
        result = simulate(workload, inputs, config, truths=scaled, log=log)
    jcts = {job.name: job.jct for job in result.jobs}
    submit = {job.name: job.submit_time for job in result.jobs}
    return {"jct_s": jcts, "submit_s": submit, "stopped": result.stopped}


# ----------------------------------------------------------------------------------------------
# The dev cluster


def job_command(truth: AppTruth, scale: float) -> list[str]:
    """An emulated trainer at the app's pace, each step stretched by its calibration factor
    where the step timer does not see it (as the simulator slows progress, not the reported
    step times: the controllers of both worlds read the same step times), done after the app's
    ``completion samples / k`` M0-equivalent samples with the app's true statistical efficiency
    (``--progress efficiency``): the same target, M0 and statistics as the simulated job, whose
    progress runs k times faster towards ``completion samples``. The toy dataset (one raw epoch
    of it per app epoch / k) only feeds the linear model."""
    samples = truth.completion_samples / scale
    epochs = max(1, round(truth.stats.max_epochs))
    dataset = max(MIN_DATASET, round(samples / epochs))
    return [
        "python", "-m", "sia_slurm.job.examples.emulated",
        "--progress", "efficiency", "--target-samples", f"{samples!r}",
        "--epochs", str(epochs), "--dataset-size", str(dataset),
        "--untimed-scale", f"{truth.calibration:g}",
    ]  # fmt: skip


def write_config(directory: Path, round_s: float, bin_dir: Path | None = None) -> Path:
    """The controller's config for the dev cluster; ``bin_dir``: its Slurm commands (a root's
    release: the client wrappers, ``slurm.bin_dir``), None to search PATH."""
    path = directory / "sia.yaml"
    spec = DevClusterSpec.parse(DEV_SPEC)
    text = controller_config(spec, directory / "state", round_seconds=round_s, bin_dir=bin_dir)
    path.write_text(text, encoding="utf-8")
    # The state tree as `sia-slurm setup` makes it (the controller here is this account).
    set_up(directory / "state", os.geteuid(), os.getegid())
    return path


def cli(*args: str, env: dict[str, str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sia_slurm.cli", *args],
        env=env,
        cwd=REPO,
        text=True,
        capture_output=True,
        check=False,
        **kwargs,
    )


def run_real(
    workload: Workload,
    scale: float,
    directory: Path,
    port_base: int,
    timeout_s: float,
    slurm: str = SYSTEM,
) -> dict[str, Any]:
    """The workload on a dev cluster of Slurm ``slurm`` (``system`` or a root's release)."""
    truths = load_workload_truths([workload], load_inputs(DEV_CLUSTER))
    directory.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cluster_dir = directory / "cluster"
    up = cli(
        "dev-cluster", "up", "--dir", str(cluster_dir), "--port-base", str(port_base),
        "--spec", DEV_SPEC, "--cred-expire", str(CRED_EXPIRE_S), "--slurm", slurm, env=env,
    )  # fmt: skip
    if up.returncode != 0:
        raise SystemExit(f"dev-cluster up (--slurm {slurm}) failed: {up.stderr.strip()}")
    # SLURM_CONF, and a root's client wrappers first on PATH for sia-sbatch's sbatch.
    env.update(cluster_env(cluster_dir))
    controller: subprocess.Popen[str] | None = None
    try:
        config = write_config(directory, 60.0 / scale, slurm_bin_dir(cluster_dir, slurm))
        env["SIA_SLURM_CONFIG"] = str(config)
        log = directory / "controller.log"
        controller = subprocess.Popen(
            [sys.executable, "-m", "sia_slurm.cli", "controller", "run", "--config", str(config),
             "--log-file", str(log)],
            env=env, cwd=REPO, text=True,
        )  # fmt: skip
        started = time.time()
        ids = submit_all(workload, truths, scale, directory, env, started)
        wait_done(directory / "state" / "sia.db", len(ids), started + timeout_s)
        return real_metrics(directory / "state" / "sia.db", ids, started)
    finally:
        if controller is not None:
            controller.send_signal(signal.SIGTERM)
            controller.wait(timeout=120)
        cli("dev-cluster", "down", "--dir", str(directory / "cluster"), env=env)


def sbatch_argv(job: WorkloadJob, truth: AppTruth, scale: float, out_dir: Path) -> list[str]:
    """``sia-sbatch`` for one job: the emulated trainer of :func:`job_command`, and the restart
    cost the simulated policy is told for the app (:func:`compressed_truth`: its assumed cost /
    k), so both controllers weigh restarts alike."""
    restart_cost = compressed_truth(truth, scale).restart.assumed_s
    return [
        sys.executable, "-m", "sia_slurm.job.sbatch", "--app", job.application,
        "--job-name", job.name, f"--output={out_dir / job.name}.out",
        "--restart-cost", f"{restart_cost!r}",
        "--export=ALL,SIA_METRICS_INTERVAL_S=5,SIA_LINGER_S=120",
        "--", *job_command(truth, scale),
    ]  # fmt: skip


def submit_all(
    workload: Workload,
    truths: dict[str, AppTruth],
    scale: float,
    directory: Path,
    env: dict[str, str],
    started: float,
) -> dict[str, str]:
    """Submit each job at its scaled time; returns workload name -> sia id."""
    ids: dict[str, str] = {}
    (directory / "out").mkdir(exist_ok=True)
    for job in workload.jobs:
        delay = started + job.submit_time - time.time()
        if delay > 0:
            time.sleep(delay)
        result = subprocess.run(
            sbatch_argv(job, truths[job.application], scale, directory / "out"),
            env=env, cwd=REPO, text=True, capture_output=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise SystemExit(f"sia-sbatch {job.name}: {result.stderr.strip()}")
        sia_id = result.stderr.strip().rsplit(" ", 1)[-1]
        ids[job.name] = sia_id
        print(f"  {time.time() - started:7.1f} s: submitted {job.name} as {sia_id}", flush=True)
    return ids


def wait_done(db: Path, count: int, deadline: float) -> None:
    while time.time() < deadline:
        time.sleep(15)
        try:
            with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
                phases = [p for (p,) in conn.execute("SELECT phase FROM jobs")]
        except sqlite3.Error:
            continue
        done = sum(p in ("done", "failed", "gone") for p in phases)
        print(f"  {done}/{count} jobs finished", flush=True)
        if done >= count:
            return
    print("  timed out: unfinished jobs are left out of the metrics", flush=True)


def real_metrics(db: Path, ids: dict[str, str], started: float) -> dict[str, Any]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = {
            sia_id: (phase, submit, finish)
            for sia_id, phase, submit, finish in conn.execute(
                "SELECT sia_id, phase, submit_time, finish_time FROM jobs"
            )
        }
    jct: dict[str, float | None] = {}
    submit: dict[str, float] = {}
    for name, sia_id in ids.items():
        phase, submitted, finished = rows.get(sia_id, ("missing", started, None))
        submit[name] = submitted - started
        jct[name] = finished - submitted if phase == "done" and finished else None
    return {"jct_s": jct, "submit_s": submit, "stopped": "", "ids": ids}


def measured_restart(db: Path, out_dir: Path, ids: dict[str, str]) -> ClusterRestart | None:
    """This run's own restart time: the mean grant -> training delay of its Starts and Moves
    (``benchmarks/restart_measure.py``'s exact measurement from the journal and the job logs)."""
    logs = {sia_id: out_dir / f"{name}.out" for name, sia_id in ids.items()}
    summary = summarize(grant_delays(db, logs))
    print("dev cluster, this run: " + ", ".join(
        f"{kind} {s['count']:.0f} x {s['mean_s']:.1f} s mean ({s['median_s']:.1f} median)"
        for kind, s in summary.items()
    ))  # fmt: skip
    if "start" not in summary:
        return None
    start = summary["start"]["mean_s"]
    return ClusterRestart(start, summary.get("move", {}).get("mean_s", start))


# ----------------------------------------------------------------------------------------------
# Comparison


def metrics(run: dict[str, Any]) -> dict[str, float]:
    done = {n: j for n, j in run["jct_s"].items() if j is not None}
    if not done:
        return {"completed": 0, "avg_jct_s": float("nan"), "makespan_s": float("nan")}
    ends = [run["submit_s"][n] + j for n, j in done.items()]
    return {
        "completed": len(done),
        "avg_jct_s": statistics.fmean(done.values()),
        "makespan_s": max(ends) - min(run["submit_s"].values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=30, help="first N phoebe jobs (30: all)")
    parser.add_argument("--scale", type=float, default=10.0, help="time compression k")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/sia-fidelity"))
    parser.add_argument("--port-base", type=int, default=21817)
    parser.add_argument("--timeout", type=float, default=5400.0, help="real run limit, s")
    parser.add_argument("--sim-only", action="store_true", help="skip the dev-cluster run")
    parser.add_argument(
        "--slurm",
        choices=SLURM_RELEASES,
        default=SYSTEM,
        help="the dev cluster's Slurm: the host's (system) or a release from its Debian root",
    )
    parser.add_argument(
        "--reuse-real",
        action="store_true",
        help="take the dev-cluster results of the last run in --dir instead of running again",
    )
    args = parser.parse_args()
    if args.jobs < 1 or not args.scale > 0:
        parser.error("--jobs must be >= 1 and --scale > 0")
    problem = release_problem(args.dir, args.slurm)
    if problem is not None:
        parser.error(problem)
    workload = scaled_workload(args.jobs, args.scale)
    print(
        f"phoebe: {len(workload)} jobs, time compressed {args.scale:g}x, "
        f"rounds {60 / args.scale:g} s, cluster {DEV_CLUSTER.name}, Slurm {args.slurm}"
    )
    t0 = time.perf_counter()
    calibrated = load_cluster(DEV_CLUSTER).restart
    rows: list[tuple[str, dict[str, float]]] = []
    results: dict[str, Any] = {"jobs": len(workload), "scale": args.scale, "slurm": args.slurm}
    if calibrated is not None:
        results["sim"] = run_sim(workload, args.scale, args.dir / "sim", "sim", calibrated)
        rows.append(("simulator", metrics(results["sim"])))
    results["sim_app_delays"] = run_sim(workload, args.scale, args.dir / "sim", "sim-app", None)
    rows.append(("sim, app/k", metrics(results["sim_app_delays"])))
    print(f"simulator: done in {time.perf_counter() - t0:.0f} s wall")
    real_dir = args.dir / "real"
    if args.reuse_real:
        previous = json.loads((args.dir / "fidelity.json").read_text())
        results["real"] = previous["real"]
    elif not args.sim_only:
        t0 = time.perf_counter()
        results["real"] = run_real(
            workload, args.scale, real_dir, args.port_base, args.timeout, args.slurm
        )
        print(f"dev cluster: done in {time.perf_counter() - t0:.0f} s wall")
    if "real" in results:
        rows.insert(0, ("dev cluster", metrics(results["real"])))
        db = real_dir / "state" / "sia.db"
        render_site(report_from_db(db, title="fidelity: dev cluster"), args.dir / "site-real")
        own = measured_restart(db, real_dir / "out", results["real"]["ids"])
        if own is not None:
            results["measured_restart"] = dataclasses.asdict(own)
            again = run_sim(workload, args.scale, args.dir / "sim", "sim-own-restart", own)
            results["sim_own_restart"] = again
            rows.append(("sim, run's", metrics(again)))
    print(f"\n{'world':<12} {'done':>5} {'avg JCT (s)':>12} {'makespan (s)':>13}")
    for name, m in rows:
        print(f"{name:<12} {m['completed']:>5} {m['avg_jct_s']:>12.1f} {m['makespan_s']:>13.1f}")
    if rows[0][0] == "dev cluster":
        real = rows[0][1]
        for name, sim_metrics in rows[1:]:
            for key, label in (("avg_jct_s", "avg JCT"), ("makespan_s", "makespan")):
                diff = (real[key] - sim_metrics[key]) / sim_metrics[key] * 100
                print(f"{label}: dev cluster vs {name} {diff:+.1f}%")
                results[f"{key}_diff_pct_vs_{name}"] = diff
    results["metrics"] = dict(rows)
    (args.dir / "fidelity.json").write_text(json.dumps(results, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
