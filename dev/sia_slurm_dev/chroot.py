"""A dev cluster of another Slurm release: daemons, client commands and jobs inside its root.

The host's Slurm (``--slurm system``, Debian 12's 22.05) runs straight from the host. Any other
release (``--slurm 24.11``/``26.05``) comes from the cached Debian root that
:mod:`sia_slurm_dev.roots` builds, and everything of that release runs inside it:

- **daemons**: ``chroot <mount point> /usr/sbin/slurmd ...``. slurmd forks each job's
  slurmstepd, so batch scripts, ``srun`` and the trainers run inside the root too.
- **client commands**: Slurm clients and daemons must be one release (a 22.05 ``squeue`` cannot
  talk to a 24.11 slurmctld), so the host reaches the cluster through small wrappers in
  ``<dir>/bin`` (``squeue``, ``scontrol``, ``sbatch``, ...), put on PATH by ``DevCluster.env``
  and usable as the controller's ``slurm.bin_dir``. Each runs the root's command with
  ``unshare --root``: root chroots directly; any other user (the controller's service account,
  the test users) gets a user namespace mapping only its own uid and gid onto themselves, so
  the command runs as that same user (munge vouches for the real uid) without privileges.
  Inside the root (a job calling ``srun`` with the wrappers still on its PATH) a wrapper runs
  the command directly.
- **what jobs and daemons need from the host** is bound into the root at the same path:
  /proc, /dev (with /dev/pts and /dev/shm: torch's shared memory), /sys, /etc/passwd, group,
  shadow and gshadow (the accounts must be the host's: slurmctld runs as the service account
  and jobs as the test users; slurmd's `su - USER` checks shadow), /etc/hosts (torch's
  rendezvous resolves the host's name), /tmp (the tests' shared directories and the default
  cluster dir), /home, the cluster's directory (config, munge socket, state, logs), the
  checkout and this Python's prefix (the root has its own, other, python3 without torch).
  Verified: the host's pyenv Python 3.11 with torch 2.13 imports torch, numpy, scipy, sqlite3,
  ssl and sia_slurm inside the trixie (24.11) root, which carries every library they load.

Each cluster binds the cached root at its own mount point, ``<dir>/root``, and mounts the rest
below it, so two clusters of one release never share a mount, and ``down`` unmounts every mount
under that point (deepest first; lazily if a leftover job process keeps one busy), also after a
failed ``up``. A bound /dev means files created under the root's /dev land in the host's /dev:
nothing here writes there.

Plans (what to mount, the argv of each command, the wrapper text) are pure functions, tested
with a fake runner; :class:`ChrootSlurm` carries them out.
"""

from __future__ import annotations

import os
import shlex
import shutil
import site
import stat
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from sia_slurm.safefiles import chmod_dir, chmod_path
from sia_slurm.slurm.runner import CommandError, CommandRunner
from sia_slurm_dev.roots import MARKER, mounts_under

SYSTEM = "system"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "slurmdbd")
CLIENTS = (
    "squeue", "scontrol", "sbatch", "scancel", "sinfo", "srun", "sacct", "salloc", "sstat",
    "sacctmgr", "sshare",
)  # fmt: skip
# Where Debian puts each program (inside a root; on the host PATH is searched).
_SBIN = frozenset(DAEMONS)
# Host directories a bind must never cover: the root's own system lives there. A Python under
# /usr (Debian's python3) cannot be shared this way; a venv or pyenv interpreter can.
_SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/etc", "/var", "/boot", "/run")
_SYSTEM_OK = ("/usr/local",)
# Host paths jobs and daemons of every dev cluster need, when they exist.
_HOST_DIRS = ("/tmp", "/home")
# The accounts must be the host's (slurmctld runs as the service account, jobs as the test
# users), shadow files included: slurmd loads a job's login environment (SLURM_GET_USER_ENV,
# e.g. `sbatch --export=NONE`, as the controller resubmits) with `su - USER`, whose PAM
# account check fails ("su: Authentication failure") for a user the shadow file lacks.
# /etc/hosts names this host as the host does (torch's c10d rendezvous resolves it: on the
# root's own /etc/hosts "vm" is unknown and the workers never meet).
_HOST_FILES = ("/etc/passwd", "/etc/group", "/etc/shadow", "/etc/gshadow", "/etc/hosts")
_DEV_SUBMOUNTS = ("/dev/pts", "/dev/shm")

