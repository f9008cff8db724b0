"""Debian roots that hold one Slurm release each, for a dev cluster of a release the host lacks.

``sia-slurm dev-cluster root 24.11`` builds, once, with ``debootstrap --variant=minbase``, a
Debian root whose packages ``slurmctld slurmd slurmdbd slurm-client munge python3`` are that
release, and
keeps it under the cache directory (``/var/cache/sia-slurm/roots/<release>``, or
``$SIA_SLURM_ROOTS/<release>``). The daemons and client commands then run as
``chroot <root> ...`` (``scripts/capture_slurm_fixtures.py`` does that by hand).

Verified on Debian 12 (2026-11): trixie gives Slurm 24.11.5 in about 70 s (~350 MB); forky
(Debian testing) gives 26.05.x. bookworm's debootstrap has no script named ``forky``; Debian's
``sid`` script builds every current suite, so it is passed explicitly.

A root is built into a hidden ``.<release>.partial-<pid>`` directory and renamed into place
only once ``slurmctld -V`` inside it names the release asked for, with a marker file written
just before the rename: a root in place is complete, and a partial one left by an interrupted
build is removed and built again (never while anything is mounted under it: a bound ``/dev``
would be deleted with it). One build per release at a time (a lock file beside the roots).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.slurm.runner import CommandError, CommandRunner, SubprocessRunner

# The Debian suite whose Slurm is each release (Debian names one Slurm per suite).
RELEASE_SUITES = {"24.11": "trixie", "26.05": "forky"}
PACKAGES = ("slurmctld", "slurmd", "slurmdbd", "slurm-client", "munge", "python3")
# Added to roots built before they were in PACKAGES (apt-get inside the root; see add_packages):
# the dev cluster's accounting (--accounting) runs the release's own slurmdbd.
LATER_PACKAGES = ("slurmdbd",)
DEFAULT_MIRROR = "http://deb.debian.org/debian"
DEFAULT_CACHE_DIR = Path("/var/cache/sia-slurm/roots")
CACHE_ENV = "SIA_SLURM_ROOTS"
DEBOOTSTRAP_SCRIPT = Path("/usr/share/debootstrap/scripts/sid")
MARKER = ".sia-slurm-root.json"
# debootstrap of a minbase root with Slurm took ~70 s here; a slow mirror may take far longer.
BUILD_TIMEOUT_S = 1800.0

Log = Callable[[str], None]
_VERSION = re.compile(r"^slurm(?:-wlm)?\s+(?P<version>\d+\.\d+\.\d+\S*)\s*$", re.MULTILINE)


class RootError(RuntimeError):
    """A Slurm root could not be built or is not what was asked for; the message says why."""


@dataclass(frozen=True)
class SlurmRoot:
    release: str  # "24.11"
    suite: str  # "trixie"
    path: Path
    version: str  # what `slurmctld -V` printed inside the root: "24.11.5"


def suite_of(release: str) -> str:
    """The Debian suite carrying ``release``; :class:`RootError` lists the known releases."""
    try:
        return RELEASE_SUITES[release]
    except KeyError:
        known = ", ".join(sorted(RELEASE_SUITES))
        raise RootError(
            f"no Debian root known for Slurm {release!r}; choose one of {known}"
        ) from None


def default_cache_dir(environ: dict[str, str] | None = None) -> Path:
    """``$SIA_SLURM_ROOTS`` when set, else :data:`DEFAULT_CACHE_DIR`."""
    value = (os.environ if environ is None else environ).get(CACHE_ENV, "")
    return Path(value) if value else DEFAULT_CACHE_DIR


def root_dir(cache_dir: Path, release: str) -> Path:
    suite_of(release)
    return cache_dir / release


def partial_dir(cache_dir: Path, release: str, pid: int) -> Path:
    return cache_dir / f".{release}.partial-{pid}"


def partial_dirs(cache_dir: Path, release: str) -> list[Path]:
    """Builds of ``release`` left behind by an interrupted run."""
    return sorted(cache_dir.glob(f".{release}.partial-*"))


def debootstrap_argv(
    suite: str, target: Path, mirror: str = DEFAULT_MIRROR, script: Path = DEBOOTSTRAP_SCRIPT
) -> list[str]:
    return [
        "debootstrap",
        "--variant=minbase",
        f"--include={','.join(PACKAGES)}",
        suite,
        str(target),
        mirror,
        str(script),
    ]


def missing_packages(marker: dict[str, str]) -> list[str]:
    """The packages of :data:`LATER_PACKAGES` a root's marker does not list."""
    have = set(marker.get("packages", "").split(","))
    return [p for p in LATER_PACKAGES if p not in have]


