"""Measured profiles, kept by the controller for later jobs of the same app and account.

``<state_dir>/profiles/<account>/<app>.json`` holds one profile a job measured (Sia's
profiling, docs/profiling.md) with when, where and how long it was measured. Only the
controller writes here (the state directory is the service account's; users write only under
``jobs/``), atomically; the files are read back through the bounded JSON reader all the same.
A job without an account (no Slurm accounting) shares under ``_none``, a name no account can
have.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sia_slurm.protocol import NAME
from sia_slurm.safefiles import read_json, write_json_atomic

NO_ACCOUNT = "_none"
PROFILES_DIR = "profiles"


class ProfileStoreError(ValueError):
    """A kept profile cannot be read, or a name cannot name one."""


@dataclass(frozen=True)
class KeptProfile:
    """One measured profile and how it was measured."""

    account: str
    app: str
    document: Mapping[str, Any]
    meta: Mapping[str, Any]
    path: Path


@dataclass(frozen=True)
class ProfileStore:
    """The measured profiles under one state directory (a :class:`ProfileBook`)."""

    state_dir: Path

    @property
    def root(self) -> Path:
        return self.state_dir / PROFILES_DIR

    def path(self, account: str, app: str) -> Path:
        """Where (``account``, ``app``)'s profile is kept; both must be names."""
        folder = account or NO_ACCOUNT
        if account and not NAME.fullmatch(account):
            raise ProfileStoreError(f"account: expected a name, got {account[:80]!r}")
        if not NAME.fullmatch(app):
            raise ProfileStoreError(f"app: expected a name, got {app[:80]!r}")
        return self.root / folder / f"{app}.json"

    def get(self, account: str, app: str) -> Mapping[str, Any] | None:
        """The kept document, ``None`` if there is none (or the names cannot name one)."""
        try:
            kept = self.read(account, app)
        except ProfileStoreError:
            return None
        return None if kept is None else kept.document

    def read(self, account: str, app: str) -> KeptProfile | None:
        """The kept profile with its meta; :class:`ProfileStoreError` if it is unreadable."""
        path = self.path(account, app)
        if not os.path.lexists(path):
            return None
        try:
            data = read_json(path)
        except (OSError, ValueError) as exc:
            raise ProfileStoreError(f"{path}: {exc}") from None
        document, meta = data.get("document"), data.get("meta", {})
        if not isinstance(document, dict) or not isinstance(meta, dict):
            raise ProfileStoreError(f"{path}: expected an object with document and meta")
        return KeptProfile(account, app, document, meta, path)

    def put(
        self, account: str, app: str, document: Mapping[str, Any], meta: Mapping[str, Any]
    ) -> None:
        """Keep (``account``, ``app``)'s profile (replacing one kept before)."""
        path = self.path(account, app)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        write_json_atomic(path, {"document": dict(document), "meta": dict(meta)})

    def forget(self, account: str, app: str) -> bool:
        """Drop the kept profile; whether there was one."""
        path = self.path(account, app)
        try:
            path.unlink()
        except FileNotFoundError:
            return False
        with contextlib.suppress(OSError):
            path.parent.rmdir()  # only when empty
        return True

    def accounts_of(self, app: str) -> list[str]:
        """The accounts that keep a profile of ``app`` (``""`` for none)."""
        found = []
        for folder in sorted(self.root.iterdir()) if self.root.is_dir() else ():
            if (folder / f"{app}.json").is_file():
                found.append("" if folder.name == NO_ACCOUNT else folder.name)
        return found

    def __iter__(self) -> Iterator[tuple[str, str]]:
        """Every kept (account, app)."""
        if not self.root.is_dir():
            return
        for folder in sorted(self.root.iterdir()):
            account = "" if folder.name == NO_ACCOUNT else folder.name
            for path in sorted(folder.glob("*.json")):
                yield account, path.stem
