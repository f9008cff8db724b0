"""``sia-slurm status``: the cluster by GPU type and the managed jobs, as the controller sees them.

It reads the state database and, unless ``--offline``, takes a fresh snapshot from the backend;
if the snapshot fails it says so and shows the last round's view instead, since an operator
asks for the status most when something is wrong.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.controller_cmd import (
    CONFIG_OPTION,
    backend_factory,
    echo_printable,
    fail,
    load_config_or_exit,
)
from sia_slurm.cluster import ClusterSnapshot
from sia_slurm.config import SiaConfig
from sia_slurm.controller.profiling import PROFILING_NOTE
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.policy.site_accounting import shares_source
from sia_slurm.slurm.observe.jobfiles import LOST_SUBMISSION
from sia_slurm.slurm.observe.sacct import accounted_gpu_hours
from sia_slurm.slurm.runner import CommandError, SubprocessRunner
from sia_slurm.state import Journal, Store, StoreError
from sia_slurm.text import printable


@dataclass(frozen=True)
class JobLine:
    """One managed job's row of the status table."""

    sia_id: str
    user: str  # Slurm's user and account of the job ('' where Slurm has not said)
    account: str
    app: str
    phase: str
    config: str  # "-" without GPUs
    gpus: int
    batch: str
    goodput: float | None  # predicted by the last round for the configuration it runs
    restarts: int
    slurm_job_id: str
    message: str = ""  # what the controller last said of the job (why it failed, ...)
    accounted_gpu_hours: float | None = None  # sacct, over all its Slurm runs (accounting)


def live_snapshot(ctx: click.Context, config: SiaConfig) -> tuple[ClusterSnapshot | None, str]:
    """A fresh snapshot, or ``None`` and why not.

    The backend's warnings about rejected inputs (e.g. the metrics file of every job that has
    finished and left Slurm) are the controller's to log, once each; a fresh ``status`` or
    ``explain`` process would print them all every time, above the view that was asked for.
    """
    backend_log = logging.getLogger("sia_slurm.slurm")
    level = backend_log.level
    backend_log.setLevel(logging.ERROR)
    try:
        return backend_factory(ctx)(config).snapshot(), ""
    except Exception as exc:  # any backend failure: fall back to the database's view
        why = f"{type(exc).__name__}: {exc}"
        if "Could not establish a configuration source" in why:  # scontrol found no slurm.conf
            why += "; set SLURM_CONF to the cluster's slurm.conf (the controller's environment)"
        return None, why
    finally:
        backend_log.setLevel(level)


def accounted_hours(config: SiaConfig) -> dict[str, float] | None:
    """GPU-hours per sia job from ``sacct`` (all its Slurm runs); None without accounting."""
    bin_dir = Path(config.slurm.bin_dir) if config.slurm.bin_dir else None
    try:
        return accounted_gpu_hours(SubprocessRunner(bin_dir=bin_dir), config.managed_marker)
    except CommandError:
        return None


def gpu_table(store: Store, snapshot: ClusterSnapshot | None) -> dict[str, dict[str, int]]:
    """Per GPU type: total, usable and allocated (held by managed jobs) GPUs."""
    if snapshot is None:
        last = store.last_round()
        gpus = last.gpus if last else {}
        return {
            t: {"total": c["total"], "usable": c["usable"], "allocated": c["in_use"]}
            for t, c in gpus.items()
        }
    table: dict[str, dict[str, int]] = {}
    for node in snapshot.nodes:
        entry = table.setdefault(node.gpu_type, {"total": 0, "usable": 0, "allocated": 0})
        entry["total"] += node.total_gpus
        entry["usable"] += node.usable_gpus
    for job in snapshot.jobs:
        if job.phase.holds_gpus and job.config is not None:
            entry = table.setdefault(job.config.gpu_type, {"total": 0, "usable": 0, "allocated": 0})
            entry["allocated"] += job.config.gpus
    return table


