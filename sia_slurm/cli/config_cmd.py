"""``sia-slurm config``: validate the controller's configuration."""

from __future__ import annotations

from pathlib import Path

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.live_check import check_live
from sia_slurm.config import (
    CONFIG_ENV_VAR,
    ConfigError,
    SiaConfig,
    load_config,
    resolve_config_path,
)
from sia_slurm.config_keys import reference_markdown
from sia_slurm.policy.sia import SiaPolicyConfig
from sia_slurm.policy.site_accounting import shares_source
from sia_slurm.slurm.commands import SHOW_CONFIG
from sia_slurm.slurm.observe.inventory import read_inventory
from sia_slurm.slurm.observe.sacct import AccountingReader
from sia_slurm.slurm.runner import CommandError, SubprocessRunner
from sia_slurm.slurm.slurm_conf import parse_settings


@click.group(
    context_settings=CONTEXT_SETTINGS,
    help="Validate the sia-slurm configuration file.\n\n"
    "The configuration maps Slurm partitions to GPU types and sets the round length, "
    "the policy and its parameters, the state directory and the managed-job marker.",
)
def config() -> None:
    pass


def policy_advice(cfg: SiaConfig) -> list[str]:
    """Settings that are valid but known to behave badly on a real cluster."""
    params = cfg.policy.params
    if isinstance(params, SiaPolicyConfig) and params.lambda_a == 0:
        return [
            "policy.lambda_a is 0: with cheap restarts, jobs with equal goodput may swap GPU "
            "types every round; the paper's physical cluster uses 0.01 (as etc/sia.yaml)"
        ]
    return []


@config.command(
    "check",
    help=f"""Check a configuration file and report every problem found.

\b
PATH defaults to ${CONFIG_ENV_VAR}, else /etc/sia-slurm/sia.yaml.
Each problem is printed as FILE:LINE: KEY: MESSAGE, and so is each key
still read under a name retired in this release (KEY: warning: ...). With
--live, the
partition map is also compared with the running Slurm (found through
SLURM_CONF as for any Slurm command): every mapped partition must exist
and each of its nodes must carry Gres=gpu:TYPE:GPUS_PER_NODE.

\b
Exit status: 0 when the configuration is usable, 1 when it is not.
""",
)
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--live", is_flag=True, help="Also verify the partition map against running Slurm.")
def check(path: Path | None, live: bool) -> None:
    resolved = resolve_config_path(path)
    try:
        cfg = load_config(resolved)
    except ConfigError as exc:
        for issue in exc.issues:
            click.echo(str(issue), err=True)
        click.echo(f"{resolved}: {len(exc.issues)} problem(s); configuration not usable", err=True)
        raise SystemExit(1) from None
    for warning in cfg.warnings:  # keys under names retired in this release
        click.echo(str(warning), err=True)
    for advice in policy_advice(cfg):
        click.echo(f"{resolved}: warning: {advice}", err=True)
    if not live:
        click.echo(f"{resolved}: {shares_source(None, cfg.shares_configured)}")
        click.echo(f"{resolved}: OK")
        return
    runner = SubprocessRunner(bin_dir=Path(cfg.slurm.bin_dir) if cfg.slurm.bin_dir else None)
    try:
        inventory = read_inventory(runner)
        settings = parse_settings(runner.run(list(SHOW_CONFIG)).stdout)
    except CommandError as exc:
        click.echo(f"{resolved}: cannot read the Slurm inventory: {exc}", err=True)
        raise SystemExit(1) from None
    click.echo(f"{resolved}: Slurm {settings.version or '(version not shown)'}")
    accounting = AccountingReader(runner).enabled()
    click.echo(f"{resolved}: {shares_source(accounting, cfg.shares_configured)}")
    report = check_live(cfg, inventory)
    for warning in [*settings.warnings(cfg.round_seconds), *report.warnings]:
        click.echo(f"{resolved}: warning: {warning}", err=True)
    for error in report.errors:
        click.echo(f"{resolved}: {error}", err=True)
    if not report.ok:
        click.echo(
            f"{resolved}: {len(report.errors)} mismatch(es) with the running Slurm", err=True
        )
        raise SystemExit(1)
    types = ", ".join(f"{p.name}=gpu:{p.gpu_type}:{p.gpus_per_node}" for p in cfg.partitions)
    click.echo(f"{resolved}: OK (live: {types})")


@config.command(
    "keys",
    help="Print every key of the configuration file, with its value, default and meaning "
    "(Markdown tables: the file's own keys, then each policy's parameters).",
)
def keys() -> None:
    click.echo(reference_markdown(), nl=False)
