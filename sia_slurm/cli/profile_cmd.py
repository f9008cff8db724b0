"""``sia-slurm profile``: inspect the throughput profiles the goodput model starts from."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.controller_cmd import CONFIG_OPTION, echo_printable, load_config_or_exit
from sia_slurm.config import resolve_config_path
from sia_slurm.core import Configuration
from sia_slurm.model.efficiency import NO_STATS, GradientStats
from sia_slurm.model.estimator import JobGoodputEstimator
from sia_slurm.protocol import ProtocolError
from sia_slurm.protocol.profile import ProfileError, ProfileSet, default_profiles_dir, load_profiles
from sia_slurm.protocol.profile_json import profile_from_json
from sia_slurm.state.profiles import KeptProfile, ProfileStore, ProfileStoreError

GROUP_HELP = """\
Inspect throughput profiles of deep-learning models.

\b
A profile (one directory per model under the profiles directory) holds the
model's batch-size limits and its 1-GPU step times on every GPU type. The
scheduler seeds each new job's goodput model from it (Sia's bootstrap).
"""

SHOW_HELP = """\
Show a model's fitted throughput and projected goodput per GPU type and count.

\b
Prints, for model APP, the throughput-model parameters fitted to its seed
profile on each GPU type, then the goodput (samples per second of progress
measured at the initial batch size M0) that a new job of APP is predicted to
reach on each GPU type and GPU count, with the batch size that achieves it.
GPU counts are those Sia's policy considers: powers of two within a node,
then whole nodes.

\b
With only 1-GPU seed data the model predicts linear scaling; network costs
appear once a job has run on several GPUs. Without --grad-sqr/--grad-var the
statistical efficiency assumes no benefit from batches larger than M0.
"""


FORGET_HELP = """\
Forget a measured profile, so that the next job of APP is profiled again.

\b
Profiles measured by the scheduler (docs/profiling.md) are kept under the
state directory, per Slurm account and app. Run as the controller's
service account (it owns the state directory).
"""


def _parse_gpus_per_node(values: tuple[str, ...], profiles: ProfileSet) -> dict[str, int]:
    """``TYPE=N`` options over the profile's defaults (gpu_types.csv)."""
    shape = {name: t.gpus_per_node for name, t in profiles.gpu_types.items()}
    for value in values:
        name, sep, count = value.partition("=")
        if not sep or not count.isdigit() or int(count) < 1:
            raise click.BadParameter(
                f"expected TYPE=N with N a positive integer, got {value!r}",
                param_hint="--gpus-per-node",
            )
        if name not in shape:
            raise click.BadParameter(
                f"expected a GPU type among {', '.join(sorted(shape))}, got {name!r}",
                param_hint="--gpus-per-node",
            )
        shape[name] = int(count)
    return shape


def _configurations(gpu_type: str, gpus_per_node: int, max_nodes: int) -> list[Configuration]:
    """Sia's configuration set for one type: powers of two in a node, then whole nodes."""
    configs = []
    count = 1
    while count <= gpus_per_node:
        configs.append(Configuration(gpu_type, 1, count))
        count *= 2
    configs += [Configuration(gpu_type, k, k * gpus_per_node) for k in range(2, max_nodes + 1)]
    return configs


