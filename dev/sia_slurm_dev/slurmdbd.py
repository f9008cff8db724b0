"""Slurm accounting for the dev cluster: a MariaDB server, slurmdbd, and associations.

``sia-slurm dev-cluster up --accounting`` starts Debian's ``mariadbd`` as the unprivileged
``mysql`` account with its data under the cluster's directory (``<dir>/db``, TCP on 127.0.0.1
only), then ``slurmdbd`` on it, registers the cluster and creates the accounts, users, QOS and
GPU limits of an :class:`AccountingSpec` with ``sacctmgr``, all before slurmctld starts (which
then enforces associations, limits and QOS and stores each job's comment, so ``sacct`` can join
the runs of one sia job).

The spec (``--accounts FILE``) is :class:`~sia_slurm_dev.accounts_spec.AccountingSpec`.

The invoking user and SlurmUser always get an association (with the first account), so the
dev cluster's own checks and the controller keep working.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sia_slurm.safefiles import chown_path
from sia_slurm_dev.accounts_spec import AccountingSpec, sacctmgr_commands
from sia_slurm_dev.chroot import SYSTEM, SlurmPrograms
from sia_slurm_dev.faults import DevClusterError
from sia_slurm_dev.process import DaemonRecord, is_alive, start_daemon
from sia_slurm_dev.slurm_conf import ClusterLayout
from sia_slurm_dev.spec import DevClusterSpec

PACKAGES = "slurmdbd mariadb-server"
DB_PACKAGES = "mariadb-server libmariadb3"
DB_USER = "mysql"
DATABASE = "siadev_acct_db"


@dataclass(frozen=True)
class AccountingLayout:
    """Where accounting keeps its files under the dev cluster's directory, and its ports."""

    root: Path
    port_base: int
    nodes: int  # the cluster's slurmd ports come first; MariaDB and slurmdbd take the next two

    @property
    def db_dir(self) -> Path:
        return self.root / "db"

    @property
    def mariadb_run(self) -> Path:
        return self.root / "run" / "mariadb"

    @property
    def mariadb_socket(self) -> Path:
        return self.mariadb_run / "mysqld.sock"

    @property
    def mariadb_tmp(self) -> Path:
        """MariaDB's own tmpdir. Never the shared /tmp: a starting mariadbd deletes every
        ``#sql*`` file in its tmpdir as left over from its last run, and that included another
        cluster's bootstrap tables there (loaded run 25: "Could not remove temporary table
        '/tmp/#sql-temptable-...', error: 2", then "Unknown table 'mysql.tmp_user_sys'")."""
        return self.mariadb_run / "tmp"

    @property
    def mariadb_port(self) -> int:
        return self.port_base + self.nodes + 1

    @property
    def slurmdbd_port(self) -> int:
        return self.port_base + self.nodes + 2

    @property
    def slurmdbd_conf(self) -> Path:
        """Next to slurm.conf: slurmdbd reads the one in SLURM_CONF's directory."""
        return self.root / "etc" / "slurmdbd.conf"

    @property
    def password_file(self) -> Path:
        return self.root / "etc" / "dbpass"

    @property
    def log_dir(self) -> Path:
        return self.root / "log"


def slurm_conf_lines(
    layout: AccountingLayout, munge_socket: Path, gpu_types: Sequence[str] = ()
) -> list[str]:
    """slurm.conf lines that replace ``accounting_storage/none`` when accounting is on.
    ``gpu_types``: the cluster's, each a TRES of its own so per-type limits are enforced."""
    return [
        "AccountingStorageType=accounting_storage/slurmdbd",
        "AccountingStorageHost=localhost",
        f"AccountingStoragePort={layout.slurmdbd_port}",
        # The munge socket of connections to slurmdbd (sacctmgr's, slurmctld's); AuthInfo's
        # socket= does not reach them on 22.05.
        f"AccountingStoragePass={munge_socket}",
        "AccountingStorageTRES=" + ",".join(["gres/gpu", *(f"gres/gpu:{t}" for t in gpu_types)]),
        "AccountingStorageEnforce=associations,limits,qos",
        # sacct shows each run's comment: the sia id joins the runs of one sia job.
        "AccountingStoreFlags=job_comment",
        "PriorityType=priority/multifactor",
        "PriorityWeightFairshare=10000",
    ]


