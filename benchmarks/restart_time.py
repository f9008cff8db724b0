"""What a restart costs on the dev cluster: grant -> training, for Starts and Moves.

    python benchmarks/restart_time.py [--dir /tmp/sia-restart] [--port-base 19817]
        [--cred-expire 5] [--round-s 6] [--sizes 1,2,4] [--moves 2] [--slurm system]

Why: the simulator charges every (re)start a delay, and ``etc/clusters/dev.yaml`` needs the dev
cluster's own numbers for it (``restart: {start_s, move_s}``): a restart there costs what it costs
(checkpoint, requeue, Slurm's ``cred_expire`` wait, srun, torchrun, importing torch, restore),
whatever the time compression of a run. The paper measured its restart delays on its cluster the
same way: one job at a time, so each number is the cluster's own cost, not queueing.

It runs its own dev cluster (``a100:2x4``), the real controller (Sia, ``--round-s`` rounds),
and for each size N of ``--sizes`` ONE rigid emulated trainer of N a100 GPUs: it waits until the
job trains, then forces ``--moves`` moves by draining the node the job runs on and resuming the
other, then cancels it. Each grant is then measured by ``benchmarks/restart_measure.py`` (grant
-> rank 0's ready line; also used by ``benchmarks/fidelity.py``). Prints per kind and size the
count, mean, median and max seconds, and the two numbers for ``etc/clusters/dev.yaml`` (means
over all sizes); writes ``restart_time.json`` under ``--dir``. ``--slurm 24.11`` (or ``26.05``)
runs that release from its Debian root (``dev-cluster up --slurm``) instead of the host's
Slurm (``benchmarks/dev_release.py``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.dev_release import (  # noqa: E402
    SLURM_RELEASES,
    cluster_env,
    release_problem,
    slurm_bin_dir,
)
from benchmarks.restart_measure import (  # noqa: E402
    GRANT_KINDS,
    Grant,
    GrantDelay,
    Measurement,
    RestartTimeError,
    measure,
    pair_grants,
    read_grants,
    read_ready_lines,
    summarize,
    summarize_by_size,
)
from sia_slurm.state.tree import set_up  # noqa: E402
from sia_slurm_dev import DevClusterSpec, controller_config  # noqa: E402
from sia_slurm_dev.chroot import SYSTEM  # noqa: E402

T = TypeVar("T")

# ----------------------------------------------------------------------------------------------
# The calibration run on the dev cluster

CLUSTER_SPEC = "a100:2x4"
NODES = ("a100-1", "a100-2")
JOB_ENV = "--export=ALL,SIA_METRICS_INTERVAL_S=5,SIA_LINGER_S=120"  # as benchmarks/fidelity.py
# A rigid emulated cifar10 trainer that cannot finish during the calibration (it is cancelled).
TRAINER = [
    "python", "-m", "sia_slurm.job.examples.emulated",
    "--progress", "raw", "--epochs", "1000000", "--dataset-size", "4096",
]  # fmt: skip
GRANT_TIMEOUT_S = 90.0  # from a drain (or a submission) to the controller's grant
READY_TIMEOUT_S = 180.0  # from the grant to the ready line
POLL_S = 0.5


@dataclass(frozen=True)
class CalibrationOptions:
    """The command line, validated."""

    directory: Path
    port_base: int
    cred_expire: int
    round_s: float
    sizes: tuple[int, ...]
    moves: int
    slurm: str = SYSTEM


@dataclass
class Site:
    """The calibration's dev cluster and controller: paths and the environment for commands."""

    directory: Path
    env: dict[str, str]
    controller: subprocess.Popen[str] | None = None

    @property
    def controller_log(self) -> Path:
        return self.directory / "controller.log"

    @property
    def cluster_dir(self) -> Path:
        return self.directory / "cluster"

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def db(self) -> Path:
        return self.state_dir / "sia.db"

    def log(self, size: int) -> Path:
        return self.directory / "out" / f"restart-g{size}.out"

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            list(argv), env=self.env, cwd=REPO, text=True, capture_output=True, check=False
        )
        if check and done.returncode != 0:
            raise RestartTimeError(
                f"{' '.join(argv[:4])} ... exited {done.returncode}: {done.stderr.strip()[-800:]}"
            )
        return done

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run([sys.executable, "-m", "sia_slurm.cli", *args], check=check)


