"""The site's associations and QOS as Slurm accounting has them, in the policy's terms.

Pure data and rules (no Slurm commands: :mod:`sia_slurm.slurm.observe.sacct` reads them), so the
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
    # Per-type limits (``gres/gpu:a100=2``): ``(GPU type, GPUs)`` pairs.
    grp_typed: tuple[tuple[str, int], ...] = ()
    per_job_typed: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class QosLimits:
    grp_gpus: int | None = None
    gpus_per_user: int | None = None
    gpus_per_job: int | None = None
    grp_typed: tuple[tuple[str, int], ...] = ()
    per_user_typed: tuple[tuple[str, int], ...] = ()
    per_job_typed: tuple[tuple[str, int], ...] = ()


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
        ``MaxTRESPerUser``; each for ``gres/gpu`` and for every GPU type the site limits
        (``gres/gpu:a100``)."""
        by_account = {a.account: a for a in self.associations if not a.user}
        by_user = {(a.account, a.user): a for a in self.associations if a.user}
        groups: dict[tuple[str, str | None], set[str]] = {}
        sizes: dict[tuple[str, str | None], int] = {}

        def add(name: str, limits: _Limits, job_id: str) -> None:
            for gpu_type, gpus in limits:
                key = (name, gpu_type)
                groups.setdefault(key, set()).add(job_id)
                sizes[key] = min(gpus, sizes.get(key, gpus))

        for owner in owners:
            for account in self.ancestors(owner.account):
                assoc = by_account.get(account)
                if assoc is not None:
                    add(f"account {account} GrpTRES", _grp(assoc), owner.job_id)
            user_assoc = by_user.get((owner.account, owner.user))
            if user_assoc is not None:
                add(f"user {owner.user} in {owner.account} GrpTRES", _grp(user_assoc), owner.job_id)
            qos = self.qos.get(owner.qos) if owner.qos else None
            per_job = f"job {owner.job_id} MaxTRESPerJob"  # the tightest of the three
            for assoc in (user_assoc, by_account.get(owner.account)):
                if assoc is not None:
                    add(per_job, _both(assoc.max_gpus_per_job, assoc.per_job_typed), owner.job_id)
            if qos is not None:
                add(per_job, _both(qos.gpus_per_job, qos.per_job_typed), owner.job_id)
                add(f"qos {owner.qos} GrpTRES", _both(qos.grp_gpus, qos.grp_typed), owner.job_id)
                add(
                    f"qos {owner.qos} MaxTRESPerUser {owner.user}",
                    _both(qos.gpus_per_user, qos.per_user_typed),
                    owner.job_id,
                )
        return tuple(
            GpuLimit(
                name if gpu_type is None else f"{name} {gpu_type}",
                frozenset(jobs),
                sizes[(name, gpu_type)],
                gpu_type,
            )
            for (name, gpu_type), jobs in sorted(
                groups.items(), key=lambda kv: (kv[0][0], kv[0][1] or "")
            )
        )


_Limits = list[tuple[str | None, int]]


def _both(untyped: int | None, typed: tuple[tuple[str, int], ...]) -> _Limits:
    """One association's or QOS's limits of one kind: ``(None, N)`` for ``gres/gpu=N``, then
    ``(type, N)`` per typed limit."""
    limits: _Limits = [] if untyped is None else [(None, untyped)]
    return limits + list(typed)


def _grp(assoc: Association) -> _Limits:
    return _both(assoc.grp_gpus, assoc.grp_typed)


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