Log = Callable[[str], None]


class ChrootError(RuntimeError):
    """A root could not be mounted, shared or unmounted; the message says what and how to fix."""


# ---- which programs: the host's or a root's -------------------------------------------------


class SlurmPrograms(Protocol):
    """The argv prefix that runs one Slurm or munge program of the cluster's release."""

    release: str

    def argv(self, program: str) -> list[str]: ...


# The host's Debian packages of the programs below (``system``).
PACKAGES = "slurmctld slurmd slurm-client munge"
_BINARIES = (
    "munged",
    "mungekey",
    "munge",
    "slurmctld",
    "slurmd",
    "scontrol",
    "sinfo",
    "squeue",
    "sbatch",
    "scancel",
)
_SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


@dataclass(frozen=True)
class HostPrograms:
    """The host's own Slurm (``system``): programs found on PATH and in /usr/sbin."""

    paths: dict[str, str]
    release: str = SYSTEM

    @classmethod
    def find(cls) -> HostPrograms:
        """The host's programs; :class:`ChrootError` naming the packages if any is missing
        (the error of every "this Slurm cannot run" here)."""
        found = {name: shutil.which(name, path=_SEARCH_PATH) for name in _BINARIES}
        missing = [name for name, path in found.items() if path is None]
        if missing:
            raise ChrootError(
                f"missing programs: {', '.join(missing)}. On Debian/Ubuntu install them with:\n"
                f"  apt-get install -y --no-install-recommends {PACKAGES}"
            )
        return cls({name: str(path) for name, path in found.items()})

    def argv(self, program: str) -> list[str]:
        return [self.paths[program]]


@dataclass(frozen=True)
class RootPrograms:
    """A release inside its root, mounted at ``mount_point``: ``chroot`` execs the program, so
    the pid a daemon's Popen gets is the daemon's own."""

    release: str
    mount_point: Path

    def argv(self, program: str) -> list[str]:
        return ["chroot", str(self.mount_point), in_root_path(program)]


def in_root_path(program: str) -> str:
    return f"/usr/sbin/{program}" if program in _SBIN else f"/usr/bin/{program}"


# ---- what to bind ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Mount:
    """One mount under the cluster's mount point: ``kind`` is ``bind`` (``source`` bound at
    ``target``) or ``proc`` (a procfs at ``target``). ``target`` is the host path."""

    kind: str
    source: str
    target: Path


def python_paths(
    prefixes: Iterable[str] | None = None, executable: str | None = None
) -> list[Path]:
    """Where this interpreter lives: its prefix (a venv's and its base), the directory of the
    executable, the site-packages dirs, and pyenv's root when the prefix is one of its
    versions (the shims on a job's PATH call into it)."""
    if prefixes is None:
        prefixes = [sys.prefix, sys.base_prefix, *site.getsitepackages()]
        user_site = site.getusersitepackages()
        if os.path.isdir(user_site):
            prefixes.append(user_site)
    paths = [Path(p) for p in prefixes]
    paths.append(Path(os.path.realpath(executable or sys.executable)).parent)
    for path in list(paths):
        parts = path.parts
        if ".pyenv" in parts and "versions" in parts[parts.index(".pyenv") :]:
            paths.append(Path(*parts[: parts.index(".pyenv") + 1]))
    return paths


def shared_paths(paths: Iterable[Path]) -> list[Path]:
    """The fewest directories covering ``paths`` (one under another is left out), sorted;
    :class:`ChrootError` for one the root's own system lives in."""
    resolved = sorted({Path(os.path.normpath(os.path.abspath(p))) for p in paths})
    for path in resolved:
        text = str(path)
        if path == Path("/") or any(text == d or d.startswith(text + "/") for d in _SYSTEM_DIRS):
            raise ChrootError(f"cannot bind {path} into a Slurm root: it would hide the root's own")
        if any(text.startswith(d + "/") for d in _SYSTEM_DIRS) and not any(
            text == ok or text.startswith(ok + "/") for ok in _SYSTEM_OK
        ):
            raise ChrootError(
                f"cannot bind {path} into a Slurm root: it lies in the root's own system "
                "directories (a Python under /usr cannot be shared with jobs there); use a "
                "venv or pyenv interpreter outside /usr, or --slurm system"
            )
    kept: list[Path] = []
    for path in resolved:
        if not any(path == k or k in path.parents for k in kept):
            kept.append(path)
    return kept


