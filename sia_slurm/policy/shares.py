"""Fair shares between accounts and users: each job's weight in Sia's objective.

Sia is fair between *jobs*; a site is shared between *accounts* and *users*. The hierarchy is
account -> user -> job: the accounts with live jobs split the cluster by their shares, the users
of an account with live jobs split the account's part by theirs, and a user's jobs split the
user's part equally. A job's weight is its part of the cluster times the number of live jobs, so
that with one account and one user (or equal parts everywhere) every weight is exactly 1 and Sia
runs as it always has. The policy multiplies each job's objective coefficients by its weight
(:func:`sia_slurm.policy.sia.build_columns`; docs/deviations.md states the program).

Shares come from the config (``shares:``, :class:`SharesConfig`) or, with Slurm accounting, from
the site's associations. A job's account is the one ``shares.users`` gives its user, else the
Slurm account it runs under, else :data:`DEFAULT_ACCOUNT`; accounts and users not listed get
``default_share``. Without a ``shares:`` section every user gets an equal share.

Standard library only: the config loader (read on every job start) imports this module.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

DEFAULT_ACCOUNT = "(none)"
"""The account of jobs that run under no account the shares know."""


@dataclass(frozen=True)
class UserShareConfig:
    """A user's account and share within that account."""

    account: str | None = None  # None: the Slurm account each job runs under
    share: float = 1.0


@dataclass(frozen=True)
class SharesConfig:
    """The site's shares: per account, and per user within an account (all > 0)."""

    accounts: Mapping[str, float] = field(default_factory=dict)
    users: Mapping[str, UserShareConfig] = field(default_factory=dict)
    default_share: float = 1.0
    usage_half_life_s: float = 3600.0  # how long past GPU time counts (UsageLedger)
    usage_factor_limit: float = 8.0  # clip of the usage factors; 1: static shares only

    def __reduce__(self) -> tuple[type[SharesConfig], tuple[object, ...]]:
        """Pickled as its plain fields (a mapping proxy does not pickle): a simulation's config
        goes to the worker processes of ``sim.parallel``."""
        return (
            type(self),
            (
                dict(self.accounts),
                dict(self.users),
                self.default_share,
                self.usage_half_life_s,
                self.usage_factor_limit,
            ),
        )

    def __post_init__(self) -> None:
        object.__setattr__(self, "accounts", MappingProxyType(dict(self.accounts)))
        object.__setattr__(self, "users", MappingProxyType(dict(self.users)))
        for name, share in [*self.accounts.items(), ("default_share", self.default_share)]:
            if not share > 0:
                raise ValueError(f"SharesConfig: share of {name}: expected > 0, got {share}")
        if not self.usage_factor_limit >= 1:
            raise ValueError(
                f"SharesConfig.usage_factor_limit: expected >= 1, got {self.usage_factor_limit}"
            )
        if not self.usage_half_life_s > 0:
            raise ValueError(
                f"SharesConfig.usage_half_life_s: expected > 0, got {self.usage_half_life_s}"
            )
        for name, user in self.users.items():
            if not user.share > 0:
                raise ValueError(f"SharesConfig: user {name}: share expected > 0, got {user.share}")

    def account_of(self, user: str, account: str) -> str:
        """The account a job of ``user`` submitted under Slurm ``account`` counts against."""
        configured = self.users.get(user)
        if configured is not None and configured.account is not None:
            return configured.account
        return account or DEFAULT_ACCOUNT

    def account_share(self, account: str) -> float:
        return self.accounts.get(account, self.default_share)

    def user_share(self, user: str) -> float:
        configured = self.users.get(user)
        return self.default_share if configured is None else configured.share


EQUAL_USERS = SharesConfig()
"""No ``shares:`` section: every account and user counts the same."""


@dataclass(frozen=True)
class JobOwner:
    """Who a live job belongs to, as the cluster reports it."""

    job_id: str
    user: str = ""
    account: str = ""
    qos: str = ""