def apt_install_argv(root: Path, packages: list[str]) -> list[str]:
    """apt-get inside ``root``, from the root's own package lists (the versions of the Slurm
    it already has)."""
    return [
        "chroot", str(root), "apt-get", "install", "-y", "-qq", "--no-install-recommends",
        *packages,
    ]  # fmt: skip


POLICY_RC = "#!/bin/sh\n# sia-slurm: no service starts inside this root\nexit 101\n"


def add_packages(root: Path, marker: dict[str, str], runner: CommandRunner, log: Log) -> None:
    """Install what :func:`missing_packages` names into a finished root and record it in its
    marker. Services never start there (policy-rc.d); stale package lists (the suite moved
    on) are updated and the install tried again; each package must end up installed."""
    packages = missing_packages(marker)
    if not packages:
        return
    log(f"adding {' '.join(packages)} to {root}")
    policy = root / "usr" / "sbin" / "policy-rc.d"
    if not policy.exists():
        policy.write_text(POLICY_RC)
        policy.chmod(0o755)
    try:
        try:
            runner.run(apt_install_argv(root, packages))
        except CommandError:
            runner.run(["chroot", str(root), "apt-get", "update", "-qq"])
            runner.run(apt_install_argv(root, packages))
        for package in packages:
            status = runner.run(
                ["chroot", str(root), "dpkg-query", "-W", "-f=${Status}", package], check=False
            )
            if status.stdout.strip() != "install ok installed":
                raise CommandError(status.argv, status.returncode, status.stdout)
    except CommandError as exc:
        raise RootError(
            f"could not add {' '.join(packages)} to {root}: {exc}; remove {root} (nothing "
            "mounted under it) to build it again"
        ) from None
    listed = [p for p in marker.get("packages", "").split(",") if p]
    marker = {**marker, "packages": ",".join([*listed, *packages])}
    (root / MARKER).write_text(json.dumps(marker, indent=2) + "\n")


def slurm_version_argv(root: Path) -> list[str]:
    return ["chroot", str(root), "/usr/sbin/slurmctld", "-V"]


def parse_slurm_version(text: str) -> str:
    """``24.11.5`` from ``slurmctld -V`` (``slurm 24.11.5``); :class:`RootError` quotes it."""
    match = _VERSION.search(text)
    if match is None:
        raise RootError(f"slurmctld -V printed no version: {text.strip()[:200]!r}")
    return match["version"]


def check_release(version: str, release: str, where: Path) -> None:
    """Refuse a root whose Slurm is not ``release`` (``24.11.5`` is release ``24.11``)."""
    if not version.startswith(release + "."):
        raise RootError(
            f"{where} holds Slurm {version}, not {release} (Debian {suite_of(release)} moved "
            f"on?); remove {where} or pass another --cache-dir"
        )


def mounts_under(path: Path, mountinfo: str) -> list[Path]:
    """Mount points at or below ``path`` in ``/proc/self/mountinfo`` text."""
    base = os.path.normpath(str(path))
    found = []
    for line in mountinfo.splitlines():
        fields = line.split()
        if len(fields) < 5:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), fields[4])
        if point == base or point.startswith(base + "/"):
            found.append(Path(point))
    return found


def remove_unmounted(path: Path, mountinfo: str) -> None:
    """Delete ``path`` unless something is mounted under it (a bound /dev would go with it)."""
    mounted = mounts_under(path, mountinfo)
    if mounted:
        listed = " ".join(str(p) for p in mounted)
        raise RootError(f"will not remove {path}: mounted under it: {listed}; umount them first")
    shutil.rmtree(path)


