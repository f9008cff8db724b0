"""A run its launcher refused (``refusal-<run>.json``: Slurm started the granted run with
another allocation than ``scontrol`` shows) is requeued and held at the next round, like a
run the controller did not grant; a record for another run, or a bad one, changes nothing.
On the fake Slurm."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.cluster import BatchChoice, JobPhase, Start
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import RunRefusal, refusal_name, to_json, write_document
from tests.slurm.test_backend_enforcement import actuation_log, job_of, started, usable

SAID = "assignment.json: gpus per node: 1 (gpus=1), but SLURM_GPUS_ON_NODE=0"


def refusal(job_id: str, restart: int = 0, **overrides: Any) -> RunRefusal:
    values: dict[str, Any] = {
        "sia_id": "a",
        "slurm_job_id": job_id,
        "slurm_restart_count": restart,
        "node_list": ("rtx-1",),
        "round_index": 1,
        "message": f"job a: Slurm's allocation is not the controller's assignment:\n  {SAID}",
    }
    values.update(overrides)
    return RunRefusal(**values)


def refusal_path(fake: Any, job_id: str, restart: int = 0) -> Path:
    return fake.paths.job_dir("a") / refusal_name(job_id, restart)


def test_a_refused_run_is_requeued_held_and_started_again_as_granted(
    fake_slurm: Any, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logging.getLogger("sia_slurm"), "propagate", True)
    job_id, backend = started(fake_slurm, "a", ["rtx-1"])
    assert job_of(backend.snapshot(), "a").phase is JobPhase.STARTING
    assert backend.enforcement.requeue == {}
    write_document(refusal_path(fake_slurm, job_id), refusal(job_id))
    snapshot = backend.snapshot()
    job = job_of(snapshot, "a")
    assert (job.phase, job.config, job.placement) == (JobPhase.PENDING, None, ())
    reason = (
        f"its launcher refused to train in Slurm job {job_id} run 0 (assignment of round 1): "
        f"job a: Slurm's allocation is not the controller's assignment: {SAID}"
    )
    assert job.message == f"not running as granted: {reason}; being requeued"
    assert usable(snapshot)["rtx-1"] == 3  # Slurm still counts its GPU taken
    fake_slurm.clear_calls()
    with caplog.at_level(logging.INFO, logger="sia_slurm.slurm.actuate.enforce"):
        assert backend.apply([]) == []
    assert fake_slurm.calls == [["scontrol", "requeuehold", job_id]]
    (logged,) = actuation_log(caplog, job_id)
    assert logged.getMessage() == f"[job=a] Slurm job {job_id}: {reason}: requeued and held"
    assert logged.levelno == logging.WARNING
    assert fake_slurm.job(job_id)["restart_cnt"] == 1
    # Held by the controller at the next round; neither the job's failure nor Slurm's.
    assert job_of(backend.snapshot(), "a").phase is JobPhase.PENDING
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "hold", job_id]]
    record = backend.observe_jobs().managed["a"].record
    assert (record.failed_runs, record.slurm_failed_runs) == ((), ())
    # Decided anew and started as granted: the old run's refusal does not touch the new run.
    fake_slurm.clock.sleep(fake_slurm.cred_expire_s + 2)
    shares = (NodeShare("rtx-1", 1),)
    start = Start("a", 2, Configuration("rtx", 1, 1), shares, BatchChoice(32, 32, 0))
    (result,) = backend.apply([start])
    assert result.ok, result.message
    fake_slurm.start(job_id, ["rtx-1"])
    assert job_of(backend.snapshot(), "a").phase is JobPhase.STARTING
    assert backend.enforcement.requeue == {}
    assert refusal_path(fake_slurm, job_id).exists()  # still there, and ignored


def _symlink(path: Path, job_id: str) -> None:
    elsewhere = path.parent.parent / "elsewhere.json"
    write_document(elsewhere, refusal(job_id))
    os.symlink(elsewhere, path)


def _raw(**fields: Any) -> Callable[[Path, str], None]:
    """Write the record's JSON with ``fields`` as given (not validated on the way)."""

    def write(path: Path, job_id: str) -> None:
        path.write_text(json.dumps({**to_json(refusal(job_id)), **fields}))

    return write


_big = _raw(message="x" * (64 * 1024))


def _write(**overrides: Any) -> Callable[[Path, str], None]:
    return lambda path, job_id: write_document(path, refusal(job_id, **overrides))


@pytest.mark.parametrize(
    ("write", "said"),
    [
        (_write(slurm_restart_count=3), "names job a Slurm job {job} run 3 on rtx-1, but Slurm"),
        (_write(node_list=("rtx-2",)), "on rtx-2, but Slurm runs job {job} run 0 on rtx-1"),
        (_write(sia_id="b"), "names job b Slurm job {job} run 0"),
        (lambda path, job_id: path.write_text("{not json"), "not valid JSON"),
        (lambda path, job_id: path.write_text('{"sia_id": "a"}'), "slurm_job_id: missing"),
        (_raw(slurm_job_id="../1"), "slurm_job_id: expected a Slurm job id (digits) or ''"),
        (_symlink, "is a symbolic link (not followed)"),
        (_big, "larger than 65536 bytes"),
    ],
    ids=[
        "other-run",
        "other-nodes",
        "other-job",
        "not-json",
        "incomplete",
        "bad-id",
        "symlink",
        "big",
    ],
)
def test_a_refusal_for_another_run_or_a_bad_one_is_ignored_and_said(
    fake_slurm: Any, write: Callable[[Path, str], None], said: str
) -> None:
    job_id, backend = started(fake_slurm, "a", ["rtx-1"])
    path = refusal_path(fake_slurm, job_id)
    write(path, job_id)
    snapshot = backend.snapshot()
    assert job_of(snapshot, "a").phase is JobPhase.STARTING
    assert backend.enforcement.requeue == {}
    (ignored,) = [r for r in snapshot.rejected if "refusal ignored" in r]
    assert ignored.startswith(f"job a: launcher's refusal ignored: {path}: ")
    assert said.format(job=job_id) in ignored
    assert not [r for r in backend.snapshot().rejected if "refusal" in r]  # said once


def test_a_refusal_of_another_run_is_not_read(fake_slurm: Any) -> None:
    """Only the file named for the run Slurm runs counts (a leftover of the run before is
    another run's; here one of the next)."""
    job_id, backend = started(fake_slurm, "a", ["rtx-1"])
    write_document(refusal_path(fake_slurm, job_id, 1), refusal(job_id, 1))
    snapshot = backend.snapshot()
    assert job_of(snapshot, "a").phase is JobPhase.STARTING
    assert (backend.enforcement.requeue, snapshot.rejected) == ({}, ())
