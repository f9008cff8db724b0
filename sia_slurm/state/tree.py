"""The state directory's tree: who owns what, ``sia-slurm setup``, and the start-up check.

::

    state_dir/            service account, 0755   the database, lock, metrics
      control/            service account, 0755   what the controller decides (users read)
        <sia_id>/         service account, 0755   assignment.json, stop.json, slurm.json
      jobs/               service account, 1777   sticky, like /tmp: users make their job dirs
        <sia_id>/         the job's user,  0755   spec.json, acks, metrics.json, checkpoints

The controller refuses to start on a tree another account could rewrite under it: a part
owned by someone else, writable by group or others (``jobs/`` only with the sticky bit), a
symlink where a directory belongs, or an ancestor directory that others may write without
the sticky bit (they could swap the whole tree). ``docs/operations.md`` covers NFS.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.protocol import StatePaths
from sia_slurm.safefiles import chmod_dir


@dataclass(frozen=True)
class TreeDir:
    """One directory of the tree: its path and the mode it is made with."""

    path: Path
    mode: int
    shared: bool = False  # users create entries in it (sticky, world-writable)


def tree_dirs(state_dir: Path) -> tuple[TreeDir, ...]:
    paths = StatePaths(Path(state_dir))
    return (
        TreeDir(paths.state_dir, 0o755),
        TreeDir(paths.control_dir, 0o755),
        TreeDir(paths.jobs_dir, 0o1777, shared=True),
    )


def set_up(state_dir: Path, uid: int, gid: int) -> list[str]:
    """Create the tree for the account ``uid``:``gid`` (or give an existing one that owner and
    mode); the lines say what was done. Needs root unless ``uid`` is the caller's."""
    done = []
    for entry in tree_dirs(state_dir):
        if not os.path.lexists(entry.path):  # a dangling symlink is there, not missing
            entry.path.mkdir(mode=0o700)
            done.append(f"created {entry.path}")
        try:
            fd = os.open(entry.path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise NotADirectoryError(
                f"{entry.path}: not a directory; move it aside first"
            ) from None
        try:  # owner and mode set on the descriptor: nothing swapped in meanwhile is touched
            info = os.fstat(fd)
            if (info.st_uid, info.st_gid) != (uid, gid):
                os.fchown(fd, uid, gid)
                done.append(f"owner of {entry.path}: {info.st_uid}:{info.st_gid} -> {uid}:{gid}")
            if stat.S_IMODE(info.st_mode) != entry.mode:
                os.fchmod(fd, entry.mode)
                mode = stat.S_IMODE(info.st_mode)
                done.append(f"mode of {entry.path}: {mode:o} -> {entry.mode:o}")
        finally:
            os.close(fd)
    return done


def prepare(state_dir: Path, uid: int) -> list[str]:
    """What the controller does at start: create the parts of the tree that are missing,
    if it may (the state directory is its own), then return every problem of the tree."""
    state_dir = Path(state_dir)
    try:
        owned = os.stat(state_dir, follow_symlinks=False).st_uid == uid
    except FileNotFoundError:
        owned = _writable(state_dir.parent)
    if owned:
        for entry in tree_dirs(state_dir):
            try:
                entry.path.mkdir(mode=0o700)
            except FileExistsError:
                continue
            except OSError:
                break  # check() says what is wrong
            chmod_dir(entry.path, entry.mode)
    return check(state_dir, uid)


def check(state_dir: Path, uid: int) -> list[str]:
    """Every reason the tree is unsafe for a controller running as ``uid`` (empty: safe)."""
    problems = []
    fix = f"run `sia-slurm setup --state-dir {state_dir} --user <service account>` as root"
    for entry in tree_dirs(state_dir):
        try:
            info = os.stat(entry.path, follow_symlinks=False)
        except FileNotFoundError:
            problems.append(f"{entry.path}: does not exist; {fix}")
            continue
        if not stat.S_ISDIR(info.st_mode):
            problems.append(f"{entry.path}: not a directory (a symlink?); {fix}")
            continue
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid != uid and not (entry.shared and info.st_uid == 0):
            problems.append(
                f"{entry.path}: owned by uid {info.st_uid}, but the controller runs as uid {uid}; "
                f"{fix}"
            )
        if entry.shared:
            if mode & 0o022 and not mode & stat.S_ISVTX:
                problems.append(
                    f"{entry.path}: mode {mode:o} lets users remove each other's job directories "
                    f"(writable without the sticky bit); chmod 1777 {entry.path}"
                )
        elif mode & 0o022:
            problems.append(
                f"{entry.path}: mode {mode:o} is writable by group or others; "
                f"chmod {entry.mode:o} {entry.path}"
            )
    problems += _ancestor_problems(Path(state_dir).absolute().parent)
    return problems


def _ancestor_problems(directory: Path) -> list[str]:
    """Ancestors that others may write without the sticky bit: the tree could be swapped."""
    problems = []
    for parent in (directory, *directory.parents):
        try:
            info = os.stat(parent)
        except OSError:
            continue
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o002 and not mode & stat.S_ISVTX:
            problems.append(
                f"{parent}: writable by everyone without the sticky bit, so any user could "
                "replace the state directory; move state_dir elsewhere"
            )
    return problems


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK)
