"""``DevCluster``: bring a local multi-node Slurm up, report on it, and take it down.

Everything lives under one directory (config, munge key and socket, state, spool, logs, fake GPU
device files, and ``cluster.json`` recording the pids we started). ``up`` is idempotent: a
cluster already running there is reused, never started twice. Nothing is installed: missing
binaries are reported with the Debian packages that provide them.

With ``slurm_user`` slurmctld runs as that account (Slurm's SlurmUser, which Slurm treats as
privileged), as the controller's service account does in production: root starts slurmctld, it
drops to the account, and everything it writes (state, log, pid file) is made the account's
first. slurmd stays the invoking user (root), because it must start each job as its owner.

``slurm``: ``system`` runs the host's Slurm; a release such as ``24.11`` runs daemons, client
commands and jobs inside that release's cached Debian root (:mod:`sia_slurm_dev.chroot`:
what is bound in, the client wrappers in ``<dir>/bin`` that :attr:`DevCluster.env` puts on PATH
and :attr:`DevCluster.bin_dir` names for the controller's ``slurm.bin_dir``).
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from sia_slurm.protocol.profile import ProfileError
from sia_slurm.safefiles import chmod_dir, chmod_path, chown_path
from sia_slurm.slurm.observe.inventory import parse_nodes
from sia_slurm.slurm.runner import CommandError, SubprocessRunner
from sia_slurm_dev import slurmdbd as acct
from sia_slurm_dev.access import Account, untraversable
from sia_slurm_dev.accounts_spec import AccountingSpecError
from sia_slurm_dev.chroot import (
    SYSTEM,
    ChrootError,
    ChrootSlurm,
    HostPrograms,
    SlurmPrograms,
    open_root,
    write_wrappers,
)
from sia_slurm_dev.faults import (  # noqa: F401 (the helpers: tests import them here)
    DaemonFaults,
    DevClusterError,
    Recorded,
    _registered,
    _responding,
    _schedulable,
    parse_daemon,
)
from sia_slurm_dev.process import (
    DaemonRecord,
    is_alive,
    start_daemon,
    stop_daemons,
)
from sia_slurm_dev.slurm_conf import (
    ClusterLayout,
    PowerSavingConfig,
    render_cgroup_conf,
    render_gres_conf,
    render_power_programs,
    render_prolog,
    render_slurm_conf,
    render_task_prolog,
)
from sia_slurm_dev.spec import DevClusterSpec
from sia_slurm_dev.speed import spec_variables

DEFAULT_DIR = Path("/tmp/sia-slurm-dev")
DEFAULT_PORT_BASE = 16817

Log = Callable[[str], None]


class DevCluster(DaemonFaults, acct.AccountingSteps):
    """A dev cluster rooted at ``root``; ``spec`` and ``port_base`` matter only for ``up``."""

    def __init__(
        self,
        root: Path = DEFAULT_DIR,
        port_base: int = DEFAULT_PORT_BASE,
        log: Log | None = None,
        cred_expire_s: int = 30,
        slurm_user: str | None = None,
        slurmd_timeout_s: int = 10,
        slurm: str = SYSTEM,
        roots_dir: Path | None = None,
        accounting: acct.AccountingSpec | None = None,
        power_saving: PowerSavingConfig | None = None,
    ):
        """``slurm``: ``system`` (the host's Slurm) or a release with a Debian root
        (``24.11``, ``26.05``), built into ``roots_dir`` (default: ``$SIA_SLURM_ROOTS`` or
        /var/cache/sia-slurm/roots) when missing. ``slurm_user``: the account slurmctld
        drops to (SlurmUser); None keeps the invoking user, as before service accounts
        existed. The account must exist when ``up`` runs.
        ``slurmd_timeout_s``: Slurm's SlurmdTimeout (a node whose slurmd is gone is DOWN
        after it, :class:`ClusterLayout`). ``power_saving``: on some nodes, boots fail."""
        root = Path(root).absolute()
        self.layout = ClusterLayout(
            root=root,
            hostname=socket.gethostname(),
            user=getpass.getuser(),
            port_base=port_base,
            cred_expire_s=cred_expire_s,
            slurm_user=slurm_user,
            slurmd_timeout_s=slurmd_timeout_s,
            power_saving=power_saving,
        )
        self._log = log or (lambda message: None)
        self._slurm = slurm
        self._roots_dir = roots_dir
        # Slurm accounting (slurmdbd on MariaDB, associations from the spec); None: none.
        self.accounting = accounting

    @property
    def slurm(self) -> str:
        """The release running (as recorded), else the one asked for: ``system``, ``24.11``..."""
        recorded = self._recorded()
        return recorded.slurm if recorded is not None else self._slurm

    @property
    def bin_dir(self) -> Path | None:
        """Where this cluster's client commands are, for the controller's ``slurm.bin_dir``:
        None (search PATH) for the host's Slurm, the wrappers of a root's release otherwise."""
        return None if self.slurm == SYSTEM else self.layout.bin_dir

    @property
    def env(self) -> dict[str, str]:
        """Environment for Slurm client commands aimed at this cluster: SLURM_CONF and, for a
        root's release, PATH starting with its wrappers (a 22.05 client cannot talk to a
        newer slurmctld)."""
        env = {"SLURM_CONF": str(self.layout.slurm_conf)}
        bin_dir = self.bin_dir
        if bin_dir is not None:
            env["PATH"] = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
        return env

    def runner(self, timeout_s: float = 30.0) -> SubprocessRunner:
        return SubprocessRunner(env=self.env, timeout_s=timeout_s)

    # ---- lifecycle ------------------------------------------------------------------------

    def up(self, spec: DevClusterSpec, timeout_s: float = 90.0) -> bool:
        """Start the cluster unless it already runs; return True when it was started now."""
        running = self._recorded()
        if running is not None:
            records = running.daemons
            alive = [r for r in records if is_alive(r)]
            if len(alive) == len(records):
                wanted = (str(spec), self.layout.controller_user)
                if (running.spec, running.slurm_user) != wanted:
                    raise DevClusterError(
                        f"a dev cluster with spec {running.spec} and SlurmUser "
                        f"{running.slurm_user} already runs in {self.layout.root}; run "
                        f"`sia-slurm dev-cluster down --dir {self.layout.root}` first to start "
                        f"one with spec {spec} and SlurmUser {self.layout.controller_user}"
                    )
                self._log(f"dev cluster already up in {self.layout.root} ({running.spec})")
                return False
            if alive:
                dead = ", ".join(r.role for r in records if r not in alive)
                raise DevClusterError(
                    f"the dev cluster in {self.layout.root} is partly running ({dead} stopped); "
                    f"start what was killed with `sia-slurm dev-cluster start DAEMON --dir "
                    f"{self.layout.root}`, or run `sia-slurm dev-cluster down --dir "
                    f"{self.layout.root}` and then up again"
                )
            self.layout.state_file.unlink()
        account = self._slurm_account()
        self._check_ports(spec)
        if self.accounting is not None:
            try:
                self.accounting.check_gpu_types(g.gpu_type for g in spec.groups)
            except AccountingSpecError as exc:
                raise DevClusterError(str(exc)) from None
        chroot = self._open_root()
        records: list[DaemonRecord] = []
        try:
            programs = self._mount(chroot)
            self._prepare_files(spec, programs, account)
            records.append(self._start_munge(programs))
            self._save(spec, records)
            if self.accounting is not None:
                self._start_accounting(spec, records, programs)
            records.append(self._start_slurmctld(programs, clear_state=True))
            self._save(spec, records)
            self._wait_for_controller(records[-1], timeout_s)
            self._create_associations(programs)
            for node in spec.node_names():
                records.append(self._start_slurmd(programs, node))
            self._save(spec, records)
            self._wait_for_idle(spec, timeout_s)
        except BaseException:
            stop_daemons(list(reversed(records)))
            self.layout.state_file.unlink(missing_ok=True)
            try:
                self._unmount(chroot)
            except DevClusterError as exc:  # the failure that brought us here matters more
                self._log(str(exc))
            raise
        self._log(f"dev cluster up in {self.layout.root}: {spec}")
        return True

    def down(self, timeout_s: float = 30.0) -> bool:
        """Cancel every job, then stop exactly the daemons we started; False if none ran."""
        recorded = self._recorded()
        if recorded is None:
            self._log(f"no dev cluster recorded in {self.layout.root}")
            # An `up` killed between mounting a root and recording its daemons left mounts.
            self._unmount(self._chroot("leftover"))
            return False
        records = recorded.daemons
        controller = next((r for r in records if r.role == "slurmctld"), None)
        if controller is not None and is_alive(controller):
            self._cancel_all_jobs(timeout_s)
        killed = stop_daemons(list(reversed(records)))
        if killed:
            self._log(f"had to SIGKILL: {', '.join(killed)}")
        if recorded.slurm != SYSTEM:
            self._unmount(self._chroot(recorded.slurm))
        self.layout.state_file.unlink(missing_ok=True)
        self._log(f"dev cluster in {self.layout.root} stopped")
        return True

    def is_up(self) -> bool:
        recorded = self._recorded()
        return recorded is not None and all(is_alive(r) for r in recorded.daemons)

    def status(self) -> str:
        """Daemons, nodes (state and GRES per partition) and the job queue, as text."""
        recorded = self._recorded()
        if recorded is None:
            return f"no dev cluster in {self.layout.root}"
        records = recorded.daemons
        lines = [
            f"dev cluster in {self.layout.root}: {recorded.spec}",
            f"SlurmUser (slurmctld runs as): {recorded.slurm_user}",
            f"Slurm: {recorded.slurm}",
            f"export SLURM_CONF={self.layout.slurm_conf}",
            *([f'export PATH={self.layout.bin_dir}:"$PATH"'] if recorded.slurm != SYSTEM else []),
            "",
            "daemons:",
        ]
        alive = [is_alive(r) for r in records]
        lines += [
            f"  {r.role:<20} pid {r.pid:<8} {'running' if up else 'STOPPED'}"
            for r, up in zip(records, alive, strict=True)
        ]
        if not all(alive):
            return "\n".join(lines)
        runner = self.runner()
        nodes = runner.run(["sinfo", "-N", "-o", "%N %P %T %G"]).stdout
        queue = runner.run(["squeue", "-o", "%i %P %j %u %T %D %b %R"]).stdout
        lines += ["", "nodes:"] + [f"  {line}" for line in nodes.splitlines()]
        lines += ["", "jobs:"] + [f"  {line}" for line in queue.splitlines()]
        return "\n".join(lines)

    # ---- steps of up/down -----------------------------------------------------------------

    def _check_ports(self, spec: DevClusterSpec) -> None:
        for port in self._ports(spec):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    probe.bind(("0.0.0.0", port))
                except OSError:
                    raise DevClusterError(
                        f"port {port} is in use; the dev cluster needs ports "
                        f"{self.layout.port_base}-{self._ports(spec)[-1]}: pick another "
                        "range with --port-base"
                    ) from None

    def _slurm_account(self, name: str | None = None) -> Account | None:
        """SlurmUser's account when one was asked for (None: slurmctld stays the invoking
        user, as always). A missing account is the administrator's to create, never ours.
        ``name``: the account a running cluster recorded, instead of the one asked for."""
        name = name or self.layout.slurm_user
        if name is None:
            return None
        account = Account.lookup(name)
        if account is None:
            raise DevClusterError(
                f"SlurmUser {name!r} does not exist: create the service account first, e.g. "
                f"`useradd --system --no-create-home --shell /usr/sbin/nologin {name}`"
            )
        return account

    # ---- the release: the host's programs or a root's ------------------------------------

    def _chroot(self, release: str) -> ChrootSlurm:
        """The root of ``release`` as mounted for this cluster (it is not built here)."""
        return ChrootSlurm(
            release, Path("/"), self.layout.root / "root", [], SubprocessRunner(), self._log
        )

    def _open_root(self) -> ChrootSlurm | None:
        """The root of the release asked for (built if missing), None for the host's."""
        if self._slurm == SYSTEM:
            return None
        try:
            return open_root(
                self._slurm,
                self.layout.root,
                cache_dir=self._roots_dir,
                runner=SubprocessRunner(),
                log=self._log,
            )
        except ChrootError as exc:
            raise DevClusterError(str(exc)) from None

    def _mount(self, chroot: ChrootSlurm | None) -> SlurmPrograms:
        """Mount the root (if any) and write its client wrappers; the programs to run."""
        if chroot is None:
            return self._programs(SYSTEM)
        try:
            chroot.mount()
        except ChrootError as exc:
            raise DevClusterError(str(exc)) from None
        write_wrappers(self.layout.bin_dir, chroot.release, chroot.mount_point)
        self._log(f"Slurm {chroot.release} from {chroot.cached_root} at {chroot.mount_point}")
        return chroot.programs

    def _unmount(self, chroot: ChrootSlurm | None) -> None:
        if chroot is None:
            return
        try:
            chroot.unmount()
        except ChrootError as exc:
            raise DevClusterError(str(exc)) from None
        shutil.rmtree(self.layout.bin_dir, ignore_errors=True)

    def _programs(self, release: str) -> SlurmPrograms:
        """The programs of a running cluster's ``release`` (its root is still mounted)."""
        if release == SYSTEM:
            try:
                return HostPrograms.find()
            except ChrootError as exc:
                raise DevClusterError(str(exc)) from None
        return self._chroot(release).programs

    def _prepare_files(
        self, spec: DevClusterSpec, programs: SlurmPrograms, account: Account | None
    ) -> None:
        layout = self.layout
        for sub in ("etc", "state", "spool", "run", "log", "dev"):
            (layout.root / sub).mkdir(parents=True, exist_ok=True)
        blocked = untraversable(layout.root / "etc", account) if account else []
        if account and blocked:
            names = " ".join(str(d) for d in blocked)
            raise DevClusterError(
                f"slurmctld runs as {account.name} (SlurmUser), which cannot enter {names}: "
                f"let others traverse them (`chmod o+x {names}`) or use another --dir"
            )
        # munged insists that its key and key directory are private, and the socket
        # directory must be reachable by every user that submits jobs.
        layout.munge_key.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        chmod_dir(layout.munge_key.parent, 0o700)
        chmod_dir(layout.munge_socket.parent, 0o755)
        if not layout.munge_key.exists():
            _run_setup([*programs.argv("mungekey"), "-c", "-k", str(layout.munge_key)])
        shutil.rmtree(layout.state_dir)
        layout.state_dir.mkdir()
        self._make_gpu_files(spec)
        files = [
            (layout.slurm_conf, render_slurm_conf(spec, layout)),
            (layout.gres_conf, render_gres_conf(spec, layout)),
            (layout.prolog, render_prolog(layout)),
            (layout.task_prolog, render_task_prolog(self._emulation_variables(spec))),
            *render_power_programs(layout),  # used only with power saving
        ]
        layout.cgroup_conf.unlink(missing_ok=True)
        if programs.release != SYSTEM:  # 24.11 and 26.05 (render_cgroup_conf says why)
            files.append((layout.cgroup_conf, render_cgroup_conf()))
        if self.accounting is not None:
            lines = acct.slurm_conf_lines(
                self.accounting_layout(spec),
                layout.munge_socket,
                tuple(dict.fromkeys(g.gpu_type for g in spec.groups)),
            )
            files[0] = (
                layout.slurm_conf,
                files[0][1].replace(
                    "AccountingStorageType=accounting_storage/none\n", "\n".join(lines) + "\n"
                ),
            )
        for path, text in files:
            path.write_text(text)
            # Every client and SlurmUser read these; a umask of 077 must not hide them.
            chmod_path(path, 0o755 if path.suffix == ".sh" else 0o644, directory=False)
        layout.prolog_failure.parent.mkdir(exist_ok=True)
        layout.prolog_failure.unlink(missing_ok=True)
        if account is not None:
            self._hand_to_slurm_user(account)

    def _emulation_variables(self, spec: DevClusterSpec) -> dict[str, str]:
        """SIA_DEVCLUSTER_SPEED/_MEMORY for the task prolog, from the shipped profiles (a
        checkout without them cannot emulate its GPU types: say so, as for missing binaries)."""
        try:
            return spec_variables(spec)
        except ProfileError as exc:
            raise DevClusterError(f"cannot derive the GPU types' speed and memory: {exc}") from None

    def _hand_to_slurm_user(self, account: Account) -> None:
        """Make what slurmctld writes SlurmUser's: once it has dropped to that account it
        must still write its state and append to its log (it creates the pid file as root
        and chowns it itself, but a stale one from an earlier run would be root's)."""
        layout = self.layout
        if account.uid == os.geteuid():
            return
        layout.slurmctld_pid.unlink(missing_ok=True)
        chown_path(layout.state_dir, account.uid, account.gid, directory=True)
        chown_path(layout.slurmctld_log, account.uid, account.gid, directory=False, touch=True)

    def _make_gpu_files(self, spec: DevClusterSpec) -> None:
        """Character devices 195:N (like /dev/nvidiaN) so Slurm sets CUDA_VISIBLE_DEVICES.

        Without root (no mknod) plain empty files still make typed GPUs schedulable; jobs then
        see SLURM_GPUS_ON_NODE but an empty CUDA_VISIBLE_DEVICES.
        """
        minor = 0
        for group in spec.groups:
            for node in group.node_names():
                for path in self.layout.gpu_files(node, group.gpus_per_node):
                    if not path.exists():
                        try:
                            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(195, minor % 256))
                        except PermissionError:
                            path.touch()
                    minor += 1

    def _start_munge(self, programs: SlurmPrograms) -> DaemonRecord:
        layout = self.layout
        layout.munge_socket.unlink(missing_ok=True)
        record = start_daemon(
            "munged",
            [
                *programs.argv("munged"),
                "--foreground",
                "--force",
                f"--socket={layout.munge_socket}",
                f"--key-file={layout.munge_key}",
                f"--pid-file={layout.root}/run/munged.pid",
                f"--log-file={layout.log_dir}/munged.log",
                f"--seed-file={layout.root}/run/munged.seed",
            ],
            layout.log_dir / "munged.out",
            marker=str(layout.munge_socket),
        )
        deadline = time.monotonic() + 15
        while not layout.munge_socket.exists():
            if time.monotonic() > deadline or not is_alive(record):
                raise DevClusterError(
                    "munged did not start: " + _tail(layout.log_dir / "munged.out")
                )
            time.sleep(0.05)
        return record

    def _start_slurmctld(self, programs: SlurmPrograms, *, clear_state: bool) -> DaemonRecord:
        return start_daemon(
            "slurmctld",
            slurmctld_argv(programs.argv("slurmctld"), self.layout.slurm_conf, clear_state),
            self.layout.log_dir / "slurmctld.out",
            marker=str(self.layout.slurm_conf),
        )

    def _start_slurmd(self, programs: SlurmPrograms, node: str) -> DaemonRecord:
        return start_daemon(
            f"slurmd:{node}",
            [*programs.argv("slurmd"), "-D", "-N", node, "-f", str(self.layout.slurm_conf)],
            self.layout.log_dir / f"slurmd-{node}.out",
            marker=str(self.layout.slurm_conf),
        )

    def _wait_for_controller(self, controller: DaemonRecord, timeout_s: float) -> None:
        runner = self.runner(timeout_s=10)
        deadline = time.monotonic() + timeout_s
        while True:
            if not is_alive(controller):
                raise DevClusterError(f"slurmctld exited:\n{_tail(self.layout.slurmctld_log)}")
            try:
                if "is UP" in runner.run(["scontrol", "ping"], check=False).stdout:
                    return
            except CommandError:
                pass
            if time.monotonic() > deadline:
                raise DevClusterError(
                    "slurmctld did not answer `scontrol ping` within "
                    f"{timeout_s:g} s:\n{_tail(self.layout.slurmctld_log)}"
                )
            time.sleep(0.2)

    def _wait_for_idle(self, spec: DevClusterSpec, timeout_s: float) -> None:
        """Wait until every node is IDLE, resuming nodes that registered as DOWN."""
        runner = self.runner(timeout_s=10)
        wanted = set(spec.node_names())
        deadline = time.monotonic() + timeout_s
        resumed: set[str] = set()
        while True:
            nodes = {
                n.name: n
                for n in parse_nodes(runner.run(["scontrol", "-o", "show", "node"]).stdout)
                if n.name in wanted
            }
            states = {name: node.state.upper() for name, node in nodes.items()}
            if len(states) == len(wanted) and all(s == "IDLE" for s in states.values()):
                return
            for name, state in states.items():
                if (
                    ("DOWN" in state or "DRAIN" in state)
                    and name not in resumed
                    and "NOT_RESPONDING" not in state
                    and not state.endswith("*")
                ):
                    runner.run(
                        ["scontrol", "update", f"nodename={name}", "state=resume"], check=False
                    )
                    resumed.add(name)
            if time.monotonic() > deadline:
                report = ", ".join(f"{n}={s}" for n, s in sorted(states.items()))
                raise DevClusterError(
                    f"nodes did not become idle within {timeout_s:g} s ({report}); see the logs "
                    f"in {self.layout.log_dir}"
                )
            time.sleep(0.2)

    def _cancel_all_jobs(self, timeout_s: float) -> None:
        runner = self.runner(timeout_s=10)
        try:
            jobs = runner.run(["squeue", "-h", "-o", "%A"]).stdout.split()
            if not jobs:
                return
            runner.run(["scancel", *jobs], check=False)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                states = runner.run(["squeue", "-h", "-o", "%T"]).stdout.split()
                if all(s in ("COMPLETED", "CANCELLED", "FAILED") for s in states):
                    return
                time.sleep(0.2)
            self._log(f"jobs still present after {timeout_s:g} s; stopping the daemons anyway")
        except CommandError as exc:
            self._log(f"could not cancel jobs: {exc}")

    # ---- the record of what we started ----------------------------------------------------

    def _save(
        self,
        spec: DevClusterSpec,
        records: list[DaemonRecord],
        slurm_user: str | None = None,
        slurm: str | None = None,
    ) -> None:
        payload = {
            "spec": str(spec),
            "slurm_user": slurm_user or self.layout.controller_user,
            "port_base": self.layout.port_base,
            "slurm_conf": str(self.layout.slurm_conf),
            "slurm": self._slurm if slurm is None else slurm,
            "daemons": [asdict(r) for r in records],
        }
        tmp = self.layout.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(payload, indent=2))
        tmp.replace(self.layout.state_file)

    def _recorded(self) -> Recorded | None:
        path = self.layout.state_file
        if not path.exists():
            return None
        try:
            payload = json.loads(path.read_text())
            records = [DaemonRecord(**item) for item in payload["daemons"]]
            # Records written before SlurmUser was a choice ran slurmctld as the invoker.
            slurm_user = str(payload.get("slurm_user", self.layout.user))
            slurm = str(payload.get("slurm", SYSTEM))
            return Recorded(str(payload["spec"]), slurm_user, records, slurm)
        except (ValueError, KeyError, TypeError) as exc:
            raise DevClusterError(
                f"{path}: unreadable record of the dev cluster ({exc}); "
                "stop its daemons by hand and delete the file"
            ) from None


def slurmctld_argv(program: list[str], slurm_conf: Path, clear_state: bool) -> list[str]:
    """slurmctld in the foreground; ``-c`` (a fresh cluster) forgets every job and node state
    in StateSaveLocation, so a restart must go without it. ``program``: its argv prefix."""
    return [*program, "-D", *(["-c"] if clear_state else []), "-f", str(slurm_conf)]


def _run_setup(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise DevClusterError(f"{' '.join(argv)} failed: {proc.stderr.strip()}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return f"({path} does not exist)"