def read_marker(root: Path) -> dict[str, str] | None:
    try:
        data = json.loads((root / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@contextlib.contextmanager
def _locked(lock_file: Path, log: Log) -> Iterator[None]:
    with open(lock_file, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log(f"waiting for another build holding {lock_file}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _mountinfo() -> str:
    return Path("/proc/self/mountinfo").read_text()


def _ensure_debootstrap(runner: CommandRunner, log: Log) -> None:
    if shutil.which("debootstrap") or Path("/usr/sbin/debootstrap").exists():
        return
    log("debootstrap is missing: apt-get install debootstrap")
    try:
        runner.run(["apt-get", "update", "-qq"])
        runner.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "debootstrap"])
    except CommandError as exc:
        raise RootError(f"could not install debootstrap: {exc}") from None


def installed_version(root: Path, release: str, runner: CommandRunner) -> str:
    """The Slurm version inside ``root``, refused unless it is ``release``."""
    try:
        text = runner.run(slurm_version_argv(root)).stdout
    except CommandError as exc:
        raise RootError(f"cannot run slurmctld inside {root}: {exc}") from None
    version = parse_slurm_version(text)
    check_release(version, release, root)
    return version


def ensure_root(
    release: str,
    cache_dir: Path | None = None,
    *,
    runner: CommandRunner | None = None,
    log: Log = lambda message: None,
    mirror: str = DEFAULT_MIRROR,
) -> SlurmRoot:
    """The cached root of ``release``, built first if there is none (needs root)."""
    suite = suite_of(release)
    cache_dir = default_cache_dir() if cache_dir is None else cache_dir
    if os.geteuid() != 0:
        raise RootError("building or checking a Slurm root needs root (debootstrap, chroot)")
    runner = runner or SubprocessRunner(
        env={"DEBIAN_FRONTEND": "noninteractive"}, timeout_s=BUILD_TIMEOUT_S
    )
    cache_dir.mkdir(parents=True, exist_ok=True)
    final = root_dir(cache_dir, release)
    with _locked(cache_dir / f".{release}.lock", log):
        if final.exists():
            marker = read_marker(final)
            if marker is None or marker.get("release") != release:
                raise RootError(
                    f"{final} exists but is not a finished root of Slurm {release} (no valid "
                    f"{MARKER}); remove it (nothing may be mounted under it) and run again"
                )
            add_packages(final, marker, runner, log)
            version = installed_version(final, release, runner)
            log(f"Slurm {version} (Debian {suite}) already in {final}")
            return SlurmRoot(release, suite, final, version)
        for stale in partial_dirs(cache_dir, release):
            log(f"removing the unfinished build {stale}")
            remove_unmounted(stale, _mountinfo())
        _ensure_debootstrap(runner, log)
        building = partial_dir(cache_dir, release, os.getpid())
        log(f"debootstrap {suite} into {building} (Slurm {release}; a minute or more)")
        started = time.monotonic()
        try:
            runner.run(debootstrap_argv(suite, building, mirror))
            version = installed_version(building, release, runner)
        except (CommandError, RootError) as exc:
            detail = _debootstrap_log_tail(building)
            with contextlib.suppress(OSError, RootError):
                remove_unmounted(building, _mountinfo())
            raise RootError(f"building the Slurm {release} root failed: {exc}{detail}") from None
        marker = {
            "release": release,
            "suite": suite,
            "version": version,
            "mirror": mirror,
            "packages": ",".join(PACKAGES),
            "built": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (building / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        os.rename(building, final)
        log(f"Slurm {version} (Debian {suite}) in {final}, {time.monotonic() - started:.0f} s")
        return SlurmRoot(release, suite, final, version)


def _debootstrap_log_tail(building: Path, lines: int = 10) -> str:
    log_file = building / "debootstrap" / "debootstrap.log"
    try:
        tail = log_file.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return ""
    return f"\n{log_file}:\n" + "\n".join(tail)
