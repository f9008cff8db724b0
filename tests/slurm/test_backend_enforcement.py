"""Who a job belongs to (Slurm says, at first sight) and what the backend undoes every round:
a run the controller did not grant is requeued and held, a pending job that someone else
released (or only its user holds) is held by the controller. On the fake Slurm."""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import pytest

from sia_slurm.cluster import BatchChoice, JobPhase, Start
from sia_slurm.config import parse_config
from sia_slurm.core import Configuration
from sia_slurm.policy.base import NodeShare
from sia_slurm.protocol import JobSpec, write_document
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.observe.jobfiles import SlurmRecord

CONFIG = (
    "state_dir: {state_dir}\npartitions:\n"
    "  a100: {{gpu_type: a100, gpus_per_node: 4}}\n"
    "  rtx: {{gpu_type: rtx, gpus_per_node: 4}}\n"
    "  t4: {{gpu_type: t4, gpus_per_node: 4}}\n"
    "restart: {{checkpoint_timeout_s: 30}}\n"
)
OTHER_UID = 4242


@pytest.fixture
def caplog(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> Any:
    """pytest's log capture, also after a test configured the service's logging (which stops
    ``sia_slurm`` records at its own handler)."""
    monkeypatch.setattr(logging.getLogger("sia_slurm"), "propagate", True)
    return caplog


def actuation_log(caplog: pytest.LogCaptureFixture, job_id: str) -> list[logging.LogRecord]:
    """The actuator's log records about Slurm job ``job_id``."""
    return [
        r
        for r in caplog.records
        if r.name == "sia_slurm.slurm.actuate.enforce" and f"Slurm job {job_id}:" in r.getMessage()
    ]


def backend_for(fake: Any) -> SlurmBackend:
    config = parse_config(CONFIG.format(state_dir=fake.paths.state_dir))
    return SlurmBackend(config, fake, fake.clock)


def started(fake: Any, sia_id: str, nodes: list[str], per_node: int = 1) -> tuple[str, Any]:
    """A job the backend started (round 1) on ``nodes`` of rtx, now running there."""
    job_id = fake.submit(sia_id, "rtx", per_node)
    backend = backend_for(fake)
    config = Configuration("rtx", len(nodes), per_node * len(nodes))
    placement = tuple(NodeShare(n, per_node) for n in nodes)
    batch = BatchChoice(32 * config.gpus, 32, 0)
    (result,) = backend.apply([Start(sia_id, 1, config, placement, batch)])
    assert result.ok, result.message
    fake.start(job_id, nodes)
    fake.clear_calls()
    return job_id, backend


def job_of(snapshot: Any, sia_id: str) -> Any:
    (job,) = [j for j in snapshot.jobs if j.sia_id == sia_id]
    return job


def usable(snapshot: Any) -> dict[str, int]:
    return {node.name: node.usable_gpus for node in snapshot.nodes}


# ------------------------------------------------------------------------------------------------
# Runs the controller did not grant


def test_a_running_job_without_an_assignment_is_requeued_and_held(
    fake_slurm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    fake_slurm.jobs[job_id].update(priority=1, state_reason="None")  # released by its user
    fake_slurm.start(job_id, ["t4-1"])  # ... and started by Slurm, outside the plan
    snapshot = backend.snapshot()
    job = job_of(snapshot, "a")
    assert (job.phase, job.config, job.placement) == (JobPhase.PENDING, None, ())
    assert job.message == (
        "runs on GPUs the controller did not grant (no assignment from the controller); "
        "being requeued"
    )
    assert usable(snapshot)["t4-1"] == 3  # its GPU is taken, not the plan's to give
    fake_slurm.clear_calls()
    with caplog.at_level(logging.INFO, logger="sia_slurm.slurm.actuate.enforce"):
        assert backend.apply([]) == []
    assert fake_slurm.calls == [["scontrol", "requeuehold", job_id]]
    assert [r.levelno for r in actuation_log(caplog, job_id)] == [logging.WARNING]
    assert fake_slurm.job(job_id)["job_state"] == "PENDING"
    # The requeue's hold is its user's; the next round makes it the controller's.
    backend.snapshot()
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "hold", job_id]]
    assert not fake_slurm.user_release(job_id)
    assert job_of(backend.snapshot(), "a").phase is JobPhase.PENDING
    assert backend.enforcement.requeue == backend.enforcement.hold == {}


