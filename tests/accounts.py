"""Real local accounts for the tests: the controller's service account and two ordinary users.

The controller runs as ``siasvc``, an unprivileged system account that Slurm treats as
privileged because it is the cluster's SlurmUser; ``siaalice`` and ``siabob`` submit jobs as
users do. Their jobs run this project's Python as them, so the interpreter and the checkout must
be reachable by other users (:func:`share_python`). Creating accounts needs root, as the dev
cluster does.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from sia_slurm_dev.access import Account

SERVICE_ACCOUNT = "siasvc"
ALICE = "siaalice"
BOB = "siabob"
REPO = Path(__file__).resolve().parent.parent
_USERADD_NAME_IN_USE = 9  # useradd's exit status when another process created it first


@dataclass(frozen=True)
class TestAccounts:
    """The accounts every privilege test uses."""

    __test__ = False  # not a test class, whatever its name says

    service: Account
    alice: Account
    bob: Account


def ensure_account(name: str, *, system: bool) -> Account:
    """Create ``name`` unless it exists; a failing useradd fails loudly with its message.

    The service account is a system account with no login shell and no home, as a daemon's
    account is; ordinary users get a home and a shell, as people have.
    """
    account = Account.lookup(name)
    if account is not None:
        return account
    if system:
        argv = ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name]
    else:
        argv = ["useradd", "--create-home", "--shell", "/bin/bash", name]
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    account = Account.lookup(name)
    if account is None or proc.returncode not in (0, _USERADD_NAME_IN_USE):
        raise RuntimeError(
            f"`{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}"
        )
    return account


def ensure_test_accounts() -> TestAccounts:
    return TestAccounts(
        service=ensure_account(SERVICE_ACCOUNT, system=True),
        alice=ensure_account(ALICE, system=False),
        bob=ensure_account(BOB, system=False),
    )


@dataclass(frozen=True)
class SharedTmp:
    """A base directory every account may traverse; :meth:`mktemp` makes unique ones in it."""

    base: Path

    def mktemp(self, name: str) -> Path:
        safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)[:60]
        path = Path(tempfile.mkdtemp(prefix=f"{safe}-", dir=self.base))
        path.chmod(0o711)
        return path


def grant_traverse(path: Path) -> list[Path]:
    """Add o+x to each directory from / down to ``path`` (itself included) that lacks it, and
    return those changed.

    Traverse only, the least change that lets another user reach a file whose own mode already
    allows it: no directory becomes listable and no file readable that was not. This is what
    /root (0700) around pyenv's Python and pytest's 0700 temporary directories need, so that
    jobs of other users, and slurmctld as SlurmUser, can reach what sits inside them.
    """
    path = Path(path).absolute()
    changed = []
    for directory in [*reversed(path.parents), path]:
        mode = directory.stat().st_mode
        if stat.S_ISDIR(mode) and not mode & stat.S_IXOTH:
            os.chmod(directory, stat.S_IMODE(mode) | stat.S_IXOTH)
            changed.append(directory)
    return changed


def run_as(
    user: str,
    argv: Sequence[str],
    env: Mapping[str, str] | None = None,
    *,
    cwd: Path | str = "/",
    timeout_s: float = 60.0,
) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` as ``user`` (``runuser -u USER --``, no shell, so a nologin account works);
    ``env`` is added to this process's environment. The result is returned whatever the exit
    status: tests assert on refusals as much as on successes.

    ``cwd`` defaults to / because the caller's directory may be one the user cannot enter.
    """
    return subprocess.run(
        ["runuser", "-u", user, "--", *argv],
        env={**os.environ, **(env or {})},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def share_python(user: str) -> list[Path]:
    """Make this interpreter and the checkout reachable by other users, then check that
    ``user`` can import the project and torch with it; return the directories changed.

    Their Slurm jobs run ``sys.executable`` as them. Fails loudly with the interpreter's stderr,
    since a job that cannot import would fail far less legibly inside Slurm.
    """
    changed: list[Path] = []
    for path in {Path(sys.prefix), Path(sys.base_prefix), REPO}:
        changed += grant_traverse(path)
    changed += grant_traverse(Path(sys.executable).resolve().parent)
    proc = run_as(user, [sys.executable, "-c", "import sia_slurm, torch"])
    if proc.returncode != 0:
        raise RuntimeError(
            f"{user} cannot run {sys.executable} with sia_slurm and torch "
            f"(exit {proc.returncode}): {proc.stderr.strip()}"
        )
    return changed
