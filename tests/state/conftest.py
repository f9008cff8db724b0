"""Fixtures of the state tests: a config file, a state store and the fake cluster."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # so `tests.service.fakes` imports however pytest was started
    sys.path.insert(0, str(REPO))

from sia_slurm.config import SiaConfig, load_config  # noqa: E402
from sia_slurm.controller import EstimatorFactory  # noqa: E402
from sia_slurm.model import load_profiles  # noqa: E402
from sia_slurm.state import Store  # noqa: E402
from tests.service.fakes import FakeCluster, write_config  # noqa: E402


@pytest.fixture(scope="session")
def factory() -> EstimatorFactory:
    return EstimatorFactory(load_profiles(), {"a100": "dgx"})


@pytest.fixture
def config(tmp_path: Path) -> SiaConfig:
    return load_config(write_config(tmp_path))


@pytest.fixture
def store(config: SiaConfig) -> Iterator[Store]:
    with Store.open(config.db_path) as opened:
        yield opened


@pytest.fixture
def cluster(tmp_path: Path) -> FakeCluster:
    return FakeCluster(tmp_path / "cluster.json")