def mount_plan(
    mount_point: Path,
    cached_root: Path,
    shared: Sequence[Path],
    host_mounts: Iterable[str],
) -> list[Mount]:
    """The mounts that make ``mount_point`` a root jobs can run in, parents before children:
    the cached root itself, /proc, /dev and its pts/shm mounts that the host has
    (``host_mounts``: the host's mount points), /sys, the account files, then ``shared``."""
    mounted = set(host_mounts)

    def at(path: str | Path) -> Path:
        return mount_point / str(path).lstrip("/")

    plan = [
        Mount("bind", str(cached_root), mount_point),
        Mount("proc", "proc", at("/proc")),
        Mount("bind", "/dev", at("/dev")),
        *(Mount("bind", d, at(d)) for d in _DEV_SUBMOUNTS if d in mounted),
        Mount("bind", "/sys", at("/sys")),
        *(Mount("bind", f, at(f)) for f in _HOST_FILES),
        *(Mount("bind", str(p), at(p)) for p in shared),
    ]
    return plan


def mount_argvs(mount: Mount) -> list[list[str]]:
    """The commands for one mount; each bind is made private at once (a shared host mount
    would otherwise propagate later mounts into the root and ours back out)."""
    if mount.kind == "proc":
        return [["mount", "-t", "proc", "proc", str(mount.target)]]
    return [
        ["mount", "--bind", mount.source, str(mount.target)],
        ["mount", "--make-private", str(mount.target)],
    ]


# ---- the wrappers the host runs --------------------------------------------------------------


def wrapper_text(command: str, release: str, mount_point: Path) -> str:
    """A ``/bin/sh`` wrapper running the root's ``command`` from the host (see the module
    doc). The caller's directory is kept when the root has it (it does for everything bound),
    else the command runs in /. ``$0``-free and quoted: paths with spaces work."""
    root = shlex.quote(str(mount_point))
    target = in_root_path(command)
    return f"""#!/bin/sh
# Slurm {release}'s {command}, from the dev cluster's root at {mount_point}
# (written by `sia-slurm dev-cluster up`; dev/sia_slurm_dev/chroot.py).
root={root}
if [ ! -e "$root/{MARKER}" ]; then
    # Already inside the root (a job's srun): its command is right here.
    exec {target} "$@"
fi
wd=$(pwd -P 2>/dev/null) || wd=/
[ -d "$root$wd" ] || wd=/
if [ "$(id -u)" -eq 0 ]; then
    exec unshare --root="$root" --wd="$wd" {target} "$@"
fi
exec unshare --user --map-current-user --root="$root" --wd="$wd" {target} "$@"
"""