def write_config(directory: Path, round_s: float, bin_dir: Path | None = None) -> Path:
    """The controller's config: Sia on the a100 partition, as fidelity.py's but one type;
    ``bin_dir``: the Slurm commands' directory (:func:`slurm_bin_dir`), None for PATH."""
    path = directory / "sia.yaml"
    text = controller_config(
        DevClusterSpec.parse(CLUSTER_SPEC),
        directory / "state",
        round_seconds=round_s,
        bin_dir=bin_dir,
    )
    path.write_text(text, encoding="utf-8")
    # The state tree as `sia-slurm setup` makes it (the controller here is this account).
    set_up(directory / "state", os.geteuid(), os.getegid())
    return path


def wait_for(
    probe: Callable[[], T | None],
    what: str,
    timeout_s: float,
    diagnose: Callable[[], str] = str,
) -> T:
    """Poll ``probe`` until it returns something, or fail naming ``what`` (and ``diagnose()``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value is not None:
            return value
        if time.monotonic() > deadline:
            raise RestartTimeError(f"timed out after {timeout_s:g} s: {what}\n{diagnose()}".strip())
        time.sleep(POLL_S)


def latest_grant(site: Site, sia_id: str, after: float) -> Grant | None:
    """The job's newest done Start/Move granted after ``after``, if any."""
    if site.controller is not None and site.controller.poll() is not None:
        raise RestartTimeError(
            f"the controller exited with status {site.controller.returncode}\n"
            f"{tail(site.controller_log)}"
        )
    if not site.db.exists():
        return None
    try:
        grants = [g for g in read_grants(site.db) if g.sia_id == sia_id and g.granted > after]
    except RestartTimeError:  # the controller is creating the database right now
        return None
    return grants[-1] if grants else None


def ready_after(site: Site, size: int, grant: Grant) -> GrantDelay | None:
    """The ready line that answers ``grant``, once the job has written it."""
    path = site.log(size)
    if not path.exists():
        return None
    delays, _ = pair_grants([grant], read_ready_lines(path))
    return delays[0] if delays else None


def tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return f"({path} does not exist)"
    text = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    return f"last lines of {path}:\n" + "\n".join(text)


def await_training(site: Site, size: int, sia_id: str, kind: str, after: float) -> Grant:
    """Wait for the controller's ``kind`` grant after ``after``, then for the job to train."""
    grant = wait_for(
        lambda: latest_grant(site, sia_id, after),
        f"the controller to {kind} {sia_id}",
        GRANT_TIMEOUT_S,
        lambda: tail(site.controller_log),
    )
    if grant.kind != kind:
        raise RestartTimeError(f"{sia_id}: expected a {kind}, the controller granted {grant}")
    if grant.gpus != size:
        raise RestartTimeError(f"{sia_id}: rigid job of {size} GPUs granted {grant.gpus}")
    delay = wait_for(
        lambda: ready_after(site, size, grant),
        f"{sia_id} to train after its {kind} of round {grant.round_index}",
        READY_TIMEOUT_S,
        lambda: tail(site.log(size)),
    )
    note = f"{kind} to {','.join(grant.nodes)}: training {delay.seconds:.1f} s after"
    print(f"    {note} the grant (round {grant.round_index})", flush=True)
    return grant


def submit(site: Site, size: int) -> tuple[str, str]:
    """One rigid emulated trainer of ``size`` a100 GPUs; ``(sia id, Slurm job id)``."""
    done = site.run(
        [sys.executable, "-m", "sia_slurm.job.sbatch", "--parsable", "--app", "cifar10",
         "--kind", "rigid", "--num-gpus", str(size), "--gpu-type", "a100",
         "--job-name", f"restart-g{size}", f"--output={site.log(size)}", JOB_ENV,
         "--", *TRAINER],
    )  # fmt: skip
    return done.stderr.strip().rsplit(" ", 1)[-1], done.stdout.strip()


def force_move(site: Site, current: Grant) -> None:
    """Make the job's nodes unusable and the others usable, as an administrator would."""
    others = [node for node in NODES if node not in current.nodes]
    scontrol = ["scontrol", "update"]
    site.run([*scontrol, f"NodeName={','.join(others)}", "State=RESUME"], check=False)
    site.run(
        [*scontrol, f"NodeName={','.join(current.nodes)}", "State=DRAIN", "Reason=calibration"]
    )


