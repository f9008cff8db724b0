"""Shared fixtures for the goodput-model tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from sia_slurm.protocol.profile import ProfileSet, default_profiles_dir, load_profiles

REPO_ROOT = Path(__file__).resolve().parents[2]
TRACES_DIR = REPO_ROOT / "data" / "traces"


@pytest.fixture(scope="session")
def profiles() -> ProfileSet:
    """The profiles shipped in the repository."""
    return load_profiles(default_profiles_dir())


@pytest.fixture
def profiles_copy(tmp_path: Path) -> Path:
    """A writable copy of the shipped profiles, for corrupting one file per test."""
    target = tmp_path / "profiles"
    shutil.copytree(default_profiles_dir(), target)
    return target
