"""``sia-slurm controller run``: the scheduling loop (systemd) or one round (cron).

Also the helpers the ``status`` and ``explain`` commands share: loading the configuration with
every problem reported, and finding the backend factory (tests and embedding programs pass one
in ``click``'s context object as ``{"backend_factory": ...}``, so no patching is needed).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.config import (
    CONFIG_ENV_VAR,
    ConfigError,
    SiaConfig,
    load_config,
    resolve_config_path,
)
from sia_slurm.service import (
    EXIT_LOCKED,
    BackendFactory,
    LockHeldError,
    ServiceError,
    ServiceOptions,
    configure_logging,
    install_stop_handlers,
    run_service,
    service_backend,
)
from sia_slurm.service.logs import log_event
from sia_slurm.state import StoreError
from sia_slurm.text import printable

EXIT_ERROR = 1

CONFIG_OPTION = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help=f"Configuration file [default: ${CONFIG_ENV_VAR}, else /etc/sia-slurm/sia.yaml].",
)
PROFILES_OPTION = click.option(
    "--profiles",
    "profiles_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Throughput profiles directory [default: the profiles/ shipped with sia-slurm].",
)


def load_config_or_exit(config_path: Path | None, *, echo_warnings: bool = True) -> SiaConfig:
    """The validated configuration; on problems, print each one and exit 1. Its warnings (keys
    under names retired in this release) are printed too, unless the caller logs them itself
    (``echo_warnings=False``): every command that reads the file reminds the admin to edit it
    before the next release refuses it."""
    resolved = resolve_config_path(config_path)
    try:
        config = load_config(resolved)
    except ConfigError as exc:
        for issue in exc.issues:
            echo_printable(str(issue), err=True)
        echo_printable(
            f"{resolved}: {len(exc.issues)} problem(s); configuration not usable", err=True
        )
        raise SystemExit(EXIT_ERROR) from None
    if echo_warnings:
        for warning in config.warnings:
            echo_printable(str(warning), err=True)
    return config


def backend_factory(ctx: click.Context) -> BackendFactory:
    """The backend factory passed in the context object, else the config's Slurm backend."""
    obj: Any = ctx.find_root().obj
    if isinstance(obj, dict) and callable(obj.get("backend_factory")):
        return obj["backend_factory"]  # type: ignore[no-any-return]
    return service_backend


def echo_printable(text: str, *, err: bool = False) -> None:
    """Print one line with its control characters escaped: most of what the commands show
    (app names, Slurm's and the jobs' messages, exception texts quoting them) was written by a
    cluster user, and must not reach the administrator's terminal as escape sequences."""
    click.echo(printable(text), err=err)


def fail(message: str) -> None:
    echo_printable(f"error: {message}", err=True)
    raise SystemExit(EXIT_ERROR)


@click.group(
    context_settings=CONTEXT_SETTINGS,
    help="""Run the sia-slurm controller.

\b
The controller observes the cluster and the managed jobs every round,
solves the configured policy (Sia by default) and actuates the decision.
Its state (jobs, rounds, decisions, the action journal and the goodput
models' inputs) lives in STATE_DIR/sia.db; see docs/operations.md.
""",
)
def controller() -> None:
    pass


@controller.command(
    "run",
    help=f"""Run scheduling rounds: a loop (systemd) or one round (cron).

\b
Without --once: a round at start, then one at every multiple of
round_seconds of the wall clock; SIGTERM or SIGINT finishes the current
round, then exits 0. With --once: one round, the controller's memory
loaded from and saved to the state database (for cron or a timer).
\b
--dry-run (or dry_run: true in the configuration) observes and decides,
logs every action it would take, and changes nothing in the cluster.
Logs are JSON lines (one per decision and per action) on stderr or in
--log-file; metrics go to STATE_DIR/metrics/sia.prom.
\b
Only one controller runs at a time (a lock on STATE_DIR/controller.lock).
Exit status: 0 done; 1 configuration, state or backend error, or a round
whose actions could not be applied; {EXIT_LOCKED} another controller holds
the lock (nothing was done).
""",
)
@CONFIG_OPTION
@click.option("--once", is_flag=True, help="Run one round and exit (cron, systemd timer).")
@click.option("--dry-run", is_flag=True, help="Decide and log, but change nothing.")
@click.option(
    "--log-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Append JSON log lines to this file instead of stderr.",
)
@click.option(
    "--log-level",
    type=click.Choice(["debug", "info", "warning", "error"]),
    default="info",
    show_default=True,
    help="Least severe log level written.",
)
@PROFILES_OPTION
@click.pass_context
def run(
    ctx: click.Context,
    config_path: Path | None,
    once: bool,
    dry_run: bool,
    log_file: Path | None,
    log_level: str,
    profiles_dir: Path | None,
) -> None:
    config = load_config_or_exit(config_path, echo_warnings=False)  # logged below
    sia_log = logging.getLogger("sia_slurm")
    level, propagate = sia_log.level, sia_log.propagate  # put back when run ends (embedders)
    try:
        handler = configure_logging(log_file, getattr(logging, log_level.upper()))
    except OSError as exc:
        fail(f"{log_file}: --log-file: cannot open it: {exc.strerror or exc}")
    for warning in config.warnings:  # in the log the admin reads, once per start
        log_event(logging.WARNING, str(warning), event="config-warning", key=warning.key)
    options = ServiceOptions(
        once=once,
        dry_run=dry_run,
        backend_factory=backend_factory(ctx),
        profiles_dir=profiles_dir,
    )
    stop = threading.Event()
    restore = install_stop_handlers(stop) if not once else (lambda: None)
    try:
        reports = run_service(config, options, stop)
    except LockHeldError as exc:
        echo_printable(f"sia-slurm controller: {exc}", err=True)
        raise SystemExit(EXIT_LOCKED) from None
    except (StoreError, ServiceError) as exc:
        log_event(logging.ERROR, str(exc), event="startup-error")
        fail(str(exc))
    except Exception as exc:  # --once: the round could not observe or reconcile
        logging.getLogger(__name__).exception("round failed: %s", exc)
        fail(f"round failed: {type(exc).__name__}: {exc}")
    finally:
        restore()
        sia_log.removeHandler(handler)
        handler.close()
        sia_log.setLevel(level)
        sia_log.propagate = propagate
    if once and reports and reports[0].error:
        raise SystemExit(EXIT_ERROR)