def job_lines(
    store: Store,
    snapshot: ClusterSnapshot | None,
    show_all: bool,
    user: str | None = None,
    account: str | None = None,
) -> list[JobLine]:
    """The managed jobs: from the snapshot when there is one, else from the database; only
    ``user``'s and ``account``'s when given (the dashboard's filter, for a shell)."""
    lines = []
    for row in store.jobs():
        owner, charged = row.user, row.account
        if snapshot is None:
            phase, config, batch = row.phase, row.config, row.batch
            restarts, slurm_id = row.restarts, (row.slurm_job_ids or [""])[-1]
            message = row.message
            config_text = (
                f"{config['gpu_type']}:{config['nodes']}x{config['gpus']}" if config else "-"
            )
            gpus = config["gpus"] if config else 0
            batch_text = _batch_text(batch)
        else:
            job = next((j for j in snapshot.jobs if j.sia_id == row.sia_id), None)
            if job is None:
                continue
            owner, charged = job.user or owner, job.account or charged
            phase, restarts, slurm_id = job.phase.value, job.restarts, job.slurm_job_id
            message = job.message
            holds = job.phase.holds_gpus and job.config is not None
            config_text = str(job.config) if holds else "-"
            gpus = job.config.gpus if holds and job.config else 0
            batch_text = _batch_text(asdict(job.batch) if holds and job.batch else None)
        if phase in ("done", "failed", "gone") and not show_all:
            continue
        if (user is not None and owner != user) or (account is not None and charged != account):
            continue
        decided = store.last_decision(row.sia_id)
        goodput = None
        if decided is not None and decided[1].after == config_text and config_text != "-":
            goodput = decided[1].goodput
        lines.append(
            JobLine(
                row.sia_id,
                owner,
                charged,
                str(row.spec.get("app", "?")),
                phase,
                config_text,
                gpus,
                batch_text,
                goodput,
                restarts,
                slurm_id,
                message,
            )
        )
    return lines


def quarantined_last_round(store: Store) -> dict[str, str]:
    """The jobs the last round quarantined (sia id -> ``<stage>: <why>``): one job's files,
    model or evaluation failed, and it sat the round out while the others were decided
    (:mod:`sia_slurm.controller.quarantine`)."""
    last = store.last_round()
    if last is None:
        return {}
    decided = store.decisions(last.round_index)
    return {s: d.note for s, d in sorted(decided.items()) if d.action == QUARANTINED}


def profiling_last_round(store: Store) -> dict[str, str]:
    """The jobs the last round saw profiling (sia id -> where it stands: types measured, to
    measure, waiting for another job's profiling): docs/profiling.md."""
    last = store.last_round()
    if last is None:
        return {}
    decided = store.decisions(last.round_index)
    return {s: d.note for s, d in sorted(decided.items()) if d.note.startswith(PROFILING_NOTE)}