def write_wrappers(bin_dir: Path, release: str, mount_point: Path) -> list[Path]:
    """One wrapper per client command in ``bin_dir`` (0755, readable by every account)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    chmod_dir(bin_dir, 0o755)
    written = []
    for command in CLIENTS:
        path = bin_dir / command
        path.write_text(wrapper_text(command, release, mount_point))
        chmod_path(path, 0o755, directory=False)
        written.append(path)
    return written


# ---- carrying it out -------------------------------------------------------------------------


def host_mount_points(mountinfo: str) -> list[str]:
    """Every mount point in ``/proc/self/mountinfo`` text."""
    return [line.split()[4] for line in mountinfo.splitlines() if len(line.split()) > 4]


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


@dataclass
class ChrootSlurm:
    """The root of ``release`` (cached at ``cached_root``) mounted at ``mount_point`` with
    ``shared`` host paths bound in; :meth:`mount` and :meth:`unmount` run the plan."""

    release: str
    cached_root: Path
    mount_point: Path
    shared: list[Path]
    runner: CommandRunner
    log: Log = lambda message: None

    @property
    def programs(self) -> RootPrograms:
        return RootPrograms(self.release, self.mount_point)

    def plan(self) -> list[Mount]:
        host_mounts = host_mount_points(_mountinfo())
        return mount_plan(self.mount_point, self.cached_root, self.shared, host_mounts)

    def mount(self) -> None:
        """Mount the plan; on any failure unmount what was mounted and raise
        :class:`ChrootError` naming the mount."""
        self.unmount()  # what a killed `up` or `down` left behind
        self.mount_point.mkdir(parents=True, exist_ok=True)
        try:
            for mount in self.plan():
                self._make_target(mount)
                self._mirror_modes(mount)
                for argv in mount_argvs(mount):
                    self.runner.run(argv)
        except (CommandError, OSError) as exc:
            self.unmount()
            raise ChrootError(
                f"could not mount the Slurm {self.release} root at {self.mount_point}: {exc}"
            ) from None

    def _make_target(self, mount: Mount) -> None:
        """The mount point inside the root: created in the cached root when missing (an
        empty directory or file left there; the root stays usable by every cluster)."""
        if mount.target == self.mount_point or mount.target.exists():
            return
        if Path(mount.source).is_dir() or mount.kind == "proc":
            mount.target.mkdir(parents=True)
        else:
            mount.target.parent.mkdir(parents=True, exist_ok=True)
            mount.target.touch()

    def _mirror_modes(self, mount: Mount) -> None:
        """Give the directories above a bound host path inside the root the host's modes: a
        job traverses the root's /root, not the host's, to reach /root/.pyenv, so the o+x the
        tests grant on the host's /root (tests/accounts.py) must hold there too, and what the
        host keeps closed stays closed."""
        if mount.target == self.mount_point or mount.kind != "bind":
            return
        source = Path(mount.source)
        for host_dir in source.parents:
            if host_dir == Path("/"):
                break
            inside = self.mount_point / str(host_dir).lstrip("/")
            wanted = stat.S_IMODE(host_dir.stat().st_mode)
            if stat.S_IMODE(inside.stat().st_mode) != wanted:
                os.chmod(inside, wanted)

    def mounted(self) -> list[Path]:
        return mounts_under(self.mount_point, _mountinfo())

    def unmount(self) -> list[Path]:
        """Unmount everything at or under the mount point, deepest (latest) first; a mount a
        leftover process keeps busy is detached lazily (gone from the tree at once). Returns
        what was unmounted; :class:`ChrootError` if anything stays mounted."""
        done = []
        for target in reversed(self.mounted()):
            try:
                self.runner.run(["umount", str(target)])
            except CommandError as exc:
                self.log(f"umount {target} failed ({exc.stderr.strip()}); detaching it lazily")
                try:
                    self.runner.run(["umount", "--lazy", str(target)])
                except CommandError as lazy:
                    raise ChrootError(
                        f"could not unmount {target}: {lazy}; stop what runs inside "
                        f"{self.mount_point} and run `umount -R {self.mount_point}`"
                    ) from None
            done.append(target)
        left = self.mounted()
        if left:
            raise ChrootError(
                f"still mounted under {self.mount_point}: {' '.join(map(str, left))}; "
                f"run `umount -R {self.mount_point}`"
            )
        return done


def open_root(
    release: str,
    cluster_dir: Path,
    *,
    cache_dir: Path | None,
    runner: CommandRunner,
    log: Log,
    extra_shared: Iterable[Path] = (),
) -> ChrootSlurm:
    """The cached root of ``release`` (built first when missing: ~1 minute), ready to be
    mounted at ``<cluster_dir>/root`` with the checkout, this Python, the cluster's directory
    and the host's /tmp and /home shared."""
    # Imported here: building roots pulls in the lock and debootstrap code only when needed.
    from sia_slurm_dev.roots import RootError, ensure_root

    try:
        root = ensure_root(release, cache_dir, log=log)
    except RootError as exc:
        raise ChrootError(str(exc)) from None
    # dev/sia_slurm_dev/chroot.py: two levels up is the checkout (sia_slurm, launcher, tests)
    checkout = Path(__file__).resolve().parents[2]
    wanted = [
        *(Path(d) for d in _HOST_DIRS if os.path.isdir(d)),
        cluster_dir,
        checkout,
        *python_paths(),
        *extra_shared,
    ]
    return ChrootSlurm(
        release=release,
        cached_root=root.path,
        mount_point=cluster_dir / "root",
        shared=shared_paths(wanted),
        runner=runner,
        log=log,
    )
