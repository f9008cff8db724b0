"""``sia-slurm dev-cluster``: a real multi-node Slurm with typed fake GPUs on this machine.

Part of sia-slurm-dev, not of sia-slurm: :mod:`sia_slurm.cli.main` adds this group to the
``sia-slurm`` command when this package is installed, and says how to install it otherwise.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from sia_slurm.cli import CONTEXT_SETTINGS
from sia_slurm.slurm.runner import CommandError
from sia_slurm_dev import (
    DEFAULT_SPEC,
    DevCluster,
    DevClusterError,
    DevClusterSpec,
    controller_config,
)
from sia_slurm_dev.accounts_spec import (
    DEFAULT_ACCOUNTS,
    AccountingSpec,
    AccountingSpecError,
)
from sia_slurm_dev.chroot import SYSTEM
from sia_slurm_dev.lifecycle import DEFAULT_DIR, DEFAULT_PORT_BASE, parse_daemon
from sia_slurm_dev.roots import (
    CACHE_ENV,
    DEFAULT_CACHE_DIR,
    DEFAULT_MIRROR,
    RELEASE_SUITES,
    RootError,
    ensure_root,
)

_DIR = click.option(
    "--dir",
    "root",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_DIR,
    show_default=True,
    envvar="SIA_DEV_CLUSTER_DIR",
    help="Directory holding the cluster's config, state, logs and pids [env SIA_DEV_CLUSTER_DIR].",
)


def _say(message: str) -> None:
    click.echo(message, err=True)


@click.group(
    "dev-cluster",
    context_settings=CONTEXT_SETTINGS,
    help="""Run a real Slurm cluster with typed fake GPUs on this machine.

\b
Starts munged, one slurmctld and one slurmd per node on this host, on
non-default ports, with one partition per GPU type and GPUs declared as
GRES backed by fake device files. For development, tests and demos;
needs root and the Debian packages slurmctld, slurmd, slurm-client and
munge (nothing is installed automatically).
""",
)
def dev_cluster() -> None:
    pass


@dev_cluster.command(
    help="""Start the dev cluster and wait until every node is idle.

