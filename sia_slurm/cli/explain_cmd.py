"""``sia-slurm explain JOBID``: why a job has the allocation it has.

It rebuilds the job's goodput model from the state database (the same path a ``--once`` round
takes) and recomputes, with the Sia policy's own functions, the job's row of the goodput
matrix: every configuration it may take, the predicted goodput and batch there, the row
normalisation, the restart factor applied off its current configuration, and the objective
coefficient the program weighs against leaving the job without GPUs. So an operator sees what
the policy saw, not a re-derivation that could drift from it.
"""

from __future__ import annotations

import math
from pathlib import Path

import click
import numpy as np

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.controller_cmd import (
    CONFIG_OPTION,
    PROFILES_OPTION,
    echo_printable,
    fail,
    load_config_or_exit,
)
from sia_slurm.cli.status_cmd import live_snapshot
from sia_slurm.cluster import JobPhase
from sia_slurm.controller.profiling import PROFILING_NOTE
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.core import Configuration
from sia_slurm.policy.base import ClusterView, JobView, NodeShare, restart_factor
from sia_slurm.policy.sia import (
    FIXED_BATCH_KINDS,
    ConfigIndex,
    SiaPolicyConfig,
    candidate_configs,
    charged_restarts,
    column_costs,
)
from sia_slurm.service import ServiceError, open_controller
from sia_slurm.state import JobRow, Store, StoreError
from sia_slurm.state.codec import CodecError, config_from_json, placement_from_json


def _current(row: JobRow) -> tuple[Configuration | None, tuple[NodeShare, ...]]:
    if row.config is None or row.phase not in (JobPhase.STARTING.value, JobPhase.RUNNING.value):
        return None, ()
    where = f"jobs.{row.sia_id}"
    try:
        config = config_from_json(row.config, f"{where}.config")
        return config, placement_from_json(row.placement or [], f"{where}.placement")
    except CodecError:
        return None, ()


@click.command(
    "explain",
    context_settings=CONTEXT_SETTINGS,
    help="""Explain why a managed job has its allocation.

\b
Prints the job's last decision, its restart factor
r = max(age - restarts*S, 0) / (age + S), its GPU limits, and its row of
Sia's goodput matrix: for every configuration it may take, the predicted
goodput and best batch, the goodput normalised to the row's smallest,
the value after the restart factor (every configuration but the current
one), and the objective coefficient (negative: better than no GPUs; the
program picks the most negative feasible mix). Also the best
configuration on each GPU type. The model is rebuilt from the state
database; the cluster is a fresh snapshot unless --offline.
""",
)
@click.argument("job_id")
@CONFIG_OPTION
@PROFILES_OPTION
@click.option("--offline", is_flag=True, help="Use only the state database, not the cluster.")
@click.pass_context
def explain(
    ctx: click.Context,
    job_id: str,
    config_path: Path | None,
    profiles_dir: Path | None,
    offline: bool,
) -> None:
    config = load_config_or_exit(config_path)
    try:
        store = Store.open(config.db_path, create=False)
    except StoreError as exc:
        fail(str(exc))
    with store:
        row = store.job(job_id)
        decided = store.last_decision(job_id)
        if row is None and decided is not None and decided[1].action == QUARANTINED:
            # never read, so never recorded: its files are what the controller cannot read
            echo_printable(f"job {job_id}: quarantined in round {decided[0]}: {decided[1].note}")
            return
        if row is None:
            known = ", ".join(r.sia_id for r in store.jobs()[:20]) or "none"
            fail(f"{job_id}: no managed job with this id in {config.db_path} (known: {known})")
        assert row is not None
        try:
            controller, _notes = open_controller(config, store, profiles_dir)
        except ServiceError as exc:
            fail(str(exc))
        last = store.last_round()
        nodes = store.last_nodes()
    snapshot, _why = (None, "") if offline else live_snapshot(ctx, config)
    if snapshot is not None:
        nodes = snapshot.nodes
        live = next((j for j in snapshot.jobs if j.sia_id == job_id), None)
    else:
        live = None
    phase = live.phase.value if live else row.phase
    restarts = live.restarts if live else row.restarts
    if live is not None and live.phase.holds_gpus:
        current, placement = live.config, live.placement
    elif live is not None:
        current, placement = None, ()
    else:
        current, placement = _current(row)
    echo_printable(
        f"job {job_id}: app {row.spec.get('app')}, kind {row.spec.get('kind')}, phase {phase}, "
        f"{'on ' + str(current) if current else 'no GPUs'}, restarts {restarts}"
    )
    said = live.message if live else row.message
    if said:
        echo_printable(f"Slurm: {said}")
    if decided is not None:
        index, d = decided
        echo_printable(
            f"last decision (round {index}): {d.action} {d.before} -> {d.after}"
            + (
                f", batch {d.batch_size}, predicted goodput {d.goodput:.1f} samples/s"
                if d.batch_size
                else ""
            )
            + (f" ({d.note})" if d.note else "")
        )
    record = controller.jobs.get(job_id)
    if record is None and decided is not None and decided[1].note.startswith(PROFILING_NOTE):
        echo_printable(
            "its model is profiled first (docs/profiling.md): one GPU of each type it has "
            "not been measured on; its goodput model is built when every type is measured"
        )
        return
    if record is None:
        echo_printable(
            "the controller does not model this job any more (finished or never admitted)"
        )
        return
    if not nodes:
        fail("no cluster view: no round recorded yet and no live snapshot")
    now = snapshot.time if snapshot else (last.time if last else 0.0)
    params = config.policy.params if isinstance(config.policy.params, SiaPolicyConfig) else None
    sia = params or SiaPolicyConfig()
    if params is None:
        echo_printable(f"(policy {config.policy.name}: the row uses Sia's default parameters)")
    view = record.view(
        now=now,
        restarts=restarts,
        current=current,
        placement=placement,
        restoring=phase == JobPhase.STARTING.value and current is not None,
    )
    _explain_row(view, ClusterView(tuple(nodes)), sia)