def _batch_text(batch: dict[str, Any] | None) -> str:
    if not batch:
        return "-"
    text = f"{batch['batch_size']} ({batch['local_bsz']}"
    if batch["accum_steps"]:
        text += f"x{batch['accum_steps'] + 1}"
    return text + ")"


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Aligned lines; cells are escaped first (app names and ids are users'), so a control
    character can neither reach the terminal nor skew the column widths."""
    rows = [[printable(cell) for cell in row] for row in rows]
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return [fmt.format(*headers).rstrip(), *(fmt.format(*r).rstrip() for r in rows)]


@click.command(
    "status",
    context_settings=CONTEXT_SETTINGS,
    help="""Show the cluster by GPU type and the managed jobs.

\b
GPU types: total GPUs, GPUs usable by managed jobs (not down, drained or
held by unmanaged jobs) and GPUs allocated to managed jobs. Jobs: user and
account (as Slurm says), phase, configuration (TYPE:NODESxGPUS), batch size
(local batch x micro-batches), the goodput the last round predicted for
that configuration (samples/s), restarts and Slurm job id. Read from the state database and a fresh
snapshot of the cluster (skipped with --offline, or when it fails).
""",
)
@CONFIG_OPTION
@click.option("--offline", is_flag=True, help="Use only the state database, not the cluster.")
@click.option("--all", "show_all", is_flag=True, help="Include finished jobs.")
@click.option("--user", metavar="NAME", help="Only NAME's jobs (Slurm's user).")
@click.option("--account", metavar="NAME", help="Only the jobs charged to Slurm account NAME.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.pass_context
def status(
    ctx: click.Context,
    config_path: Path | None,
    offline: bool,
    show_all: bool,
    user: str | None,
    account: str | None,
    as_json: bool,
) -> None:
    config = load_config_or_exit(config_path)
    try:
        store = Store.open(config.db_path, create=False)
    except StoreError as exc:
        fail(str(exc))
    with store:
        snapshot, why = (None, "--offline") if offline else live_snapshot(ctx, config)
        if snapshot is None and not offline:
            echo_printable(
                f"warning: no live snapshot ({why}); showing the last round's view", err=True
            )
        last = store.last_round()
        pending = len(Journal(store).pending())
        given_up = [
            {"journal_id": e.id, "round": e.round_index, "job": e.sia_id, "kind": e.kind,
             "message": e.message}
            for e in Journal(store).given_up()
        ]  # fmt: skip
        gpus = gpu_table(store, snapshot)
        jobs = job_lines(store, snapshot, show_all, user, account)
        quarantined = quarantined_last_round(store)
        profiling = profiling_last_round(store)
    accounted = None if offline else accounted_hours(config)
    if accounted is not None:
        jobs = [replace(j, accounted_gpu_hours=accounted.get(j.sia_id, 0.0)) for j in jobs]
    shares = shares_source(
        None if snapshot is None else snapshot.site is not None, config.shares_configured
    )
    rejected = snapshot.rejected if snapshot is not None else ()
    lost = [m for m in rejected if m.startswith(LOST_SUBMISSION)]
    if as_json:  # values exact: json.dumps escapes every control character (\u001b) itself
        click.echo(
            json.dumps(
                {
                    "state": str(config.db_path),
                    "live": snapshot is not None,
                    "last_round": None if last is None else last.round_index,
                    "pending_actions": pending,
                    "given_up_actions": given_up,
                    "lost_submissions": lost,
                    "quarantined": quarantined,
                    "profiling": profiling,
                    "shares": shares,
                    "gpu_types": gpus,
                    "jobs": [asdict(line) for line in jobs],
                },
                indent=1,
            )
        )
        return
    when = "never"
    if last is not None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(last.wall_time))
        when = f"round {last.round_index} at {stamp}" + (" (dry run)" if last.dry_run else "")
    echo_printable(f"state: {config.db_path}; last round: {when}; policy: {config.policy.name}")
    echo_printable(shares)
    if pending:
        echo_printable(f"pending actions: {pending} (re-applied at the next round)")
    for entry in given_up:
        echo_printable(
            f"given up: [round={entry['round']} job={entry['job']}] {entry['kind']}: "
            f"{entry['message']}"
        )
    click.echo()
    rows = [[t, str(c["total"]), str(c["usable"]), str(c["allocated"])] for t, c in gpus.items()]
    for line in _table(["GPU TYPE", "TOTAL", "USABLE", "ALLOCATED"], rows):
        echo_printable(line)
    click.echo()
    job_rows = [
        [
            j.sia_id,
            j.user or "-",
            j.account or "-",
            j.app,
            j.phase,
            j.config,
            str(j.gpus),
            j.batch,
            "-" if j.goodput is None else f"{j.goodput:.1f}",
            str(j.restarts),
            j.slurm_job_id or "-",
            *([] if accounted is None else [f"{j.accounted_gpu_hours or 0.0:.3f}"]),
        ]
        for j in jobs
    ]
    headers = [
        "JOB",
        "USER",
        "ACCOUNT",
        "APP",
        "PHASE",
        "CONFIG",
        "GPUS",
        "BATCH",
        "GOODPUT",
        "RESTARTS",
        "SLURM",
    ]
    if accounted is not None:
        headers.append("GPU-H (sacct)")  # every Slurm run of the job, joined by its comment
    for line in _table(headers, job_rows):
        echo_printable(line)
    if not jobs:
        echo_printable("(no managed jobs)")
    if lost:
        click.echo()
    for line in lost:  # Slurm forgot a job it had accepted: only its user can submit it again
        echo_printable(line)
    said = [j for j in jobs if j.message and j.phase in ("failed", "starting", "pending")]
    if said:
        click.echo()
    for j in said:  # why a job failed, or waits (Slurm's reason for a released job)
        echo_printable(f"{j.sia_id} {j.phase}: {j.message}")
    if profiling:
        click.echo()
    for sia_id, where in profiling.items():  # a new model measured on each GPU type
        echo_printable(f"{sia_id} {where}")
    if quarantined:
        click.echo()
    for sia_id, reason in quarantined.items():  # sat the last round out: its own failure
        echo_printable(f"{sia_id} quarantined (last round): {reason}")