def test_a_user_requeue_of_a_granted_run_is_held_and_its_restart_requeued(
    fake_slurm: Any,
) -> None:
    """The assignment names one Slurm run: after the user's own ``scontrol requeue`` (not
    held, BeginTime) the job waits under the controller's hold, and if it started anyway its
    new run is not the granted one."""
    job_id, backend = started(fake_slurm, "a", ["rtx-1"])
    assert job_of(backend.snapshot(), "a").phase is JobPhase.STARTING
    fake_slurm.user_requeue(job_id)
    snapshot = backend.snapshot()
    assert job_of(snapshot, "a").phase is JobPhase.PENDING
    assert {k: why for k, (_, why) in backend.enforcement.hold.items()} == {
        "a": "released without a grant"
    }
    fake_slurm.start(job_id, ["rtx-1"])  # Slurm started it before the controller's round
    snapshot = backend.snapshot()
    job = job_of(snapshot, "a")
    assert job.phase is JobPhase.PENDING and job.config is None
    assert (
        f"its assignment (round 1) is for Slurm job {job_id} run 0, this is job {job_id} run 1"
        in job.message
    )
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "requeuehold", job_id]]


def test_a_running_job_reshaped_by_its_user_is_requeued(fake_slurm: Any) -> None:
    """Users may shrink their running job's node count (22.05.8): the run no longer is the
    granted one."""
    job_id, backend = started(fake_slurm, "a", ["rtx-1", "rtx-2"], per_node=2)
    assert job_of(backend.snapshot(), "a").phase is JobPhase.STARTING
    fake_slurm.jobs[job_id].update(nodes="rtx-1", node_count=1, gres_detail=["gpu:2(IDX:0-1)"])
    snapshot = backend.snapshot()
    job = job_of(snapshot, "a")
    assert job.phase is JobPhase.PENDING
    assert "1 node(s) (assigned 2)" in job.message
    assert usable(snapshot)["rtx-1"] == 2 and usable(snapshot)["rtx-2"] == 4
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "requeuehold", job_id]]


def test_a_job_its_user_released_is_held_by_the_controller(fake_slurm: Any) -> None:
    """A stopped job's requeuehold is a user hold: released by its user before the controller
    gives it GPUs, it is held again (an admin hold, which she cannot release)."""
    job_id, backend = started(fake_slurm, "a", ["rtx-1"])
    fake_slurm.run(["scontrol", "requeuehold", job_id])  # as a stop's first step leaves it
    assert fake_slurm.user_release(job_id)
    snapshot = backend.snapshot()
    job = job_of(snapshot, "a")
    assert job.phase is JobPhase.PENDING and job.config is None
    assert job.message == "pending (released, reason None)"
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "hold", job_id]]
    assert fake_slurm.job(job_id)["state_reason"] == "JobHeldAdmin"
    assert not fake_slurm.user_release(job_id)


