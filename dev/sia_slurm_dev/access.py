"""Which user may reach which path: the checks a dev cluster with a separate SlurmUser needs.

slurmctld is started by root and then drops to SlurmUser; from then on it reads slurm.conf and
gres.conf, talks to munged through its socket and writes its state, log and pid file as that
user. A directory on the way it cannot enter (a 0700 home or pytest's 0700 temporary
directories) makes it fail late and obscurely, so ``DevCluster.up`` asks here first.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Account:
    """A local user as permission checks see it: name, uid and every group id it has."""

    name: str
    uid: int
    gid: int
    groups: frozenset[int]

    @classmethod
    def lookup(cls, name: str) -> Account | None:
        """The account called ``name``, or None when there is no such user."""
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            return None
        groups = frozenset(os.getgrouplist(entry.pw_name, entry.pw_gid))
        return cls(entry.pw_name, entry.pw_uid, entry.pw_gid, groups)

    def may(self, path: Path, bits: tuple[int, int, int]) -> bool:
        """Whether the mode bits grant this account access; ``bits`` = (owner, group, other).

        The owner's bits alone decide for the owner and the group's for a member, as the kernel
        decides (no ACLs here); root may do anything.
        """
        if self.uid == 0:
            return True
        info = path.stat()
        owner, group, other = bits
        if info.st_uid == self.uid:
            return bool(info.st_mode & owner)
        if info.st_gid in self.groups:
            return bool(info.st_mode & group)
        return bool(info.st_mode & other)


TRAVERSE = (stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH)


def untraversable(path: Path, account: Account) -> list[Path]:
    """The directories from / down to ``path`` (itself included, if a directory) that
    ``account`` may not enter; empty when it can reach everything in ``path``."""
    path = Path(path).absolute()
    chain = [*reversed(path.parents), path] if path.is_dir() else [*reversed(path.parents)]
    return [d for d in chain if not account.may(d, TRAVERSE)]