def render_slurmdbd_conf(
    layout: AccountingLayout, slurm_user: str, munge_socket: Path, password: str
) -> str:
    return "\n".join(
        [
            "# Written by `sia-slurm dev-cluster up --accounting`.",
            "AuthType=auth/munge",
            f"AuthInfo=socket={munge_socket}",
            "DbdHost=localhost",
            f"DbdPort={layout.slurmdbd_port}",
            f"SlurmUser={slurm_user}",
            f"LogFile={layout.log_dir}/slurmdbd.log",
            f"PidFile={layout.root}/run/slurmdbd.pid",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",
            f"StoragePort={layout.mariadb_port}",
            "StorageUser=slurm",
            f"StoragePass={password}",
            f"StorageLoc={DATABASE}",
            "",
        ]
    )


@dataclass(frozen=True)
class AccountingPrograms:
    """The programs accounting runs. MariaDB is always the host's (any of these releases'
    slurmdbd works with Debian 12's MariaDB 10.11); slurmdbd and sacctmgr are the cluster's
    release, the host's or its root's (argv prefixes: ``chroot <root> /usr/sbin/slurmdbd``).

    A root's slurmdbd runs with the host's MariaDB client library (``client_library``, copied
    under the cluster's directory and put first on its ``LD_LIBRARY_PATH``): with the one of
    Debian 13 and later (Connector/C 3.4, libmariadb3 11.8.9) every query of slurmdbd 24.11 and
    26.05 fails ("Number of columns in result (=1) set exceeds maximum allowed number of
    columns (=0)", on MariaDB 10.11 and 11.8 alike), and it refuses a server without TLS.
    Debian 12's (Connector/C 3.3, the same soname) serves both releases."""

    mariadbd: str
    install_db: str
    mariadb: str
    slurmdbd: list[str]
    sacctmgr: list[str]
    client_library: Path | None = None  # for a root's slurmdbd


CLIENT_LIBRARY = "libmariadb.so.3"
LIBRARY_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib")


def find_client_library(dirs: Sequence[str] = LIBRARY_DIRS) -> Path | None:
    """The host's MariaDB client library (Debian's libmariadb3), if installed."""
    for directory in dirs:
        path = Path(directory) / CLIENT_LIBRARY
        if path.exists():
            return path.resolve()
    return None


def find_accounting_programs(programs: SlurmPrograms) -> AccountingPrograms:
    """MariaDB's programs on the host and the release's slurmdbd and sacctmgr (a root's with
    the host's client library), or an error naming the Debian packages to install."""
    path = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    names = ["mariadbd", "mariadb-install-db", "mariadb"]
    if programs.release == SYSTEM:
        names += ["slurmdbd", "sacctmgr"]
    found = {name: shutil.which(name, path=path) for name in names}
    missing = [name for name, where in found.items() if where is None]
    library = None if programs.release == SYSTEM else find_client_library()
    if programs.release != SYSTEM and library is None:
        missing.append(CLIENT_LIBRARY)
    if missing:
        raise DevClusterError(
            f"--accounting needs {', '.join(missing)}: apt-get install -y "
            f"--no-install-recommends {PACKAGES if programs.release == SYSTEM else DB_PACKAGES}"
        )
    if programs.release == SYSTEM:
        slurmdbd, sacctmgr = [str(found["slurmdbd"])], [str(found["sacctmgr"])]
    else:
        slurmdbd, sacctmgr = programs.argv("slurmdbd"), programs.argv("sacctmgr")
    return AccountingPrograms(
        str(found["mariadbd"]), str(found["mariadb-install-db"]), str(found["mariadb"]),
        slurmdbd, sacctmgr, library,
    )  # fmt: skip


def start_mariadb(layout: AccountingLayout, binaries: AccountingPrograms) -> DaemonRecord:
    """Initialise the database directory if new, start mariadbd as ``mysql`` (unprivileged,
    127.0.0.1 only) and wait for its socket."""
    try:
        account = pwd.getpwnam(DB_USER)
    except KeyError:
        raise DevClusterError(
            f"account {DB_USER!r} missing: it comes with Debian's mariadb-server"
        ) from None
    for directory in (layout.db_dir, layout.mariadb_run, layout.mariadb_tmp):
        directory.mkdir(parents=True, exist_ok=True)
        # mysql owns these from an earlier run: it could have swapped one for a symlink
        chown_path(directory, account.pw_uid, account.pw_gid, directory=True)
    if not (layout.db_dir / "mysql").is_dir():
        _setup(
            [
                binaries.install_db,
                "--no-defaults",
                f"--user={DB_USER}",
                f"--datadir={layout.db_dir}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
                f"--tmpdir={layout.mariadb_tmp}",  # passed on to the bootstrap mariadbd
            ],
            "mariadb-install-db",
        )
    layout.mariadb_socket.unlink(missing_ok=True)
    log = layout.log_dir / "mariadb.log"
    chown_path(log, account.pw_uid, account.pw_gid, directory=False, touch=True)
    record = start_daemon(
        "mariadbd",
        [
            binaries.mariadbd,
            "--no-defaults",
            f"--user={DB_USER}",
            f"--datadir={layout.db_dir}",
            f"--socket={layout.mariadb_socket}",
            f"--tmpdir={layout.mariadb_tmp}",
            f"--port={layout.mariadb_port}",
            "--bind-address=127.0.0.1",
            "--skip-name-resolve",
            f"--pid-file={layout.mariadb_run}/mysqld.pid",
            f"--log-error={log}",
            "--innodb-buffer-pool-size=32M",
            # slurmdbd's own advice for its tables (it warns below these)
            "--innodb-lock-wait-timeout=900",
            "--innodb-log-file-size=64M",
        ],
        layout.log_dir / "mariadb.out",
        marker=str(layout.db_dir),
    )
    return record


