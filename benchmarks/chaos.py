"""The chaos soak of issue 18: jobs on the dev cluster while everything around them dies.

    python benchmarks/chaos.py [--minutes 20] [--jobs 30] [--real-jobs 2] [--seed 18]
        [--scale 4] [--faults controller_kill=10,...] [--dir /tmp/chaos-dev] [--port-base 21817]
        [--out docs/results/chaos-....json]

Why: the unit and e2e tests kill one thing at a time at chosen points; production sees faults
at any moment, on top of each other, while many jobs start, move and stop. This runs the real
thing for ``--minutes``: a dev cluster (``a100:2x4,rtx:2x4,t4:2x4``) whose slurmctld runs as
the service account ``siasvc``; the controller loop as ``siasvc`` under a supervisor that
restarts it after a SIGKILL, as systemd would (:mod:`sia_slurm_dev.supervisor`);
``--jobs`` emulated trainers of the paper's apps and ``--real-jobs`` real PyTorch jobs
(``sia_slurm/job/examples``) submitted with ``sia-sbatch`` by the ordinary user ``siaalice`` at
seeded random times; and the faults of ``--faults`` (default: the issue's) at seeded random
times (:mod:`benchmarks.chaos_plan`), carried out by :mod:`benchmarks.chaos_site`:

* ``controller_kill``: SIGKILL the controller; ``slurmctld_restart``: SIGKILL slurmctld, start it
  a few seconds later without ``-c``; ``slurmd_kill``: SIGKILL the slurmd of a node that runs a
  managed job (odd ones with its job processes, as a dead node; even ones alone, leaving its
  run behind), start it 45 s later; ``drain``: drain such a node, resume it 60 s later;
* ``job_kill``: SIGKILL the rank-0 worker of a running emulated job submitted with
  ``--max-failures 0``: the job's own failure, so it must end FAILED (and is reported so);
* ``checkpoint_kill``: from its time on, watch (inotify) the checkpoint directories of the
  emulated jobs submitted with ``--max-failures 1`` and SIGKILL rank 0 the moment it creates a
  checkpoint's data file (at a stop, a termination or the completion); if the digest exists a
  second later the kill came too late and it waits for the next write. The job must resume
  from the previous complete checkpoint (``--max-failures 1`` lets it run again once).

Then it waits until the controller has finished every job and judges each from the evidence
(:mod:`benchmarks.chaos_evidence`: the controller's database, job logs, rank-0 sample logs, exit
records, and ``squeue --json --states=all`` polled every 10 s while Slurm remembers the jobs).
Prints the issue's table; writes ``chaos.json`` under ``--dir`` and, with ``--out``, there too.
``--scale`` k compresses time as ``benchmarks/fidelity.py``'s does: rounds of 60/k s, and the
jobs' datasets k/4 times smaller than the demo's (k = 4 is the demo's 15 s rounds). Run as root
(daemons, accounts); the accounts are the tests' (``tests/accounts.py``).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks.chaos_evidence import (  # noqa: E402
    OWN_FAULT_CAUSES,
    JobEvidence,
    read_exit_records,
    read_job_log,
    read_sample_log,
    read_training_records,
    table,
    totals,
    unlogged_completions,
)
from benchmarks.chaos_plan import (  # noqa: E402
    FAULT_KINDS,
    ISSUE_FAULTS,
    ChaosError,
    JobPlan,
    fault_schedule,
    job_plans,
    parse_fault_counts,
)
from benchmarks.chaos_site import SERVICE, CheckpointKiller, Injector, Site  # noqa: E402
from sia_slurm_dev import DevCluster  # noqa: E402

FIRST_FAULT_S = 60.0  # the first jobs run by then
FINISHED = ("done", "failed", "gone")
POLL_S = 10.0
UNSEEN_S = 300.0  # a submitted job the controller has not seen by then: Slurm lost it


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--minutes", type=float, default=20.0, help="the fault window")
    parser.add_argument("--jobs", type=int, default=30, help="emulated jobs")
    parser.add_argument("--real-jobs", type=int, default=2, choices=(0, 1, 2))
    parser.add_argument("--seed", type=int, default=18)
    parser.add_argument("--scale", type=float, default=4.0, help="time compression k")
    parser.add_argument(
        "--faults",
        default=",".join(f"{k}={n}" for k, n in ISSUE_FAULTS.items()),
        help=f"kind=N,... (kinds: {', '.join(FAULT_KINDS)}; default: the issue's)",
    )
    parser.add_argument("--cred-expire", type=int, default=10, help="Slurm's requeue floor, s")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/chaos-dev"))
    parser.add_argument("--port-base", type=int, default=21817)
    parser.add_argument("--timeout", type=float, default=None, help="s (default: window + 30 min)")
    parser.add_argument("--out", type=Path, help="also write the JSON result here")
    parser.add_argument("--keep", action="store_true", help="leave the dev cluster up")
    args = parser.parse_args(argv)
    if args.jobs < 1 or not args.scale > 0 or not args.minutes > 0:
        parser.error("--jobs must be >= 1, --scale and --minutes > 0")
    try:
        args.fault_counts = parse_fault_counts(args.faults)
    except ChaosError as exc:
        parser.error(str(exc))
    args.dir = args.dir.absolute()
    return args


def submit_all(site: Site, plans: list[JobPlan], killer: CheckpointKiller, started: float) -> None:
    """Submit each job at its time; the retry jobs become the checkpoint kill's candidates."""
    for plan in sorted(plans, key=lambda p: p.submit_at_s):
        if site.stopping.wait(max(0.0, started + plan.submit_at_s - time.time())):
            return
        sia_id = site.submit(plan)
        if plan.max_failures:
            killer.candidates[sia_id] = plan.name
        print(f"  {time.time() - started:7.1f} s: submitted {plan.name} as {sia_id}", flush=True)