\b
SPEC lists GPU types as TYPE:NODESxGPUS, comma separated; each type gets
nodes TYPE-1..TYPE-N in a partition named TYPE. If a cluster already runs
in DIR nothing is started. Progress goes to stderr; stdout gets the line
to eval:  eval "$(sia-slurm dev-cluster up)"
""",
)
@click.option(
    "--spec",
    default=DEFAULT_SPEC,
    show_default=True,
    help="Cluster shape: GPU type, nodes and GPUs per node.",
)
@_DIR
@click.option(
    "--port-base",
    type=click.IntRange(1024, 65000),
    default=DEFAULT_PORT_BASE,
    show_default=True,
    help="slurmctld port; slurmd ports follow it.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(1),
    default=90.0,
    show_default=True,
    help="Seconds to wait for the daemons and nodes.",
)
@click.option(
    "--cred-expire",
    type=click.IntRange(5, 3600),
    default=30,
    show_default=True,
    help="Slurm's AuthInfo cred_expire: a requeued job waits this long (+1 s) before it may "
    "start again, so every restart costs at least this much.",
)
@click.option(
    "--slurm-user",
    metavar="NAME",
    default=None,
    help="Run slurmctld as this existing account (Slurm's SlurmUser, privileged in Slurm), as "
    "the controller's service account runs in production; create it with `useradd --system`. "
    "slurmd still runs as the invoking user. Default: the invoking user.",
)
@click.option(
    "--slurmd-timeout",
    type=click.IntRange(5, 3600),
    default=10,
    show_default=True,
    help="Slurm's SlurmdTimeout: a node whose slurmd died is DOWN after this, plus up to two "
    "MessageTimeouts (~26 s in all with 10), and its --requeue jobs are requeued.",
)
@click.option(
    "--slurm",
    "release",
    type=click.Choice([SYSTEM, *sorted(RELEASE_SUITES)]),
    default=SYSTEM,
    show_default=True,
    envvar="SIA_DEV_CLUSTER_SLURM",
    help="Which Slurm: the host's (system), or a release run from its cached Debian root "
    "(built first if missing, ~1 min; see `dev-cluster root`): daemons, client commands and "
    "jobs then run inside it, and stdout also gets the PATH of its client wrappers "
    "[env SIA_DEV_CLUSTER_SLURM].",
)
@click.option(
    "--accounting",
    is_flag=True,
    help="Run Slurm accounting: slurmdbd on a MariaDB server (data under DIR/db), with the "
    "accounts, users, QOS and GPU limits of --accounts created by sacctmgr; slurmctld then "
    "enforces them and stores job comments. With --slurm 24.11/26.05 the root's own slurmdbd "
    "runs (added to a root built without it), on the host's MariaDB.",
)
@click.option(
    "--accounts",
    "accounts_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="YAML spec of accounts, users and QOS for --accounting (dev/sia_slurm_dev/"
    "accounting.py); default: accounts physics and biology, shares 1:1.",
)
def up(
    spec: str,
    root: Path,
    port_base: int,
    timeout: float,
    cred_expire: int,
    slurm_user: str | None,
    slurmd_timeout: int,
    release: str,
    accounting: bool,
    accounts_file: Path | None,
) -> None:
    try:
        parsed = DevClusterSpec.parse(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--spec") from None
    accounts = None
    if accounting or accounts_file is not None:
        text = accounts_file.read_text() if accounts_file else DEFAULT_ACCOUNTS
        try:
            where = str(accounts_file or "default accounts")
            accounts = AccountingSpec.parse(text, where)
            accounts.check_gpu_types((g.gpu_type for g in parsed.groups), where)
        except AccountingSpecError as exc:
            raise click.BadParameter(str(exc), param_hint="--accounts") from None
    cluster = DevCluster(
        root,
        port_base=port_base,
        log=_say,
        cred_expire_s=cred_expire,
        slurm_user=slurm_user,
        slurmd_timeout_s=slurmd_timeout,
        slurm=release,
        accounting=accounts,
    )
    try:
        cluster.up(parsed, timeout_s=timeout)
    except DevClusterError as exc:
        _say(f"sia-slurm dev-cluster up: {exc}")
        raise SystemExit(1) from None
    click.echo(f"export SLURM_CONF={cluster.layout.slurm_conf}")
    if cluster.bin_dir is not None:
        # The release's own clients: the host's would be another release's.
        click.echo(f'export PATH={cluster.bin_dir}:"$PATH"')
        _say(f"controller config: slurm.bin_dir: {cluster.bin_dir} (`dev-cluster config --dir`)")


@dev_cluster.command(help="Cancel all jobs and stop exactly the daemons `up` started in DIR.")
@_DIR
def down(root: Path) -> None:
    try:
        DevCluster(root, log=_say).down()
    except DevClusterError as exc:
        _say(f"sia-slurm dev-cluster down: {exc}")
        raise SystemExit(1) from None


@dev_cluster.command(help="Show the daemons, the nodes (state, GRES) and the job queue.")
@_DIR
def status(root: Path) -> None:
    cluster = DevCluster(root)
    try:
        click.echo(cluster.status())
    except DevClusterError as exc:
        _say(f"sia-slurm dev-cluster status: {exc}")
        raise SystemExit(1) from None
    if not cluster.is_up():
        raise SystemExit(1)


# ---- faults: daemons that die and come back, nodes taken out and given back -------------------

_DAEMON = click.argument("daemon", metavar="DAEMON")
_NODE = click.argument("node", metavar="NODE")


def _fault(name: str, step: Callable[[DevCluster], object], root: Path) -> None:
    """Run one fault step on the cluster in ``root``; a DevClusterError exits 1 with its text."""
    try:
        step(DevCluster(root, log=_say))
    except (DevClusterError, CommandError) as exc:
        _say(f"sia-slurm dev-cluster {name}: {exc}")
        raise SystemExit(1) from None


def _kill(cluster: DevCluster, daemon: str, jobs: bool) -> None:
    node = parse_daemon(daemon, cluster.node_names())
    if node is None:
        if jobs:
            raise DevClusterError("--jobs goes with slurmd:NODE (slurmctld runs no jobs)")
        cluster.kill_slurmctld()
    else:
        cluster.kill_slurmd(node, jobs=jobs)


def _start(cluster: DevCluster, daemon: str) -> None:
    node = parse_daemon(daemon, cluster.node_names())
    if node is None:
        cluster.start_slurmctld()
    else:
        cluster.start_slurmd(node)


_JOBS = click.option(
    "--jobs",
    is_flag=True,
    help="With slurmd:NODE: kill the node's job processes too (slurmstepd and what it "
    "started), as when the node itself dies; without it they live on, as when slurmd alone "
    "crashes (Slurm kills them once the restarted slurmd reports them).",
)


@dev_cluster.command(
    help="""Kill a daemon with SIGKILL, as a crash: slurmctld or slurmd:NODE.


slurmctld: running jobs go on; what slurmctld had not saved yet (it saves
a few seconds after a change) is lost when it starts again. slurmd:NODE:
the node goes NOT_RESPONDING, then DOWN (SlurmdTimeout; ~26 s here), and
Slurm requeues its --requeue jobs. `status` shows the daemon STOPPED;
`start` brings it back.
""",
)
@_DAEMON
@_JOBS
@_DIR
def kill(daemon: str, jobs: bool, root: Path) -> None:
    _fault("kill", lambda cluster: _kill(cluster, daemon, jobs), root)


@dev_cluster.command(
    help="""Start a killed daemon again: slurmctld or slurmd:NODE.


