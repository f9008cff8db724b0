"""Crash injection: the controller dies between journal and apply, in the middle of applying,
or between apply and marking; the next round (a new process) reconciles, and every job still
completes exactly once, never launched twice for one decision."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from sia_slurm.config import SiaConfig, load_config
from sia_slurm.protocol import JobSpec
from sia_slurm.service import open_controller, run_round
from sia_slurm.state import DONE, PENDING, Journal, Store
from tests import zygote
from tests.service.fakes import CRASH_EXIT, Crash, FakeCluster, write_config

pytestmark = pytest.mark.heavy

DRIVER = Path(__file__).with_name("driver.py")
# what driver.py and a round import (0.8 s of CPU a process), loaded once by a zygote
DRIVER_PRELOAD = (
    "sia_slurm.cli.main",
    "sia_slurm.controller",
    "sia_slurm.model.fit",
    "sia_slurm.service.journaled_round",
    "tests.service.fakes",
)
APPS = ("cifar10", "ncf", "cifar10", "imagenet", "ncf", "cifar10")


def populate(cluster: FakeCluster, work: float = 3e5) -> None:
    for i, app in enumerate(APPS):
        cluster.submit(JobSpec(f"j{i}", app, submit_time=60.0 * i), work=work * (1 + i % 3))


def run_to_completion(config: SiaConfig, cluster: FakeCluster, rounds: int = 80) -> None:
    """Healthy rounds, each with a controller rebuilt from the database (a new process)."""
    with Store.open(config.db_path) as store:
        for _ in range(rounds):
            controller, _ = open_controller(config, store)
            run_round(config, cluster, store, controller, False)
            if all(job.phase == "done" for job in cluster.jobs.values()):
                return
            cluster.advance(60.0)
    raise AssertionError("jobs did not finish")


def check_exactly_once(config: SiaConfig, cluster: FakeCluster) -> None:
    cluster._load()
    for job in cluster.jobs.values():
        assert job.completions == 1, job.spec.sia_id
        assert job.launches == job.restarts + 1, job.spec.sia_id
    with Store.open(config.db_path) as store:
        assert Journal(store).pending() == []
        rows = store.jobs()
    assert {row.sia_id for row in rows} == set(cluster.jobs)
    assert all(row.phase == "done" and row.finish_time is not None for row in rows)


def driver(cluster: Path, config: Path, *fault: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(DRIVER), str(cluster), *fault, "--", "controller", "run",
            "--once", "--config", str(config)]  # fmt: skip
    # forked from a zygote: the process the crash ends is the driver's own, as with a fresh
    # interpreter (tests/zygote.py)
    return zygote.run(
        argv, cwd=Path.cwd(), env=dict(os.environ), timeout=120, check=False,
        preload=DRIVER_PRELOAD,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("crash_after", "launched_before_restart"),
    [(0, 0), (2, 2), (99, len(APPS))],
    ids=["between-journal-and-apply", "mid-apply", "between-apply-and-mark"],
)
def test_process_crash_is_reconciled(
    tmp_path: Path, crash_after: int, launched_before_restart: int
) -> None:
    config_path = write_config(tmp_path)
    config = load_config(config_path)
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster)
    crashed = driver(cluster.path, config_path, "--crash-after", str(crash_after))  # type: ignore[arg-type]
    assert crashed.returncode == CRASH_EXIT, crashed.stderr
    cluster._load()
    assert sum(job.launches for job in cluster.jobs.values()) == launched_before_restart
    with Store.open(config.db_path) as store:
        journaled = Journal(store).entries()
    assert len(journaled) == len(APPS) and {e.state for e in journaled} == {PENDING}

    restarted = driver(cluster.path, config_path)  # type: ignore[arg-type]
    assert restarted.returncode == 0, restarted.stderr
    assert '"event": "round"' in restarted.stderr
    cluster._load()
    assert [job.launches for job in cluster.jobs.values()] == [1] * len(APPS)
    with Store.open(config.db_path) as store:
        first_round = [e for e in Journal(store).entries() if e.round_index == 0]
    assert {e.state for e in first_round} == {DONE}
    assert all(e.message.startswith("re-applied") for e in first_round)
    run_to_completion(config, cluster)
    check_exactly_once(config, cluster)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_crashes_never_lose_or_duplicate_a_job(tmp_path: Path, seed: int) -> None:
    """Many rounds, a crash at a random point of a third of them (in-process stand-in for
    os._exit: a BaseException nothing catches), a fresh controller after each."""
    rng = random.Random(seed)
    config = load_config(write_config(tmp_path))
    cluster = FakeCluster(tmp_path / "cluster.json")
    populate(cluster, work=6e5)
    crashes = 0
    with Store.open(config.db_path) as store:
        for _ in range(60):
            controller, _ = open_controller(config, store)
            point = rng.choice([None, 0, 1, 3, 99])
            backend = FakeCluster(cluster.path, crash_after=point, crash_in_process=True)
            try:
                run_round(config, backend, store, controller, False)
            except Crash:
                crashes += 1
            cluster._load()
            if all(job.phase == "done" for job in cluster.jobs.values()):
                break
            cluster.advance(60.0)
    assert crashes >= 3
    run_to_completion(config, cluster)
    check_exactly_once(config, cluster)