def left_queue(site: Site, slurm_id: str) -> bool | None:
    """True once Slurm no longer lists the job (``None`` while it does: keep polling)."""
    listed = site.run(["squeue", "-h", "-j", slurm_id], check=False).stdout.strip()
    return None if listed else True


def finish_job(site: Site, slurm_id: str) -> None:
    """Cancel the job, wait until Slurm has let it go, and make every node usable again."""
    site.run(["scancel", slurm_id], check=False)
    wait_for(lambda: left_queue(site, slurm_id), f"Slurm job {slurm_id} to leave the queue", 120.0)
    site.run(["scontrol", "update", f"NodeName={','.join(NODES)}", "State=RESUME"], check=False)


def calibrate_size(site: Site, size: int, moves: int) -> str:
    """One job of ``size`` GPUs: its start, ``moves`` forced moves, its end; returns its sia id."""
    print(f"  {size} GPU(s):", flush=True)
    submitted = time.time()
    sia_id, slurm_id = submit(site, size)
    try:
        grant = await_training(site, size, sia_id, "start", submitted)
        for _ in range(moves):
            force_move(site, grant)
            grant = await_training(site, size, sia_id, "move", grant.granted)
    finally:
        finish_job(site, slurm_id)
    return sia_id


def prepare_site(options: CalibrationOptions) -> Site:
    """A fresh state and output directory and the controller's config (nothing started)."""
    directory = options.directory
    for stale in (directory / "state", directory / "out"):
        shutil.rmtree(stale, ignore_errors=True)
    (directory / "out").mkdir(parents=True)
    site = Site(directory, {**os.environ, "PYTHONPATH": str(REPO)})
    bin_dir = slurm_bin_dir(site.cluster_dir, options.slurm)
    site.env["SIA_SLURM_CONFIG"] = str(write_config(directory, options.round_s, bin_dir))
    return site


def start_cluster(site: Site, options: CalibrationOptions) -> None:
    """The dev cluster of ``options.slurm``, freshly started (a cluster left in the directory
    would keep its own cred_expire), with its :func:`cluster_env` in the site's environment."""
    site.cli("dev-cluster", "down", "--dir", str(site.cluster_dir), check=False)
    site.cli(
        "dev-cluster", "up", "--dir", str(site.cluster_dir), "--port-base",
        str(options.port_base), "--spec", CLUSTER_SPEC, "--cred-expire", str(options.cred_expire),
        "--slurm", options.slurm,
    )  # fmt: skip
    site.env.update(cluster_env(site.cluster_dir))


def start_controller(site: Site) -> subprocess.Popen[str]:
    """``sia-slurm controller run`` in the background, as fidelity.py runs it."""
    return subprocess.Popen(
        [sys.executable, "-m", "sia_slurm.cli", "controller", "run",
         "--config", site.env["SIA_SLURM_CONFIG"], "--log-file", str(site.controller_log)],
        env=site.env, cwd=REPO, text=True,
    )  # fmt: skip


def stop_site(site: Site, controller: subprocess.Popen[str] | None) -> None:
    """Stop the controller (it finishes its round), then the dev cluster."""
    if controller is not None:
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(timeout=60)
        except subprocess.TimeoutExpired:
            controller.kill()
            controller.wait()
    site.cli("dev-cluster", "down", "--dir", str(site.cluster_dir), check=False)


def calibrate(options: CalibrationOptions) -> tuple[Measurement, dict[str, str]]:
    """The whole calibration; returns the measurement and the jobs (size -> sia id)."""
    site = prepare_site(options)
    controller: subprocess.Popen[str] | None = None
    jobs: dict[str, str] = {}
    try:
        start_cluster(site, options)
        controller = site.controller = start_controller(site)
        for size in options.sizes:
            jobs[str(size)] = calibrate_size(site, size, options.moves)
        logs = {sia_id: site.log(int(size)) for size, sia_id in jobs.items()}
        return measure(site.db, logs), jobs
    finally:
        stop_site(site, controller)


# ----------------------------------------------------------------------------------------------
# The command line