def test_held_jobs_are_put_under_the_controllers_hold_once(
    fake_slurm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    mine, admin = fake_slurm.submit("a"), fake_slurm.submit("b")
    fake_slurm.run(["scontrol", "hold", admin])
    backend = backend_for(fake_slurm)
    backend.snapshot()
    assert {k: why for k, (_, why) in backend.enforcement.hold.items()} == {
        "a": "held by its user (JobHeldUser)"  # sbatch --hold: she could release it
    }
    fake_slurm.clear_calls()
    with caplog.at_level(logging.INFO, logger="sia_slurm.slurm.actuate.enforce"):
        backend.apply([])
    assert fake_slurm.calls == [["scontrol", "hold", mine]]
    # Every new job comes with its user's hold: routine, said at info (a warning is for runs
    # and releases the controller did not grant).
    (said,) = actuation_log(caplog, mine)
    assert said.levelno == logging.INFO
    assert said.getMessage() == (
        f"[job=a] Slurm job {mine}: held by its user (JobHeldUser): held by the controller"
    )
    backend.snapshot()
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == []  # nothing left to undo: nothing issued


def test_an_enforcement_that_fails_is_logged_and_met_again(
    fake_slurm: Any, caplog: pytest.LogCaptureFixture
) -> None:
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    backend.snapshot()
    del fake_slurm.jobs[job_id]  # gone meanwhile: scontrol hold fails
    with caplog.at_level(logging.WARNING):
        assert backend.apply([]) == []
    assert f"Slurm job {job_id}: held by its user (JobHeldUser), but it could not be held" in (
        caplog.text
    )
    assert backend.enforcement.hold == {}  # consumed; the next snapshot decides again


def test_dry_snapshots_enforce_nothing(fake_slurm: Any) -> None:
    """Only ``apply`` acts: status and explain take snapshots and change nothing."""
    job_id = fake_slurm.submit("a")
    fake_slurm.start(job_id, ["t4-1"])
    backend = backend_for(fake_slurm)
    for _ in range(3):
        backend.snapshot()
    verbs = fake_slurm.verbs()
    assert verbs.count("scontrol show") == 1  # show config, once: is accounting on?
    assert [v for v in verbs if v != "scontrol show"] == [
        "scontrol -d",
        "scontrol -o",
        "squeue",
    ] * 3
    assert not fake_slurm.paths.slurm_record("a").exists()
    assert fake_slurm.job(job_id)["job_state"] == "RUNNING"


# ------------------------------------------------------------------------------------------------
# Identity: whose job it is, from Slurm


def test_first_sight_records_slurms_owner_and_submit_time_when_acting(fake_slurm: Any) -> None:
    job_id = fake_slurm.submit("a")
    submitted = fake_slurm.job(job_id)["submit_time"]
    # What the user wrote claims another owner and an older age: neither counts.
    write_document(
        fake_slurm.paths.spec("a"),
        JobSpec(sia_id="a", app="cifar10", owner_uid=OTHER_UID, submit_time=1.0),
    )
    fake_slurm.clock.sleep(100.0)
    backend = backend_for(fake_slurm)
    snapshot = backend.snapshot()
    spec = job_of(snapshot, "a").spec
    assert (spec.owner_uid, spec.submit_time) == (os.geteuid(), submitted)
    assert not fake_slurm.paths.slurm_record("a").exists()  # a snapshot writes nothing
    backend.apply([])
    record = SlurmRecord.read(fake_slurm.paths.slurm_record("a"))
    assert record == SlurmRecord(job_id, os.geteuid(), submitted)
    assert fake_slurm.paths.slurm_record("a").parent == fake_slurm.paths.control("a")
    assert job_of(backend.snapshot(), "a").spec.submit_time == submitted
    assert backend.enforcement.new_records == {}  # known now


def test_a_copycat_job_of_another_user_is_foreign(fake_slurm: Any) -> None:
    """Another user's Slurm job with the same comment, submitted first and running, is not
    managed: the job is its directory's owner's; the copycat's GPUs count as taken."""
    copycat = fake_slurm.submit("a", user_id=OTHER_UID)
    fake_slurm.start(copycat, ["t4-1"])
    mine = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    snapshot = backend.snapshot()
    job = job_of(snapshot, "a")
    assert job.slurm_job_id == mine and job.spec.owner_uid == os.geteuid()
    assert snapshot.rejected == (
        f"job a: Slurm job {copycat} of uid {OTHER_UID} carries the sia id of uid "
        f"{os.geteuid()}'s job: not managed, its GPUs count as taken",
    )
    assert usable(snapshot)["t4-1"] == 3
    assert "a" not in backend.enforcement.requeue  # not ours to requeue either
    fake_slurm.clear_calls()
    backend.apply([])
    assert ["scancel", copycat] not in fake_slurm.calls
    assert fake_slurm.job(copycat)["job_state"] == "RUNNING"
    assert SlurmRecord.read(fake_slurm.paths.slurm_record("a")).slurm_job_id == mine  # type: ignore[union-attr]


def test_a_job_whose_user_has_no_directory_is_not_managed(fake_slurm: Any) -> None:
    """Only the owner of ``jobs/<sia_id>/`` can be a job's user: another account's job
    carrying an id nobody made a directory for is nobody's."""
    stranger = fake_slurm.submit("b", user_id=OTHER_UID)  # no directory: not made for it
    backend = backend_for(fake_slurm)
    snapshot = backend.snapshot()
    assert snapshot.jobs == ()
    assert snapshot.rejected == (
        f"job b: not scheduled: Slurm job(s) {stranger} carry it, but "
        f"{fake_slurm.paths.job_dir('b')} is not a directory of their user",
    )
    (fake_slurm.paths.job_dir("b")).mkdir()  # made by this account, not the job's user
    assert backend_for(fake_slurm).snapshot().jobs == ()


def test_a_recorded_job_stays_managed_when_its_comment_is_rewritten(fake_slurm: Any) -> None:
    """Users may rewrite their job's comment: a job the controller recorded is known by its
    Slurm id, so it is still enforced."""
    job_id = fake_slurm.submit("a")
    backend = backend_for(fake_slurm)
    backend.snapshot()
    backend.apply([])  # recorded
    fake_slurm.jobs[job_id].update(comment="mine now", priority=1, state_reason="None")
    fake_slurm.start(job_id, ["t4-1"])
    snapshot = backend.snapshot()
    job = job_of(snapshot, "a")
    assert job.slurm_job_id == job_id and job.phase is JobPhase.PENDING
    assert usable(snapshot)["t4-1"] == 3
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "requeuehold", job_id]]


