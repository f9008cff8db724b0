"""The dev cluster's accounts spec: accounts, users, QOS and their GPU limits, as YAML, and
the ``sacctmgr`` commands that create them (:mod:`.slurmdbd` runs them).

The spec is a small YAML file (``--accounts FILE``; without it :data:`DEFAULT_ACCOUNTS`)::

    accounts:
      physics: {fairshare: 2}
      biology: {fairshare: 1, gpus: 4}          # GrpTRES=gres/gpu=4
    users:
      alice: {accounts: [physics, biology], gpus_per_job: 2}
    qos:
      short: {gpus_per_user: 4}                 # MaxTRESPerUser=gres/gpu=4
      big: {gpus_per_job: {a100: 2}}            # MaxTRESPerJob=gres/gpu:a100=2

A limit is a number of GPUs of any type or a mapping of GPU types to numbers (a per-type limit;
the cluster's GPU types are all in ``AccountingStorageTRES``, so Slurm enforces it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from sia_slurm.yamlsource import safe_load

DEFAULT_ACCOUNTS = """\
accounts:
  physics: {fairshare: 1}
  biology: {fairshare: 1}
"""


class AccountingSpecError(ValueError):
    """An accounts spec could not be used; the message names the file and field."""


@dataclass(frozen=True)
class LimitSpec:
    """GPU limits of one association or QOS (None: no limit)."""

    gpus: int | None = None  # GrpTRES=gres/gpu=N
    gpus_per_user: int | None = None  # MaxTRESPerUser=gres/gpu=N (QOS only)
    gpus_per_job: int | None = None  # MaxTRESPerJob=gres/gpu=N
    # Per-type limits: (sacctmgr key, GPU type, N) -> ``key=gres/gpu:type=N``.
    typed: tuple[tuple[str, str, int], ...] = ()

    def sacctmgr_args(self) -> list[str]:
        tres: dict[str, list[str]] = {}
        for key, value in (
            ("GrpTRES", self.gpus),
            ("MaxTRESPerUser", self.gpus_per_user),
            ("MaxTRESPerJob", self.gpus_per_job),
        ):
            if value is not None:
                tres.setdefault(key, []).append(f"gres/gpu={value}")
        for key, gpu_type, value in self.typed:
            tres.setdefault(key, []).append(f"gres/gpu:{gpu_type}={value}")
        return [f"{key}={','.join(values)}" for key, values in tres.items()]


_SACCTMGR_KEYS = {
    "gpus": "GrpTRES",
    "gpus_per_user": "MaxTRESPerUser",
    "gpus_per_job": "MaxTRESPerJob",
}


def _limits(raw: Mapping[str, Any], at: str, keys: Sequence[str]) -> LimitSpec:
    """The limits of ``keys`` in ``raw``: each a count (any GPU type) or a mapping of GPU
    types to counts."""
    untyped: dict[str, int | None] = {}
    typed = []
    for key in keys:
        value = raw.get(key)
        if isinstance(value, dict):
            for gpu_type, count in value.items():
                name = _name(gpu_type, f"{at}.{key}")
                typed.append((_SACCTMGR_KEYS[key], name, _count(count, f"{at}.{key}.{name}")))
        else:
            untyped[key] = _count(value, f"{at}.{key}")
    return LimitSpec(**untyped, typed=tuple(typed))  # type: ignore[arg-type]


@dataclass(frozen=True)
class AccountSpec:
    name: str
    fairshare: int = 1
    limits: LimitSpec = LimitSpec()


@dataclass(frozen=True)
class UserSpec:
    name: str
    accounts: tuple[str, ...]
    fairshare: int = 1
    limits: LimitSpec = LimitSpec()


@dataclass(frozen=True)
class AccountingSpec:
    accounts: tuple[AccountSpec, ...]
    users: tuple[UserSpec, ...] = ()
    qos: Mapping[str, LimitSpec] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str, where: str = "accounts spec") -> AccountingSpec:
        """Parse the YAML spec; every error names ``where`` and the field."""
        try:
            data = safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise AccountingSpecError(f"{where}: not YAML: {exc}") from None
        _keys(data, where, ("accounts", "users", "qos"))
        accounts = []
        for name, raw in _mapping(data.get("accounts"), f"{where}: accounts").items():
            at = f"{where}: accounts.{name}"
            raw = _mapping(raw, at)
            _keys(raw, at, ("fairshare", "gpus", "gpus_per_job"))
            limits = _limits(raw, at, ("gpus", "gpus_per_job"))
            fairshare = _count(raw.get("fairshare", 1), f"{at}.fairshare") or 1
            accounts.append(AccountSpec(_name(name, at), fairshare, limits))
        if not accounts:
            raise AccountingSpecError(f"{where}: accounts: expected at least one account")
        known = {a.name for a in accounts}
        users = []
        for name, raw in _mapping(data.get("users"), f"{where}: users").items():
            at = f"{where}: users.{name}"
            raw = _mapping(raw, at)
            _keys(raw, at, ("accounts", "fairshare", "gpus", "gpus_per_job"))
            member = raw.get("accounts", [accounts[0].name])
            if not isinstance(member, list) or not member or any(a not in known for a in member):
                raise AccountingSpecError(
                    f"{at}.accounts: expected a list of accounts from {sorted(known)}, "
                    f"got {member!r}"
                )
            limits = _limits(raw, at, ("gpus", "gpus_per_job"))
            fairshare = _count(raw.get("fairshare", 1), f"{at}.fairshare") or 1
            users.append(UserSpec(_name(name, at), tuple(member), fairshare, limits))
        qos = {}
        for name, raw in _mapping(data.get("qos"), f"{where}: qos").items():
            at = f"{where}: qos.{name}"
            raw = _mapping(raw, at)
            _keys(raw, at, ("gpus", "gpus_per_user", "gpus_per_job"))
            qos[_name(name, at)] = _limits(raw, at, ("gpus", "gpus_per_user", "gpus_per_job"))
        return cls(tuple(accounts), tuple(users), qos)

    def check_gpu_types(self, gpu_types: Iterable[str], where: str = "accounts spec") -> None:
        """A per-type limit must name one of the cluster's GPU types (sacctmgr knows no other
        TRES): else an error naming the limit, before anything starts."""
        known = set(gpu_types)
        limits = [(f"accounts.{a.name}", a.limits) for a in self.accounts]
        limits += [(f"users.{u.name}", u.limits) for u in self.users]
        limits += [(f"qos.{name}", spec) for name, spec in self.qos.items()]
        for at, spec in limits:
            for key, gpu_type, _ in spec.typed:
                if gpu_type not in known:
                    raise AccountingSpecError(
                        f"{where}: {at}: {key} on GPU type {gpu_type!r}, which the "
                        f"cluster lacks (its types: {', '.join(sorted(known))})"
                    )

    def with_users(self, names: Sequence[str]) -> AccountingSpec:
        """The spec plus an association in the first account for each of ``names`` it lacks."""
        have = {u.name for u in self.users}
        extra = tuple(
            UserSpec(n, (self.accounts[0].name,)) for n in dict.fromkeys(names) if n not in have
        )
        return AccountingSpec(self.accounts, self.users + extra, self.qos)


def _mapping(value: Any, at: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AccountingSpecError(f"{at}: expected a mapping, got {value!r}")
    return value


def _keys(value: dict[str, Any], at: str, allowed: Sequence[str]) -> None:
    unknown = sorted(set(value) - set(allowed))
    if unknown:
        raise AccountingSpecError(
            f"{at}: unknown key {unknown[0]!r}; valid keys here: {', '.join(allowed)}"
        )


def _count(value: Any, at: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AccountingSpecError(f"{at}: expected an integer >= 0, got {value!r}")
    return value


def _name(value: Any, at: str) -> str:
    text = str(value)
    if not text or not all(c.isalnum() or c in "_-." for c in text):
        raise AccountingSpecError(f"{at}: expected a name of letters, digits, '_', '-', '.'")
    return text.lower()


def sacctmgr_commands(spec: AccountingSpec, cluster: str) -> list[list[str]]:
    """The sacctmgr argv lists (after ``sacctmgr -i``) that create ``spec``'s associations."""
    commands = []
    for name, limits in spec.qos.items():
        commands.append(["add", "qos", name, *limits.sacctmgr_args()])
    for account in spec.accounts:
        commands.append(
            [
                "add",
                "account",
                account.name,
                f"Cluster={cluster}",
                f"Fairshare={account.fairshare}",
                *account.limits.sacctmgr_args(),
            ]
        )
    qos = ",".join(["normal", *spec.qos])
    for user in spec.users:
        commands.append(
            [
                "add",
                "user",
                user.name,
                f"Account={','.join(user.accounts)}",
                f"DefaultAccount={user.accounts[0]}",
                f"Cluster={cluster}",
                f"Fairshare={user.fairshare}",
                f"QOS={qos}",
                *user.limits.sacctmgr_args(),
            ]
        )
    return commands