def watch_slurm(site: Site) -> None:
    while not site.stopping.is_set():
        site.poll_slurm()
        site.stopping.wait(POLL_S)


def wait_finished(
    site: Site, plans: list[JobPlan], injector: Injector, window_end: float, deadline: float
) -> bool:
    """Until the fault window is over, every fault has been injected (or found no target),
    every killed slurmd and drained node is back and every job is finished in the
    controller's database; False at the deadline (or if the controller failed)."""
    last = 0.0
    while time.time() < deadline:
        phases = site.phases()
        finished = sum(
            phases[sia][0] in FINISHED if sia in phases else unseen(site, name)
            for name, sia in site.ids.items()
        )
        supervisor = site.supervisor
        if supervisor is not None and supervisor.failure:
            print(f"  the controller failed: {supervisor.failure}", flush=True)
            return False
        if finished == len(plans) and injector.idle and time.time() >= window_end:
            return True
        if time.time() - last > 60:
            last = time.time()
            print(f"  {time.strftime('%T')}: {finished}/{len(plans)} jobs finished, "
                  f"{len(injector.done)} faults done", flush=True)  # fmt: skip
        time.sleep(5)
    return False


def unseen(site: Site, name: str) -> bool:
    """Whether the controller has not heard of a submitted job :data:`UNSEEN_S` after its
    submission: Slurm lost it (seen: slurmctld killed within seconds of accepting it), and it
    would never finish. Such a job is judged ``missing``: lost."""
    return time.time() - site.submitted[name][1] > UNSEEN_S


def gather(site: Site, plans: list[JobPlan]) -> list[JobEvidence]:
    """Each job's evidence, read once everything has finished."""
    phases = site.phases()
    found = []
    for plan in plans:
        sia_id = site.ids.get(plan.name, "")
        phase, message = phases.get(sia_id, ("not submitted" if not sia_id else "missing", ""))
        states = tuple(
            f"{job_id}:{job['state']}"
            for job_id, job in site.slurm.items()
            if job["sia_id"] == sia_id
        )
        samples = read_sample_log(site.samples(plan.name) / "samples-r0.jsonl")
        exits = tuple(read_exit_records(site.paths.job_dir(sia_id))) if sia_id else ()
        events = read_job_log(site.log(plan.name))
        if sia_id:
            records = read_training_records(site.paths.job_dir(sia_id))
            events += unlogged_completions(records, events)
        found.append(
            JobEvidence(
                plan.name, sia_id, phase, message, tuple(events),
                samples, exits, states,
            )
        )  # fmt: skip
    return found