def test_a_run_requeued_outside_the_controller_is_pending_while_it_completes(
    fake_slurm: Any,
) -> None:
    """While Slurm takes back the GPUs of a run someone else requeued (COMPLETING, one more
    restart), the job is PENDING: kept where it was, it would never be started again."""
    job_id, backend = started(fake_slurm, "a", ["rtx-1"])
    job = fake_slurm.jobs[job_id]
    job.update(job_state="COMPLETING", restart_cnt=job["restart_cnt"] + 1)
    snapshot = job_of(backend.snapshot(), "a")
    assert (snapshot.phase, snapshot.config) == (JobPhase.PENDING, None)
    assert snapshot.message == "requeued outside the controller; Slurm is taking its GPUs back"
    job.update(restart_cnt=job["restart_cnt"] - 1)  # the granted run completing: not judged
    assert job_of(backend.snapshot(), "a").phase is not JobPhase.PENDING


def test_a_released_job_whose_request_is_not_its_assignment_is_held_and_decided_anew(
    fake_slurm: Any,
) -> None:
    """Issue 18 item 4: a release whose update was lost (seen after a slurmctld restart: a
    2-node grant waiting with one task) must not start as it is, nor wait so for ever."""
    job_id = fake_slurm.submit("a", "rtx", 2)
    backend = backend_for(fake_slurm)
    config = Configuration("rtx", 2, 4)
    placement = (NodeShare("rtx-1", 2), NodeShare("rtx-2", 2))
    (result,) = backend.apply([Start("a", 1, config, placement, BatchChoice(128, 32, 0))])
    assert result.ok, result.message
    job = job_of(backend.snapshot(), "a")
    assert job.phase is JobPhase.STARTING and job.message.endswith("(reason None)")
    fake_slurm.job(job_id)["tasks"] = 1  # the update of NumTasks is gone
    job = job_of(backend.snapshot(), "a")
    assert job.phase is JobPhase.PENDING and job.config is None
    assert {k: why for k, (_, why) in backend.enforcement.hold.items()} == {
        "a": "released, but its request is not its assignment (NumTasks=1 (wanted 2))"
    }
    fake_slurm.clear_calls()
    backend.apply([])
    assert fake_slurm.calls == [["scontrol", "hold", job_id]]