def wait_for_mariadb(layout: AccountingLayout, record: DaemonRecord) -> None:
    _wait(lambda: layout.mariadb_socket.exists(), record, 60, layout.log_dir / "mariadb.log")


def grant_slurmdbd(layout: AccountingLayout, binaries: AccountingPrograms) -> str:
    """Create (or reset) the database user slurmdbd logs in as; return its password, which
    lives only in slurmdbd.conf (mode 600, SlurmUser's)."""
    password = secrets.token_hex(12)
    sql = (
        f"CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
        f"ALTER USER 'slurm'@'127.0.0.1' IDENTIFIED BY '{password}'; "
        f"GRANT ALL ON `{DATABASE}`.* TO 'slurm'@'127.0.0.1';"
    )
    _setup(
        [*root_client(layout, binaries.mariadb), "-e", sql],
        "mariadb (creating slurmdbd's database user)",
    )
    return password


def root_client(layout: AccountingLayout, client: str) -> list[str]:
    """The ``mariadb`` client as the database's root, over the cluster's socket (root's
    socket authentication: no password), with no option file from the host."""
    return [client, "--no-defaults", "-S", str(layout.mariadb_socket), "-u", "root"]


def write_slurmdbd_conf(
    layout: AccountingLayout, slurm_user: str, munge_socket: Path, password: str
) -> None:
    """slurmdbd refuses a config others can read; it must be SlurmUser's, mode 600."""
    path = layout.slurmdbd_conf
    path.unlink(missing_ok=True)
    user = pwd.getpwnam(slurm_user)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, 0o600)
    with os.fdopen(fd, "w") as handle:
        os.fchown(fd, user.pw_uid, user.pw_gid)  # the file just created, never by path
        handle.write(render_slurmdbd_conf(layout, slurm_user, munge_socket, password))
    log = layout.log_dir / "slurmdbd.log"
    chown_path(log, user.pw_uid, user.pw_gid, directory=False, touch=True)


def start_slurmdbd(
    layout: AccountingLayout, binaries: AccountingPrograms, env: Mapping[str, str]
) -> DaemonRecord:
    """slurmdbd in the foreground, reading slurmdbd.conf from SLURM_CONF's directory; a
    root's with the host's MariaDB client library (:class:`AccountingPrograms` says why).

    slurmdbd has no option naming our files, so its command line carries the marker as its
    ``argv[0]`` (:func:`start_daemon` sets it for a program run directly; inside a root,
    where ``chroot`` would reset it, the root's bash execs it under that name)."""
    marker = f"slurmdbd:{layout.slurmdbd_conf}"
    *prefix, program = binaries.slurmdbd
    argv = [program, "-D"]
    env = dict(env)
    if prefix:
        argv = [*prefix, "/bin/bash", "-c", f'exec -a "$0" {program} -D', marker]
    if binaries.client_library is not None:
        lib_dir = layout.root / "lib"
        lib_dir.mkdir(exist_ok=True)
        shutil.copyfile(binaries.client_library, lib_dir / CLIENT_LIBRARY)
        env["LD_LIBRARY_PATH"] = str(lib_dir)
    return start_daemon("slurmdbd", argv, layout.log_dir / "slurmdbd.out", marker=marker, env=env)


def wait_for_slurmdbd(
    layout: AccountingLayout,
    record: DaemonRecord,
    binaries: AccountingPrograms,
    env: Mapping[str, str],
) -> None:
    """Until ``sacctmgr`` gets an answer from slurmdbd."""

    def answers() -> bool:
        proc = subprocess.run(
            [*binaries.sacctmgr, "-n", "-P", "show", "cluster"],
            capture_output=True,
            text=True,
            env={**os.environ, **env},
            timeout=20,
            check=False,
        )
        return proc.returncode == 0

    _wait(answers, record, 60, layout.log_dir / "slurmdbd.log", every_s=0.5)