def job_weights(
    owners: Iterable[JobOwner],
    shares: SharesConfig,
    factors: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """Each live job's weight: ``n * (S_a / sum S) * (s_u / sum_a s) / n_u``.

    ``S_a`` (the account's share times its usage factor, :class:`UsageLedger`; 1 if ``factors``
    has none) runs over the accounts with live jobs, ``s_u`` over the users with live jobs in the
    job's account, ``n_u`` counts the user's live jobs and ``n`` all live jobs; the weights sum
    to ``n`` and are all 1 when every account and user has the same share and number of jobs.
    """
    owners = list(owners)
    if not owners:
        return {}
    factors = factors or {}

    def account_share(account: str) -> float:
        return shares.account_share(account) * factors.get(account, 1.0)

    account_of = {o.job_id: shares.account_of(o.user, o.account) for o in owners}
    jobs_of: dict[tuple[str, str], int] = {}
    for owner in owners:
        key = (account_of[owner.job_id], owner.user)
        jobs_of[key] = jobs_of.get(key, 0) + 1
    user_total: dict[str, float] = {}
    for account, user in jobs_of:
        user_total[account] = user_total.get(account, 0.0) + shares.user_share(user)
    account_total = sum(account_share(account) for account in user_total)
    weights = {}
    for owner in owners:
        account = account_of[owner.job_id]
        part = account_share(account) / account_total
        part *= shares.user_share(owner.user) / user_total[account]
        weights[owner.job_id] = len(owners) * part / jobs_of[(account, owner.user)]
    return weights


def account_parts(owners: Iterable[JobOwner], shares: SharesConfig) -> Mapping[str, float]:
    """The fraction of the cluster each account with live jobs is entitled to (sums to 1)."""
    accounts = {shares.account_of(o.user, o.account) for o in owners}
    total = sum(shares.account_share(a) for a in accounts)
    return {a: shares.account_share(a) / total for a in sorted(accounts)}


@dataclass
class UsageLedger:
    """Each account's recent GPU time against the GPU time it was owed, both decayed with a
    half-life: the memory that turns static shares into shares of *used* GPU time (Slurm's
    fair-share factor works the same way).

    :meth:`record` charges the GPUs each account was owed over the last interval
    (:func:`sia_slurm.policy.entitlement.owed_gpus`: what its jobs would take alone on its part
    of the cluster) and the GPUs it held, up to those owed; :meth:`factors` gives each account
    ``(owed / used) ** gain``, clipped to ``[1, limit]``: an account that held less than it
    was owed is weighed up, the more the further it fell short over the last half-lives. GPUs
    held beyond what was owed (that no other account wanted) neither count against it later
    nor weigh it down.
    Before any usage every factor is 1.
    """

    half_life_s: float = 3600.0
    limit: float = 8.0
    # The factor is (owed / used) ** gain: with 1, an hour's memory moves a one-job account's
    # factor by ~10% for a 4-GPU shortfall over ten minutes, too little to move its weight
    # (docs/deviations.md, "Fair shares").
    gain: float = 4.0
    used: dict[str, float] = field(default_factory=dict)  # decayed GPU-seconds per account
    owed: dict[str, float] = field(default_factory=dict)  # decayed GPU-seconds per account
    time: float | None = None
    held: Mapping[str, float] = field(default_factory=dict)  # GPUs per account since ``time``
    owing: Mapping[str, float] = field(default_factory=dict)  # GPUs owed since ``time``

    def record(
        self, now: float, held: Mapping[str, float], owed: Mapping[str, float] | None = None
    ) -> None:
        """Charge the GPUs held and owed since the last call up to ``now``; ``held`` and
        ``owed`` are each account's from ``now`` on (charged at the next call)."""
        if self.time is not None and now > self.time:
            elapsed = now - self.time
            decay = 0.5 ** (elapsed / self.half_life_s)
            # Held GPUs count up to what was owed: GPUs no other account wanted are free, and
            # must not cancel a later shortfall.
            got = {a: min(gpus, self.owing.get(a, 0.0)) for a, gpus in self.held.items()}
            for ledger, rates in ((self.used, got), (self.owed, self.owing)):
                for account in ledger:
                    ledger[account] *= decay
                for account, gpus in rates.items():
                    ledger[account] = ledger.get(account, 0.0) + gpus * elapsed
        if self.time is None or now >= self.time:
            self.time = now
            self.held = dict(held)
            self.owing = dict(owed or {})

    def to_json(self) -> dict[str, Any]:
        """The memory (not the settings, which come from the config) as JSON, so a restarted
        controller (``controller run --once`` is a new process every round) keeps it."""
        return {
            "used": self.used,
            "owed": self.owed,
            "time": self.time,
            "held": dict(self.held),
            "owing": dict(self.owing),
        }

    def restore(self, data: Any, where: str) -> None:
        """Take the memory :meth:`to_json` saved; a malformed one raises ValueError naming
        ``where`` and the field, and leaves this ledger as it was."""
        if not isinstance(data, dict):
            raise ValueError(f"{where}: expected a mapping, got {data!r}")
        parts: dict[str, dict[str, float]] = {}
        for key in ("used", "owed", "held", "owing"):
            value = data.get(key, {})
            if not isinstance(value, dict) or not all(
                isinstance(k, str) and _amount(v) for k, v in value.items()
            ):
                raise ValueError(f"{where}.{key}: expected account -> number >= 0, got {value!r}")
            parts[key] = {k: float(v) for k, v in value.items()}
        time = data.get("time")
        if time is not None and not _number(time):
            raise ValueError(f"{where}.time: expected a number or null, got {time!r}")
        self.used, self.owed = parts["used"], parts["owed"]
        self.held, self.owing = parts["held"], parts["owing"]
        self.time = None if time is None else float(time)

    def factors(self, accounts: Iterable[str]) -> dict[str, float]:
        result = {}
        for account in accounts:
            used, owed = self.used.get(account, 0.0), self.owed.get(account, 0.0)
            ratio = 1.0 if owed <= 0 else self.limit if used <= 0 else (owed / used) ** self.gain
            result[account] = min(max(ratio, 1.0), self.limit)
        return result


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _amount(value: Any) -> bool:
    return _number(value) and value >= 0