def test_gpus_slurm_counts_allocated_to_no_job_are_no_capacity(fake_slurm: Any) -> None:
    """Slurm 22.05 was seen to keep GPUs allocated on an idle node (``GresUsed``) after a
    slurmd that died alone came back: it would start nothing there, so the policy must not
    count them, and the snapshot says so once. GPUs a job holds are no phantom."""
    job_id = fake_slurm.submit("a", "a100", 2)
    fake_slurm.start(job_id, ["a100-1"])
    lines = []
    for line in fake_slurm.nodes_text.splitlines():
        name = line.split()[0].removeprefix("NodeName=")
        used = {"a100-1": "gpu:a100:2(IDX:0-1)", "t4-1": "gpu:t4:3(IDX:0-2)"}.get(name)
        lines.append(f"{line} GresUsed={used}" if used else line)
    fake_slurm.nodes_text = "\n".join(lines) + "\n"
    backend = backend_for(fake_slurm)
    snapshot = backend.snapshot()
    usable = {n.name: n.usable_gpus for n in snapshot.nodes}
    # a100-1: 2 taken by the job (it runs without a grant), none phantom (GresUsed are its 2)
    assert usable["t4-1"] == 1 and usable["a100-1"] == 2
    said = [m for m in snapshot.rejected if "Slurm counts" in m]
    assert said == [
        "node t4-1: Slurm counts 3 GPU(s) allocated, its jobs hold 0; 3 left out until Slurm "
        "frees them (restarting slurmctld rebuilds its GPU accounting from the jobs)"
    ]
    again = backend.snapshot()
    assert not [m for m in again.rejected if "Slurm counts" in m]  # said once
    assert {n.name: n.usable_gpus for n in again.nodes}["t4-1"] == 1


def test_a_submission_slurm_forgot_is_said_once_and_nothing_else_is(fake_slurm: Any) -> None:
    """A job directory with a spec that neither a Slurm job nor the controller's record names,
    once it is older than a few rounds, is a lost submission (slurmctld crashed before it
    saved the job). A job Slurm knows, one the controller recorded (finished and forgotten by
    Slurm since), a fresh one and a directory that is no sia id are not."""
    for sia_id in ("lost", "fresh", "recorded"):
        fake_slurm.paths.job_dir(sia_id).mkdir()
        write_document(fake_slurm.paths.spec(sia_id), JobSpec(sia_id=sia_id, app="cifar10"))
    fake_slurm.submit("alive")  # Slurm knows it
    (fake_slurm.paths.jobs_dir / "-not-an-id").mkdir()
    old = time.time() - 600
    for sia_id in ("lost", "recorded", "alive"):
        os.utime(fake_slurm.paths.spec(sia_id), (old, old))
    record = SlurmRecord(slurm_job_id="7", user_id=os.geteuid(), submit_time=old)
    fake_slurm.paths.control("recorded").mkdir(parents=True)
    record.write(fake_slurm.paths.slurm_record("recorded"))
    backend = backend_for(fake_slurm)
    said = [m for m in backend.snapshot().rejected if m.startswith("lost submission")]
    assert len(said) == 1 and said[0].startswith("lost submission: job lost: spec.json written")
    assert "submit it again" in said[0]
    assert not [m for m in backend.snapshot().rejected if m.startswith("lost submission")]
