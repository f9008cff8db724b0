"""Fixtures shared by the service and state tests: a config file, a state store, the fake
cluster. Each suite's conftest re-exports them, so they are defined once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from sia_slurm.config import SiaConfig, load_config
from sia_slurm.controller import EstimatorFactory
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.state import Store
from tests.service.fakes import FakeCluster, write_config


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
