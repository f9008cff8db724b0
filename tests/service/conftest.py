"""Fixtures of the service tests: a config file, a state store and the fake cluster."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # so `tests.service.*` imports however pytest was started
    sys.path.insert(0, str(REPO))

from tests.service.fixtures import cluster, config, factory, store  # noqa: E402

__all__ = ["cluster", "config", "factory", "store"]