def checkpoint_kill_check(
    killer: CheckpointKiller, jobs: list[JobEvidence]
) -> dict[str, Any] | None:
    """Did the job whose checkpoint write was killed resume from the previous complete one?"""
    if killer.result is None or "sia_id" not in killer.result:
        return killer.result
    result = dict(killer.result)
    job = next(j for j in jobs if j.sia_id == result["sia_id"])
    after = [r for r in job.restores if r.time > result["time"]]
    result["verdict"] = job.verdict
    result["restore_skipped_it"] = any(
        e.kind == "skipped" and e.step == result["step"] and e.time > result["time"]
        for e in job.events
    )
    if after:
        first = after[0]
        result["next_restore"] = {
            "restored": first.restored,
            "last_checkpoint": first.last_checkpoint,
        }
        result["resumed_from_previous"] = first.restored < result["step"] and first.restored == (
            first.last_checkpoint or 0
        )
    return result


def unexpected_own_failures(
    jobs: list[JobEvidence], targets: set[str], killer: CheckpointKiller
) -> list[dict[str, Any]]:
    """Runs whose exit record blames the job although no fault of the job's was injected there
    (a job-kill target's first own failure and the checkpoint kill's are expected). Under
    ``--max-failures 0`` such a run ends its job FAILED: a job lost to something else."""
    expected = {sia_id: 1 for sia_id in targets}
    if killer.result is not None and "sia_id" in killer.result:
        expected[killer.result["sia_id"]] = expected.get(killer.result["sia_id"], 0) + 1
    found = []
    for job in jobs:
        own = [r for r in job.exits if r.get("cause") in OWN_FAULT_CAUSES]
        for record in own[expected.get(job.sia_id, 0) :]:
            found.append({
                "name": job.name, "sia_id": job.sia_id, "slurm_job_id": record.get("slurm_job_id"),
                "run": record.get("slurm_restart_count"), "message": record.get("message"),
                "time": record.get("time"), "verdict": job.verdict,
            })  # fmt: skip
    return found


