"""The site's associations and QOS as Slurm accounting has them, in the policy's terms.

Pure data and rules (no Slurm commands: :mod:`sia_slurm.slurm.accounting` reads them), so the
cluster interface can carry them and the controller's round can use them: association shares
become a :class:`SharesConfig`, association and QOS GPU limits :class:`GpuLimit` s over this
round's live jobs (issue 20).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from sia_slurm.policy.limits import GpuLimit
from sia_slurm.policy.shares import JobOwner, SharesConfig, UserShareConfig


@dataclass(frozen=True)
class Association:
    """One row of ``sacctmgr show assoc``: an account's (``user`` empty) or a user's in it."""

    cluster: str
    account: str
    user: str
    parent: str
    share: int
    grp_gpus: int | None
    max_gpus_per_job: int | None
    qos: tuple[str, ...]


@dataclass(frozen=True)
class QosLimits:
    grp_gpus: int | None = None
    gpus_per_user: int | None = None
    gpus_per_job: int | None = None


@dataclass(frozen=True)
class SiteAccounting:
    """The site's associations and QOS, as read this round."""

    associations: tuple[Association, ...]
    qos: Mapping[str, QosLimits] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "qos", MappingProxyType(dict(self.qos)))

    def shares(self) -> SharesConfig:
        """Association shares: accounts' ``Share`` and, per user, the share of its first
        association (a user with different shares in several accounts gets the first)."""
        accounts = {a.account: a.share for a in self.associations if not a.user and a.share > 0}
        users: dict[str, UserShareConfig] = {}
        for a in self.associations:
            if a.user and a.user not in users and a.share > 0:
                users[a.user] = UserShareConfig(account=None, share=float(a.share))
        return SharesConfig(accounts={k: float(v) for k, v in accounts.items()}, users=users)

    def _parents(self) -> dict[str, str]:
        return {a.account: a.parent for a in self.associations if not a.user and a.parent}

    def ancestors(self, account: str) -> list[str]:
        """``account`` and the accounts above it, nearest first (``root`` included)."""
        parents = self._parents()
        chain = [account]
        while chain[-1] in parents and parents[chain[-1]] not in chain:
            chain.append(parents[chain[-1]])
        return chain

    def limits(self, owners: Iterable[JobOwner]) -> tuple[GpuLimit, ...]:
        """The GPU limits over ``owners`` (this round's live jobs): every account's
        ``GrpTRES`` over the jobs of it and the accounts below it, every user association's
        ``GrpTRES`` over the user's jobs in that account, each job's ``MaxTRESPerJob`` (the
        tightest of its association and QOS), and each QOS's ``GrpTRES`` and
        ``MaxTRESPerUser``."""
        owners = list(owners)
        by_account = {a.account: a for a in self.associations if not a.user}
        by_user = {(a.account, a.user): a for a in self.associations if a.user}
        groups: dict[str, set[str]] = {}
        sizes: dict[str, int] = {}

        def add(name: str, gpus: int | None, job_id: str) -> None:
            if gpus is not None:
                groups.setdefault(name, set()).add(job_id)
                sizes[name] = gpus

        for owner in owners:
            for account in self.ancestors(owner.account):
                assoc = by_account.get(account)
                if assoc is not None:
                    add(f"account {account} GrpTRES", assoc.grp_gpus, owner.job_id)
            user_assoc = by_user.get((owner.account, owner.user))
            if user_assoc is not None:
                add(
                    f"user {owner.user} in {owner.account} GrpTRES",
                    user_assoc.grp_gpus,
                    owner.job_id,
                )
            qos = self.qos.get(owner.qos) if owner.qos else None
            per_job = [
                g
                for g in (
                    user_assoc.max_gpus_per_job if user_assoc is not None else None,
                    by_account[owner.account].max_gpus_per_job
                    if owner.account in by_account
                    else None,
                    qos.gpus_per_job if qos is not None else None,
                )
                if g is not None
            ]
            if per_job:
                add(f"job {owner.job_id} MaxTRESPerJob", min(per_job), owner.job_id)
            if qos is not None:
                add(f"qos {owner.qos} GrpTRES", qos.grp_gpus, owner.job_id)
                add(
                    f"qos {owner.qos} MaxTRESPerUser {owner.user}",
                    qos.gpus_per_user,
                    owner.job_id,
                )
        return tuple(
            GpuLimit(name, frozenset(jobs), sizes[name]) for name, jobs in sorted(groups.items())
        )


def shares_source(accounting: bool | None, configured: bool) -> str:
    """Where the shares the controller uses come from, in words (``config check``,
    ``status``). ``accounting``: whether Slurm runs slurmdbd (None: not asked)."""
    if accounting:
        return "shares: Slurm's association shares and GPU limits (accounting is on)"
    config = "the config's shares: section" if configured else "equal shares per user"
    if accounting is None:
        return (
            f"shares: {config}; with Slurm accounting (slurmdbd) its association shares and "
            "GPU limits are used instead"
        )
    return f"shares: {config} (Slurm has no accounting: no association shares or GPU limits)"