def register_cluster(cluster: str, binaries: AccountingPrograms, env: Mapping[str, str]) -> None:
    """The cluster's record in slurmdbd, before slurmctld first registers with it."""
    _sacctmgr(["add", "cluster", cluster], binaries, env)


def create_associations(
    spec: AccountingSpec,
    cluster: str,
    binaries: AccountingPrograms,
    env: Mapping[str, str],
    timeout_s: float = 60.0,
) -> None:
    """Run the spec's sacctmgr commands once slurmctld has registered the ``gres/gpu`` TRES
    (limits on it are refused before); one that fails names its argv and output. An association
    that already exists (a restarted cluster) is not an error."""
    deadline = time.monotonic() + timeout_s
    while "gres|gpu" not in _sacctmgr(["-n", "-P", "show", "tres"], binaries, env):
        if time.monotonic() > deadline:
            raise DevClusterError(
                f"slurmctld did not register the gres/gpu TRES with slurmdbd in {timeout_s:g} s"
            )
        time.sleep(0.5)
    for command in sacctmgr_commands(spec, cluster):
        _sacctmgr(command, binaries, env)


def _sacctmgr(command: list[str], binaries: AccountingPrograms, env: Mapping[str, str]) -> str:
    argv = [*binaries.sacctmgr, "-i", *command]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env={**os.environ, **env}, timeout=30, check=False
    )
    said = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 and "Nothing new added" not in said and "already" not in said:
        raise DevClusterError(f"{' '.join(argv)} failed ({proc.returncode}): {said[-400:]}")
    return proc.stdout


def _setup(argv: list[str], what: str) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        raise DevClusterError(f"{what} failed ({proc.returncode}): {proc.stderr.strip()[-400:]}")


def _wait(
    ready: Any, record: DaemonRecord, timeout_s: float, log: Path, every_s: float = 0.1
) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if not is_alive(record) or time.monotonic() > deadline:
            try:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-10:])
            except OSError:
                tail = f"({log} unreadable)"
            state = "exited" if not is_alive(record) else f"not ready in {timeout_s:g} s"
            raise DevClusterError(f"{record.role} {state}:\n{tail}")
        time.sleep(every_s)


class AccountingSteps:
    """Starting accounting with a dev cluster (mixed into ``DevCluster``, as its fault
    operations are): its layout and ports, MariaDB and slurmdbd before slurmctld, the spec's
    associations once slurmctld has registered."""

    layout: ClusterLayout
    accounting: AccountingSpec | None
    _slurm: str

    # Provided by DevCluster.
    @property
    def env(self) -> dict[str, str]: ...
    def _save(self, spec: DevClusterSpec, records: list[DaemonRecord]) -> None: ...

    def accounting_layout(self, spec: DevClusterSpec) -> AccountingLayout:
        """Where accounting keeps its files, and its two ports after the slurmd ports."""
        return AccountingLayout(self.layout.root, self.layout.port_base, len(spec.node_names()))

    def _ports(self, spec: DevClusterSpec) -> list[int]:
        ports = self.layout.ports(spec)
        if self.accounting is not None:
            layout = self.accounting_layout(spec)
            ports += [layout.mariadb_port, layout.slurmdbd_port]
        return ports

    def _start_accounting(
        self, spec: DevClusterSpec, records: list[DaemonRecord], programs: SlurmPrograms
    ) -> None:
        """MariaDB, slurmdbd and the spec's associations, before slurmctld starts (which then
        registers with slurmdbd and enforces the associations' limits)."""
        assert self.accounting is not None
        binaries = find_accounting_programs(programs)
        layout = self.accounting_layout(spec)
        records.append(start_mariadb(layout, binaries))
        self._save(spec, records)
        wait_for_mariadb(layout, records[-1])
        password = grant_slurmdbd(layout, binaries)
        user = self.layout.controller_user
        write_slurmdbd_conf(layout, user, self.layout.munge_socket, password)
        records.append(start_slurmdbd(layout, binaries, self.env))
        self._save(spec, records)
        wait_for_slurmdbd(layout, records[-1], binaries, self.env)
        register_cluster("siadev", binaries, self.env)

    def _create_associations(self, programs: SlurmPrograms) -> None:
        """The spec's accounts, users, QOS and limits, with an association for the invoking
        user and SlurmUser (so the cluster's own checks and the controller keep working)."""
        if self.accounting is None:
            return
        binaries = find_accounting_programs(programs)
        users = [self.layout.user, self.layout.controller_user]
        create_associations(self.accounting.with_users(users), "siadev", binaries, self.env)