def parse_options(argv: Sequence[str] | None = None) -> CalibrationOptions:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/sia-restart"))
    parser.add_argument("--port-base", type=int, default=19817)
    parser.add_argument("--cred-expire", type=int, default=5, help="Slurm's requeue floor, s")
    parser.add_argument("--round-s", type=float, default=6.0, help="controller round, s")
    parser.add_argument("--sizes", default="1,2,4", help="GPUs per job, comma separated")
    parser.add_argument("--moves", type=int, default=2, help="forced moves per job")
    parser.add_argument(
        "--slurm",
        choices=SLURM_RELEASES,
        default=SYSTEM,
        help="the host's Slurm (system) or a release from its Debian root (dev-cluster up --slurm)",
    )
    args = parser.parse_args(argv)
    try:
        sizes = tuple(int(word) for word in args.sizes.split(","))
    except ValueError:
        parser.error(f"--sizes: expected integers separated by commas, got {args.sizes!r}")
    if not sizes or any(size not in (1, 2, 4) for size in sizes):
        parser.error(f"--sizes: each size must be 1, 2 or 4 (one a100 node), got {args.sizes!r}")
    if args.moves < 0:
        parser.error(f"--moves: expected 0 or more, got {args.moves}")
    if not args.round_s > 0:
        parser.error(f"--round-s: expected a positive number, got {args.round_s}")
    if not 5 <= args.cred_expire <= 3600:
        parser.error(
            f"--cred-expire: expected 5..3600 (dev-cluster up's range), got {args.cred_expire}"
        )
    problem = release_problem(args.dir, args.slurm)
    if problem is not None:
        parser.error(problem)
    return CalibrationOptions(
        args.dir.absolute(),
        args.port_base,
        args.cred_expire,
        args.round_s,
        sizes,
        args.moves,
        args.slurm,
    )


def table(delays: Sequence[GrantDelay]) -> list[str]:
    """Per size and kind, then per kind over all sizes: count, mean, median, max seconds."""
    groups = [(str(gpus), kinds) for gpus, kinds in summarize_by_size(delays).items()]
    rows = [f"{'kind':<6} {'GPUs':>4} {'count':>5} {'mean s':>7} {'median s':>8} {'max s':>6}"]
    for gpus, kinds in [*groups, ("all", summarize(delays))]:
        rows += [
            f"{kind:<6} {gpus:>4} {s['count']:>5.0f} {s['mean_s']:>7.1f} "
            f"{s['median_s']:>8.1f} {s['max_s']:>6.1f}"
            for kind, s in kinds.items()
        ]
    return rows


def report(
    options: CalibrationOptions, measurement: Measurement, jobs: dict[str, str], wall: float
) -> dict[str, Any]:
    """Print the table and the numbers for ``etc/clusters/dev.yaml``; returns the JSON result."""
    delays = measurement.delays
    summary = summarize(delays)
    numbers = {f"{k}_s": round(summary[k]["mean_s"], 1) for k in GRANT_KINDS if k in summary}
    print("\n" + "\n".join(table(delays)))
    print(f"\n{len(measurement.unready)} grant(s) without a ready line left out")
    print("for etc/clusters/dev.yaml:\nrestart:")
    print("".join(f"  {key}: {value}\n" for key, value in numbers.items()))
    print(f"wall time {wall:.0f} s")
    return {
        "options": {**asdict(options), "directory": str(options.directory)},
        "jobs": jobs,
        "delays": [{**asdict(d), "seconds": d.seconds} for d in delays],
        "unready": [asdict(g) for g in measurement.unready],
        "summary": summary,
        "by_size": summarize_by_size(delays),
        "restart": numbers,
        "wall_s": wall,
    }


def main(argv: Sequence[str] | None = None) -> None:
    options = parse_options(argv)
    print(
        f"restart time on the dev cluster ({CLUSTER_SPEC}, Slurm {options.slurm}, "
        f"cred_expire {options.cred_expire} s, "
        f"rounds {options.round_s:g} s): sizes {options.sizes}, {options.moves} move(s) each",
        flush=True,
    )
    started = time.perf_counter()
    try:
        measurement, jobs = calibrate(options)
    except RestartTimeError as exc:
        raise SystemExit(f"restart_time: {exc}") from None
    result = report(options, measurement, jobs, time.perf_counter() - started)
    path = options.directory / "restart_time.json"
    path.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