def _table(header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [header, *rows]
    return "\n".join(
        "  ".join(
            cell.rjust(w) if i else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


@click.group(help=GROUP_HELP, context_settings=CONTEXT_SETTINGS)
def profile() -> None:
    pass


@profile.command(help=SHOW_HELP)
@click.argument("app")
@click.option(
    "--profiles",
    "profiles_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Profiles directory [default: the profiles/ directory shipped with sia-slurm].",
)
@click.option(
    "--gpus-per-node",
    multiple=True,
    metavar="TYPE=N",
    help="GPUs per node of a GPU type (repeatable) [default: from gpu_types.csv].",
)
@click.option(
    "--nodes",
    "max_nodes",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Largest number of nodes per GPU type to show.",
)
@click.option("--grad-sqr", type=click.FloatRange(min=0), help="Gradient statistic grad_sqr at M0.")
@click.option("--grad-var", type=click.FloatRange(min=0), help="Gradient statistic grad_var at M0.")
@click.option(
    "--account",
    default=None,
    help="Show the profile measured for this Slurm account's jobs of APP (docs/profiling.md).",
)
@CONFIG_OPTION
def show(
    app: str,
    profiles_dir: Path | None,
    gpus_per_node: tuple[str, ...],
    max_nodes: int,
    grad_sqr: float | None,
    grad_var: float | None,
    account: str | None,
    config_path: Path | None,
) -> None:
    try:
        profiles = load_profiles(profiles_dir or default_profiles_dir())
    except ProfileError as exc:
        raise click.ClickException(str(exc)) from None
    kept: KeptProfile | None = None
    if account is None and app in profiles.apps:
        app_profile = profiles.app(app)
    else:
        kept = _kept(app, account, config_path, profiles)
        try:
            app_profile = profile_from_json(kept.document, str(kept.path), profiles.gpu_types)
        except ProtocolError as exc:
            raise click.ClickException(str(exc)) from None
    if (grad_sqr is None) != (grad_var is None):
        raise click.UsageError("--grad-sqr and --grad-var go together: give both or neither")
    stats = NO_STATS if grad_sqr is None else GradientStats(grad_sqr, grad_var or 0.0)
    shape = _parse_gpus_per_node(gpus_per_node, profiles)
    estimator = JobGoodputEstimator.from_profile(app_profile, grad_stats=stats)

    echo_printable(f"{app_profile.name}: {app_profile.description}")
    source = f"profiles: {profiles.root}" if kept is None else f"kept in {kept.path}"
    click.echo(
        f"M0 {app_profile.init_batch_size}, max batch {app_profile.max_batch_size}, "
        f"min local batch {app_profile.min_local_bsz}; {source}"
    )
    if kept is not None:
        echo_printable(_measured(kept))
    click.echo("\nThroughput model per GPU type (fitted to the seed profile; times in seconds):")
    header = ["TYPE", "MAX_LOCAL", "XPUT1/s", "ALPHA_C", "BETA_C", "ALPHA_R", "BETA_R"]
    header += ["ALPHA_N", "BETA_N", "GAMMA", "POINTS"]
    rows = []
    for name in app_profile.gpu_types:
        model = estimator.type_model(name)
        if model is None:
            rows.append([name, str(app_profile.max_local_bsz[name])] + ["-"] * 9)
            continue
        p = model.params
        values = (p.alpha_c, p.beta_c, p.alpha_r, p.beta_r, p.alpha_n, p.beta_n)
        rows.append(
            [name, str(model.max_local_bsz), f"{model.xput1:.1f}"]
            + [f"{v:.3g}" for v in values]
            + [f"{p.gamma:.2f}", str(len(app_profile.seed.get(name, ())))]
        )
    click.echo(_table(header, rows))

    per_type = {
        name: _configurations(name, shape[name], max_nodes) for name in app_profile.gpu_types
    }
    counts = sorted({c.gpus for configs in per_type.values() for c in configs})
    goodput_rows, batch_rows = [], []
    for name, configs in per_type.items():
        row = estimator.evaluate(configs)
        by_count = {c.gpus: i for i, c in enumerate(configs)}
        goodput_rows.append(
            [name] + [f"{row.goodput[by_count[k]]:.1f}" if k in by_count else "-" for k in counts]
        )
        batch_rows.append(
            [name]
            + [
                f"{row.batch_size[i]}={row.local_bsz[i]}x{row.accum_steps[i] + 1}"
                if (i := by_count.get(k)) is not None
                else "-"
                for k in counts
            ]
        )
    gpu_header = ["TYPE"] + [str(k) for k in counts]
    click.echo("\nProjected goodput (samples/s at M0-equivalent progress), GPU type x GPU count:")
    click.echo(_table(gpu_header, goodput_rows))
    click.echo("\nChosen batch size (global=local x micro-batches per GPU):")
    click.echo(_table(gpu_header, batch_rows))


def _store(config_path: Path | None) -> ProfileStore:
    return ProfileStore(load_config_or_exit(config_path).state_dir)


def _kept(
    app: str, account: str | None, config_path: Path | None, profiles: ProfileSet
) -> KeptProfile:
    """The measured profile of ``app`` for ``account`` (the only account that has one when
    not given), or a :class:`click.ClickException` saying what there is."""
    resolved = resolve_config_path(config_path)
    if not resolved.exists():
        try:
            profiles.app(app)
        except ProfileError as exc:
            raise click.ClickException(
                f"{exc}; measured profiles are found through the controller's config, and "
                f"{resolved} does not exist (give --config)"
            ) from None
    store = _store(resolved)
    try:
        if account is None:
            accounts = store.accounts_of(app)
            if len(accounts) != 1:
                shipped = ", ".join(sorted(profiles.apps))
                raise click.ClickException(
                    f"{app}: no shipped profile ({shipped}) and "
                    + (
                        f"measured ones for accounts {', '.join(a or '(none)' for a in accounts)}:"
                        " give --account"
                        if accounts
                        else f"none measured under {store.root}"
                    )
                )
            account = accounts[0]
        kept = store.read(account, app)
    except ProfileStoreError as exc:
        raise click.ClickException(str(exc)) from None
    if kept is None:
        raise click.ClickException(
            f"{app}: no profile measured for account {account or '(none)'} under {store.root}"
        )
    return kept


def _measured(kept: KeptProfile) -> str:
    """When, where and how long a kept profile was measured."""
    meta = kept.meta
    when = meta.get("measured_at")
    at = (
        datetime.fromtimestamp(when, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        if isinstance(when, int | float)
        else "?"
    )
    seconds = meta.get("seconds")
    took = f"{seconds:.0f} s" if isinstance(seconds, int | float) else "?"
    types = ", ".join(str(t) for t in meta.get("gpu_types", ()))
    return (
        f"measured {at} by {meta.get('by', '?')} on {types or '?'} in {took} "
        f"(account {kept.account or '(none)'})"
    )


@profile.command(help=FORGET_HELP)
@click.argument("app")
@click.option("--account", default="", help="The Slurm account whose profile to drop.")
@CONFIG_OPTION
def forget(app: str, account: str, config_path: Path | None) -> None:
    store = _store(config_path)
    try:
        dropped = store.forget(account, app)
    except ProfileStoreError as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise click.ClickException(
            f"{store.path(account, app)}: cannot remove: {exc.strerror or exc} (run it as the "
            "controller's service account)"
        ) from None
    if not dropped:
        raise click.ClickException(
            f"{app}: no profile measured for account {account or '(none)'} under {store.root}"
        )
    click.echo(
        f"{app}: measured profile of account {account or '(none)'} forgotten; the next job "
        "of it is profiled again"
    )