def report(
    args: argparse.Namespace,
    site: Site,
    injector: Injector,
    killer: CheckpointKiller,
    jobs: list[JobEvidence],
    finished: bool,
    wall_s: float,
) -> dict[str, Any]:
    """Print the fault counts, every job that did not end as expected, and the table."""
    injected = [i for i in injector.done if i.ok and i.kind in FAULT_KINDS]
    if killer.result is None or "sia_id" not in killer.result:
        injected = [i for i in injected if i.kind != "checkpoint_kill"]  # armed, never fired
    print("\nfaults (planned / injected):")
    for kind in FAULT_KINDS:
        planned = args.fault_counts[kind]
        print(f"  {kind:<18} {planned:>3} / {sum(i.kind == kind for i in injected):>3}")
    expected_failures = injector.job_kill_targets
    print("\njobs not completed exactly once, or failing unexpectedly:")
    for job in jobs:
        own = job.verdict == "failed (own code)"
        if job.verdict == "completed once" or (own and job.sia_id in expected_failures):
            continue
        causes = [r.get("cause") for r in job.exits]
        print(f"  {job.name} ({job.sia_id}): {job.verdict}; phase {job.phase} {job.message!r}; "
              f"exits {causes}; Slurm {list(job.slurm_states)}")  # fmt: skip
    spared = [j for j in jobs if j.sia_id in expected_failures and j.verdict != "failed (own code)"]
    print("\njobs whose own failure was injected but did not end FAILED (--max-failures 0):")
    for job in spared:
        causes = [r.get("cause") for r in job.exits]
        print(f"  {job.name} ({job.sia_id}): {job.verdict}; exits {causes}")
    unexpected = unexpected_own_failures(jobs, expected_failures, killer)
    print("\nruns that failed 'by their own code' without an injected fault:")
    for item in unexpected:
        print(f"  {item['name']} ({item['sia_id']}) Slurm job {item['slurm_job_id']} run "
              f"{item['run']}: {item['message']}")  # fmt: skip
    check = checkpoint_kill_check(killer, jobs)
    print(f"\ncheckpoint kill: {json.dumps(check)}")
    result = totals(jobs, len(injected))
    print("\n" + "\n".join(table(result)))
    supervisor = site.supervisor
    killed = sum(e.returncode == -9 for e in supervisor.exits) if supervisor else 0
    failure = supervisor.failure if supervisor else ""
    pending = site.pending_actions()
    print(f"\ncontrollers SIGKILLed and restarted: {killed} (other exits: {failure!r}); "
          f"pending actions at the end: {pending}; all finished: {finished}; "
          f"wall {wall_s / 60:.1f} min")  # fmt: skip
    return {
        "command": "python benchmarks/chaos.py " + " ".join(sys.argv[1:]),
        "options": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "totals": asdict(result),
        "all_finished": finished,
        "wall_s": wall_s,
        "injections": [asdict(i) for i in injector.done],
        "job_kill_targets": sorted(expected_failures),
        "submitted": {
            name: {"sia_id": site.ids[name], "slurm_job_id": slurm_id, "time": when}
            for name, (slurm_id, when) in site.submitted.items()
        },
        "checkpoint_kill": check,
        "unexpected_own_failures": unexpected,
        "injected_failures_not_failed": [j.name for j in spared],
        "checkpoint_kill_missed": killer.missed,
        "controller_exits": [
            {"pid": e.pid, "returncode": e.returncode}
            for e in (supervisor.exits if supervisor else [])
        ],
        "pending_actions": site.pending_actions(),
        "jobs": [job.summary() for job in jobs],
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    window = args.minutes * 60.0
    # A soak stopped early still reports and takes its cluster down (a background job's SIGINT
    # is ignored by the shell that started it, so SIGTERM does the same).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        faults = fault_schedule(args.fault_counts, FIRST_FAULT_S, window, args.seed)
    except ChaosError as exc:
        raise SystemExit(f"chaos: {exc}") from None
    plans = job_plans(args.jobs, args.real_jobs, args.scale, window, args.seed)
    print(f"chaos soak: {len(plans)} jobs ({args.real_jobs} real), {len(faults)} faults over "
          f"{args.minutes:g} min, seed {args.seed}, rounds {60 / args.scale:g} s")  # fmt: skip
    cluster = DevCluster(
        args.dir / "cluster", args.port_base, log=lambda m: print(f"  dev cluster: {m}"),
        cred_expire_s=args.cred_expire, slurm_user=SERVICE,
    )  # fmt: skip
    site = Site(args.dir, cluster)
    site.prepare(60.0 / args.scale)
    wall = time.perf_counter()
    finished = False
    try:
        site.start()
        started = time.time()
        killer = CheckpointKiller(site, {})
        injector = Injector(site, {p.name: p for p in plans}, faults, args.seed, started, killer)
        threads = [
            threading.Thread(target=submit_all, args=(site, plans, killer, started), daemon=True),
            threading.Thread(target=watch_slurm, args=(site,), daemon=True),
            injector.thread,
            killer.thread,
        ]
        for thread in threads:
            thread.start()
        timeout = args.timeout if args.timeout is not None else window + 1800.0
        try:
            finished = wait_finished(site, plans, injector, started + window, started + timeout)
        except KeyboardInterrupt:  # SIGINT or SIGTERM: judge what there is
            print("  interrupted: judging the jobs as they stand", flush=True)
        site.stopping.set()
        site.poll_slurm()
        jobs = gather(site, plans)
        result = report(args, site, injector, killer, jobs, finished, time.perf_counter() - wall)
    finally:
        site.stop(keep=args.keep)
    text = json.dumps(result, indent=1, default=str) + "\n"
    (args.dir / "chaos.json").write_text(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