slurmctld starts without -c, from its saved state (jobs, nodes); waits
until it answers `scontrol ping`. slurmd:NODE: waits until slurmctld hears
from the node; a DOWN node is capacity again (ReturnToService=2).
""",
)
@_DAEMON
@_DIR
def start(daemon: str, root: Path) -> None:
    _fault("start", lambda cluster: _start(cluster, daemon), root)


@dev_cluster.command(help="Kill a daemon, then start it again at once: slurmctld or slurmd:NODE.")
@_DAEMON
@_JOBS
@_DIR
def restart(daemon: str, jobs: bool, root: Path) -> None:
    def step(cluster: DevCluster) -> None:
        _kill(cluster, daemon, jobs)
        _start(cluster, daemon)

    _fault("restart", step, root)


@dev_cluster.command(help="Drain NODE: Slurm starts nothing new there; running jobs go on.")
@_NODE
@click.option("--reason", default="dev-cluster drain", show_default=True, help="Slurm's Reason=.")
@_DIR
def drain(node: str, reason: str, root: Path) -> None:
    _fault("drain", lambda cluster: cluster.drain(node, reason), root)


@dev_cluster.command(help="Resume a drained or DOWN NODE; waits until Slurm may use it again.")
@_NODE
@_DIR
def resume(node: str, root: Path) -> None:
    _fault("resume", lambda cluster: cluster.resume(node), root)


@dev_cluster.command(
    "config",
    help="""Print a controller config (sia.yaml) for a dev cluster of this shape.

\b
One GPU type and one partition per spec group, profiles a100 -> dgx,
rtx -> rtx, t4 -> t4 (other types: their own name), state under
STATE_DIR. Check it with `sia-slurm config check --live FILE`.
""",
)
@click.option(
    "--spec",
    default=DEFAULT_SPEC,
    show_default=True,
    help="Cluster shape: GPU type, nodes and GPUs per node.",
)
@click.option(
    "--state-dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="The controller's state directory (SQLite database, control/ and jobs/ trees).",
)
@click.option("--round-seconds", type=click.FloatRange(min=0, min_open=True), default=60.0,
              show_default=True, help="Seconds between controller rounds.")  # fmt: skip
@click.option("--policy", default="sia", show_default=True, help="sia, pollux, gavel or fifo.")
@click.option("--dry-run", is_flag=True, help="Observe and decide, change nothing.")
@click.option(
    "--dir",
    "cluster_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="A running dev cluster's directory: its client commands become slurm.bin_dir when it "
    "runs a release from a Debian root (the host's Slurm is searched on PATH).",
)
def config(
    spec: str,
    state_dir: Path,
    round_seconds: float,
    policy: str,
    dry_run: bool,
    cluster_dir: Path | None,
) -> None:
    try:
        parsed = DevClusterSpec.parse(spec)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--spec") from None
    text = controller_config(
        parsed,
        state_dir.absolute(),
        round_seconds=round_seconds,
        policy=policy,
        dry_run=dry_run,
        bin_dir=DevCluster(cluster_dir).bin_dir if cluster_dir is not None else None,
        comment=f"Written by `sia-slurm dev-cluster config --spec {parsed}`.",
    )
    click.echo(text, nl=False)


# ---- roots: other Slurm releases, from Debian ----------------------------------------------------


@dev_cluster.command(
    "root",
    help="""Build (once) a Debian root holding Slurm RELEASE; print its path.

\b
Runs debootstrap (installed with apt-get if missing) for the Debian suite
that carries RELEASE (24.11: trixie, 26.05: forky), with slurmctld,
slurmd, slurm-client, munge and python3, into CACHE_DIR/RELEASE. A
finished root is reused; an unfinished one is built again. Refuses a root
whose `slurmctld -V` is not RELEASE. Needs root. The daemons then run as
`chroot ROOT ...` with /proc, /dev and /sys bound in.
""",
)
@click.argument("release", type=click.Choice(sorted(RELEASE_SUITES)))
@click.option(
    "--cache-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=DEFAULT_CACHE_DIR,
    show_default=True,
    envvar=CACHE_ENV,
    help=f"Where the roots live, one directory per release [env {CACHE_ENV}].",
)
@click.option("--mirror", default=DEFAULT_MIRROR, show_default=True, help="Debian archive.")
def root(release: str, cache_dir: Path, mirror: str) -> None:
    try:
        built = ensure_root(release, cache_dir, log=_say, mirror=mirror)
    except RootError as exc:
        _say(f"sia-slurm dev-cluster root: {exc}")
        raise SystemExit(1) from None
    _say(f"Slurm {built.version} (Debian {built.suite})")
    click.echo(str(built.path))
