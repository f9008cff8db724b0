"""The controller's memory round-trips through SQLite: a controller rebuilt from the database
decides exactly as the live one would (what makes cron ``--once`` rounds correct)."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable

import pytest

from sia_slurm.config import SiaConfig, load_config
from sia_slurm.controller import Controller, RoundOutcome
from sia_slurm.protocol import JobSpec
from sia_slurm.service import open_controller, run_round
from sia_slurm.state import Store
from tests.service.fakes import FakeCluster, write_config

APPS = ("cifar10", "ncf", "imagenet", "cifar10", "bert")


def comparable(outcome: RoundOutcome) -> tuple[object, ...]:
    return (outcome.round_index, outcome.actions, outcome.decisions)


def world() -> FakeCluster:
    cluster = FakeCluster(None)
    for i, app in enumerate(APPS):
        cluster.submit(JobSpec(f"j{i}", app, submit_time=0.0), work=4e5)
    return cluster


def _forget_goodput_models(controller: Controller) -> None:
    for sia_id, record in controller.jobs.items():
        controller.jobs[sia_id] = dataclasses.replace(
            record, estimator=controller._estimator_for(record.spec)
        )


def _forget_previous_allocation(controller: Controller) -> None:
    controller.previous = None


def _forget_round_index(controller: Controller) -> None:
    controller.round_index = 0


FORGETTING = {
    "goodput models": _forget_goodput_models,
    "previous allocation": _forget_previous_allocation,
    "round index": _forget_round_index,
}
# The parts of the memory each policy's decisions read in this world. Measured: a controller
# that lost one of them decides differently from the live one in several of the 8 rounds (Sia:
# 5 rounds without the goodput models; Gavel: 7 without the previous allocation; both, every
# round with actions, without the round index). Sia ignores the previous allocation here and
# Gavel the models, so for those the field comparisons in the loop are what catch a loss.
DECISIVE = {
    "sia": ("goodput models", "round index"),
    "gavel": ("previous allocation", "round index"),
}


def _twin(live: Controller, forget: Callable[[Controller], None] | None = None) -> Controller:
    """A deep copy of ``live``'s memory in a new controller, less what ``forget`` drops."""
    twin = Controller(live.policy, live._estimator_for)
    twin.jobs = copy.deepcopy(live.jobs)
    twin.previous, twin.round_index = live.previous, live.round_index
    if forget is not None:
        forget(twin)
    return twin


def test_the_controller_gets_the_configs_shares(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = write_config(tmp_path)
    path.write_text(path.read_text() + "shares:\n  accounts: {bio: 3, phys: 1}\n")
    config = load_config(path)
    with Store.open(config.db_path) as store:
        controller, _ = open_controller(config, store)
    assert controller.shares == config.shares
    assert controller.shares.account_share("bio") == 3


@pytest.mark.parametrize("policy", [pytest.param("sia", marks=pytest.mark.heavy), "gavel"])
def test_rebuilt_controller_decides_like_the_live_one(tmp_path, policy: str) -> None:  # type: ignore[no-untyped-def]
    """Run rounds with one long-lived controller; after each, rebuild a second one from the
    database and let both decide on the same next snapshot. The comparison is shown to matter:
    a controller that lost a part of the memory the policy reads decides differently."""
    config = load_config(write_config(tmp_path, policy=policy))
    cluster = world()
    differs = dict.fromkeys(FORGETTING, 0)  # rounds in which forgetting that part showed
    with Store.open(config.db_path) as store:
        live, _ = open_controller(config, store)
        for _ in range(8):
            run_round(config, cluster, store, live, False)
            cluster.advance(60.0)
            rebuilt, notes = open_controller(config, store)
            assert notes == []
            assert rebuilt.round_index == live.round_index
            assert set(rebuilt.jobs) == set(live.jobs)
            for sia_id, record in live.jobs.items():
                twin = rebuilt.jobs[sia_id]
                assert (twin.max_gpus_seen, twin.reports) == (record.max_gpus_seen, record.reports)
                assert twin.estimator.grad_stats == record.estimator.grad_stats
            assert (rebuilt.previous is None) == (live.previous is None)
            snapshot = cluster.snapshot()
            expected = comparable(_twin(live).round(snapshot))
            assert comparable(rebuilt.round(snapshot)) == expected
            for part, forget in FORGETTING.items():
                differs[part] += comparable(_twin(live, forget).round(snapshot)) != expected
        assert sum(job.completions for job in cluster.jobs.values()) >= 1
    assert [part for part in DECISIVE[policy] if differs[part] == 0] == [], differs


# Both policies: Sia's decisions here read the restored goodput models, Gavel's the restored
# previous allocation (see DECISIVE), so a loss of either shows as a different trace.
@pytest.mark.parametrize("policy", ["sia", "gavel"])
def test_cron_rounds_match_a_long_running_loop(tmp_path, policy: str) -> None:  # type: ignore[no-untyped-def]
    """Two identical worlds to completion: one controller kept in memory, one rebuilt from the
    database every round (as ``--once`` does). They take the same actions, round for round."""
    runs = {}
    for mode in ("loop", "cron"):
        directory = tmp_path / mode
        directory.mkdir()
        config: SiaConfig = load_config(write_config(directory, policy=policy))
        cluster = world()
        trace = []
        with Store.open(config.db_path) as store:
            controller, _ = open_controller(config, store)
            for _ in range(60):
                if mode == "cron":
                    controller, _ = open_controller(config, store)
                report = run_round(config, cluster, store, controller, False)
                trace.append(report.actions)
                cluster.advance(60.0)
                if all(job.phase == "done" for job in cluster.jobs.values()):
                    break
        runs[mode] = (trace, {i: (j.completions, j.restarts) for i, j in cluster.jobs.items()})
    assert runs["cron"] == runs["loop"]
    assert all(done == 1 for done, _ in runs["loop"][1].values())
