"""A job's own profile reaches the model only as its checked profile document: the
controller never opens the user's ``--profile`` directory."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot, Start
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller.quarantine import QUARANTINED
from sia_slurm.policy.base import NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.protocol.profile_json import profile_to_json

NODES = (NodeView("t4-1", "t4", 4, 4), NodeView("a100-1", "a100", 4, 4))


@pytest.fixture(scope="module")
def factory() -> EstimatorFactory:
    return EstimatorFactory(load_profiles(), {"a100": "dgx"})


def own(document: dict[str, object] | None, directory: str) -> JobSnapshot:
    spec = JobSpec("mine", "mymodel", profile=directory)
    return JobSnapshot(spec, JobPhase.PENDING, profile_document=document)


def test_a_job_with_its_profile_document_is_scheduled_from_it(factory: EstimatorFactory) -> None:
    document = profile_to_json(replace(load_profiles().app("ncf"), name="mymodel"))
    outcome = Controller(make_policy("sia"), factory).round(
        ClusterSnapshot(0.0, NODES, (own(document, "/nonexistent/never-read"),))
    )
    (start,) = outcome.actions
    assert isinstance(start, Start) and start.sia_id == "mine"


def test_a_profile_directory_without_its_document_is_never_read(factory: EstimatorFactory) -> None:
    outcome = Controller(make_policy("sia"), factory).round(
        ClusterSnapshot(0.0, NODES, (own(None, "/etc/shadow-dir"),))
    )
    (decision,) = outcome.decisions
    assert decision.action == QUARANTINED
    assert decision.note.startswith("fit: job mine: profile /etc/shadow-dir: a directory")
    assert "profile.json (written by sia-sbatch) is missing" in decision.note
    assert outcome.actions == ()


def test_a_bad_profile_document_quarantines_its_job(factory: EstimatorFactory) -> None:
    document = profile_to_json(load_profiles().app("ncf"))
    document["seed"] = [{**document["seed"][0], "step_time": -1.0}]  # type: ignore[index]
    outcome = Controller(make_policy("sia"), factory).round(
        ClusterSnapshot(0.0, NODES, (own(document, "/p"),))
    )
    (decision,) = outcome.decisions
    assert decision.action == QUARANTINED
    assert "fit: job mine: profile.json: seed[0].step_time: expected seconds > 0" in decision.note
