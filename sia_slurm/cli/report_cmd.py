"""``sia-slurm report``: the static dashboard (and a text summary) of a run.

The source is the controller's state database (``--db``, or the ``state_dir`` of ``--config``)
or a simulation output directory (``--sim``); both become the same neutral
:class:`~sia_slurm.report.ReportData`, rendered by :func:`~sia_slurm.report.render_site`.

With ``--config`` (and not ``--offline``) the jobs' accounted GPU-hours are asked of Slurm
accounting by :func:`~sia_slurm.cli.status_cmd.accounted_hours`, the function ``status`` uses,
so the dashboard and ``status`` decide alike whether accounting is on and charge alike. ``--db``
alone names no Slurm installation (no ``slurm.bin_dir``, no marker), so it never asks.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.cli.controller_cmd import echo_printable, load_config_or_exit
from sia_slurm.cli.status_cmd import accounted_hours
from sia_slurm.report import (
    JobRow,
    ReportData,
    ReportSourceError,
    render_site,
    report_from_db,
    report_from_sim,
)
from sia_slurm.text import printable

EXIT_ERROR = 1

HELP = """\
Render the dashboard of a controller run or of a simulation.

\b
Exactly one source:
  --db PATH       the controller's state database (STATE_DIR/sia.db)
  --config FILE   the controller's configuration: its state_dir's sia.db,
                  plus the jobs' last metrics reports in STATE_DIR/jobs
  --sim DIR       a `sia-slurm simulate --out DIR` directory (with
                  --workload LABEL when it holds several workloads)

\b
--out DIR writes a static site (index.html, style.css, app.js, data.js,
report.json): the cluster per round (GPUs per type, allocated and free),
each job's GPU type and count over time, the job table (state, type,
GPUs, batch, predicted and measured goodput, restarts, JCT), the JCT CDF
and the policy's solve time per round. It needs no server: open
index.html from disk or serve the folder with any web server.
--table prints the job table (JCT, GPU type and count history, restarts).

\b
With --config, where the cluster has Slurm accounting (slurmdbd), the job
table and --table also show each job's GPU-hours as sacct accounted them
over all its Slurm runs (joined by the job's comment), as `status` does;
--offline skips asking sacct. Without accounting the column is left out.
"""


@click.command("report", context_settings=CONTEXT_SETTINGS, help=HELP)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder to write the site into (created if missing).",
)
@click.option(
    "--db",
    "db_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="State database of the controller.",
)
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Controller configuration (its state_dir is read).",
)
@click.option(
    "--sim",
    "sim_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Simulation output folder (sia-slurm simulate --out).",
)
@click.option("--workload", default=None, help="With --sim: which workload (rounds-LABEL.jsonl).")
@click.option("--title", default=None, help="Title of the page.")
@click.option("--table", is_flag=True, help="Print the job table to stdout.")
@click.option("--offline", is_flag=True, help="With --config: do not ask Slurm accounting (sacct).")
def report_command(
    out: Path | None,
    db_path: Path | None,
    config_path: Path | None,
    sim_dir: Path | None,
    workload: str | None,
    title: str | None,
    table: bool,
    offline: bool,
) -> None:
    given = [name for name, value in (("--db", db_path), ("--config", config_path),
                                      ("--sim", sim_dir)) if value is not None]  # fmt: skip
    if len(given) != 1:
        raise click.UsageError(
            f"give exactly one source of --db, --config, --sim (got {', '.join(given) or 'none'})"
        )
    if out is None and not table:
        raise click.UsageError("nothing to do: give --out DIR, --table, or both")
    if workload is not None and sim_dir is None:
        raise click.UsageError("--workload: only with --sim")
    if offline and config_path is None:
        raise click.UsageError("--offline: only with --config")
    try:
        data = _load(db_path, config_path, sim_dir, workload, title, offline)
    except ReportSourceError as exc:
        echo_printable(f"error: {exc}", err=True)
        raise SystemExit(EXIT_ERROR) from None
    if table:
        click.echo(format_table(data))
    if out is not None:
        try:
            index = render_site(data, out)
        except OSError as exc:
            echo_printable(f"error: --out {out}: cannot write the site: {exc}", err=True)
            raise SystemExit(EXIT_ERROR) from None
        click.echo(f"dashboard: {index} ({len(data.jobs)} jobs, {len(data.rounds)} rounds)")


def _load(
    db_path: Path | None,
    config_path: Path | None,
    sim_dir: Path | None,
    workload: str | None,
    title: str | None,
    offline: bool = False,
) -> ReportData:
    if sim_dir is not None:
        data = report_from_sim(sim_dir, workload=workload)
        return data if title is None else _retitled(data, title)
    if config_path is not None:
        config = load_config_or_exit(config_path)
        accounted = None if offline else accounted_hours(config)
        return report_from_db(
            config.db_path, state_dir=config.state_dir, title=title, accounted=accounted
        )
    assert db_path is not None
    return report_from_db(db_path, title=title)


def _retitled(data: ReportData, title: str) -> ReportData:
    return ReportData(title, data.subtitle, data.gpu_types, data.rounds, data.jobs, data.summary)


# ----------------------------------------------------------------------------------------------
# The text table


def gpu_history(job: JobRow) -> str:
    """``"t4:1 -> a100:4"``: the job's configurations in order, repeats merged."""
    steps: list[str] = []
    for segment in job.segments:
        step = f"{segment.gpu_type}:{segment.gpus}"
        if not steps or steps[-1] != step:
            steps.append(step)
    return " -> ".join(steps) or "-"


def format_table(data: ReportData) -> str:
    """The job table as fixed-width text, followed by the summary lines. The ``profiling``
    column (how long a job profiled its model) is there only when some job profiled; the
    ``GPU-h (sacct)`` column (Slurm accounting's charge over all the job's runs) only when
    the report has accounting, as in ``status``. Every cell and summary line is escaped
    (:func:`~sia_slurm.text.printable`): job ids and apps are the users'."""
    accounting = any(job.accounted_gpu_hours is not None for job in data.jobs)
    profiled = any(job.profiling_s is not None for job in data.jobs)
    header = ("job", "app", "state", "JCT", *(("profiling",) if profiled else ()), "restarts",
              *(("GPU-h (sacct)",) if accounting else ()), "GPU type:count history")  # fmt: skip
    rows: list[Sequence[str]] = [header]
    for job in data.jobs:
        jct = "-" if job.jct_s is None else _minutes(job.jct_s)
        charged = () if not accounting else (f"{job.accounted_gpu_hours or 0.0:.3f}",)
        profiling = () if not profiled else (
            "-" if job.profiling_s is None else _minutes(job.profiling_s),
        )  # fmt: skip
        cells = (job.id, job.app or "-", job.state, jct, *profiling, str(job.restarts), *charged,
                 gpu_history(job))  # fmt: skip
        rows.append(tuple(printable(cell) for cell in cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row[:-1], widths, strict=True)), row[-1]])
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in [*widths, len(header[-1])]))
    lines.append("")
    lines.extend(printable(f"{label}: {value}") for label, value in data.summary)
    return "\n".join(lines)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min"