def _explain_row(view: JobView, cluster: ClusterView, sia: SiaPolicyConfig) -> None:
    cost_s = sia.default_restart_cost if view.restart_cost is None else view.restart_cost
    charged = charged_restarts(view, sia)
    factor = restart_factor(view.age, charged, cost_s)
    uncharged = view.restarts - charged
    spared = f", {uncharged} more by the cluster on its own, not counted" if uncharged else ""
    echo_printable(
        f"restart factor r = {factor:.3f} (age {view.age:.0f} s, {charged} restarts{spared}, "
        f"S = {cost_s:g} s); applied to every configuration but the current one"
    )
    upper = "no limit" if view.max_gpus is None else str(view.max_gpus)
    echo_printable(
        f"GPU limits: min {view.min_gpus}, max {upper}, most run on so far {view.max_gpus_seen} "
        f"(growth factor {sia.growth_factor})"
    )
    configs, forced, current = candidate_configs(view, cluster, ConfigIndex.of(cluster), sia)
    if not configs:
        echo_printable("no configuration of this cluster fits the job's limits: it cannot run here")
        return
    row = view.estimator.evaluate(configs, fixed_batch=view.kind in FIXED_BATCH_KINDS)
    (cost,) = column_costs([view], [current], [row], sia)
    goodput = np.asarray(row.goodput, dtype=float)
    positive = goodput[goodput > 0]
    smallest = float(positive.min()) if positive.size else math.nan
    if forced:
        echo_printable(
            "the job is restoring from a checkpoint: it keeps its configuration this round"
        )
    echo_printable(
        f"goodput row (p = {sia.p:g}, lambda_n = {sia.lambda_n:g}; * = current configuration):"
    )
    headers = ("CONFIG", "GOODPUT", "BATCH", "LOCALxSTEPS", "NORM", "x r", "COST")
    echo_printable("  ".join(f"{h:>12}" if i else f"{h:<14}" for i, h in enumerate(headers)))
    for i, config in enumerate(configs):
        norm = goodput[i] / smallest if goodput[i] > 0 else 0.0
        scaled = norm if i == current else norm * factor
        mark = "*" if i == current else " "
        cells = (
            f"{goodput[i]:.1f}",
            str(int(row.batch_size[i])),
            f"{int(row.local_bsz[i])}x{int(row.accum_steps[i]) + 1}",
            f"{norm:.2f}",
            f"{scaled:.2f}",
            "-" if np.isnan(cost[i]) else f"{cost[i]:+.3f}",
        )
        echo_printable(f"{mark}{config!s:<13}  " + "  ".join(f"{c:>12}" for c in cells))
    best: dict[str, tuple[float, Configuration]] = {}
    for i, config in enumerate(configs):
        if goodput[i] > best.get(config.gpu_type, (0.0, config))[0]:
            best[config.gpu_type] = (float(goodput[i]), config)
    if best:
        echo_printable(
            "best per GPU type: "
            + "; ".join(f"{t}: {c} at {g:.1f} samples/s" for t, (g, c) in sorted(best.items()))
        )
