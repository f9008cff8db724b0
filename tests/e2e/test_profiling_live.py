"""Sia's profiling of a new model on real Slurm, with the real controller (issue 34).

Every round is ``controller run --once`` as the service account, as cron runs it (the
``site`` of tests/e2e/test_controller_live.py). The jobs are tests/slurm/protocol_job.py: on
a profiling run it writes ``profiled.json`` from the cifar10 seed profile, as the job side
writes what it measured (the job side's own sweep is tested in tests/job). Checked: a
never-seen model is given one GPU of each type in turn, each run with a sweep, its profile
kept and the job then scheduled from it; a second job of the same app waits and reuses the
profile; a hostile profile document is refused while the other jobs go on.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm_dev import DEFAULT_SPEC, DevClusterSpec, controller_config  # noqa: E402
from tests.e2e.test_controller_live import (  # noqa: E402
    SEED_PROFILE,
    Site,
    site,
    wait_for,
)

# The protocol-job tests run on every release (issue 34 asks for a new model profiled, a node
# failing under a profiling run, two jobs of one new app and a hostile report on 22.05, 24.11 and
# 26.05); the real PyTorch job's and the loop's, each marked, on the host's release only: what
# they add is the job side's sweep and the service loop's timing, and their Slurm commands (one-GPU
# runs started, moved, stopped) are those of the tests above them.
pytestmark = [pytest.mark.slurm]
__all__ = ["site"]  # the fixture, used by name


def submit(site: Site, sia_id: str, app: str, *extra: str, **spec: Any) -> str:
    job_args = [
        "--seed-profile", str(SEED_PROFILE), "--profile-type", "a100=dgx",
        "--finish-file", str(site.finish_file(sia_id)), "--sweep-s", "0.5", *extra,
    ]  # fmt: skip
    spec.setdefault("restart_cost", 0.1)
    job_id = site.submitter.submit(
        sia_id, job_args=job_args, app=app, init_batch_size=128, max_batch_size=1024, **spec
    )
    site.slurm_ids.append(job_id)
    return job_id


def status(site: Site) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "sia_slurm.cli", "status", "--offline", "--json",
         "--config", str(site.config_path)],
        env=site.env(), capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def wait_profiled(site: Site, sia_id: str, gpu_type: str | None = None) -> None:
    """Until the job's run has written profiled.json (for ``gpu_type``)."""
    wait_for(
        lambda: [e for e in site.events(sia_id, "profiled") if gpu_type in (None, e["gpu_type"])],
        f"{sia_id} profiled {gpu_type or ''}",
        diagnose=lambda: site.diagnosis(sia_id),
    )


def profiled(site: Site, sia_id: str) -> set[str]:
    return {e["gpu_type"] for e in site.events(sia_id, "profiled")}


def test_a_new_model_is_profiled_on_each_type_then_scheduled_and_its_profile_reused(
    site: Site,
) -> None:
    first = submit(site, "first", "newnet", submit_time=0.0)
    second = submit(site, "second", "newnet")
    types: list[str] = []
    for _ in range(12):
        played = site.round()
        note = played.decisions["first"].get("note", "")
        if not note.startswith("profiling:"):
            break
        waiting = played.decisions["second"]
        assert waiting["action"] == "wait" and "waits for job first" in waiting["note"]
        assert status(site)["profiling"]["first"] == note
        action = played.actions.get("first")
        if action is not None:
            start = site.wait_started("first", played.index)
            assert start["gpus_on_node"] == 1 and start["nodes"] == 1
            assignment = site.assignment("first")
            assert assignment is not None and assignment.profile_sweep[0] == 8
            types.append(start["partition"])
            wait_profiled(site, "first", types[-1])
    else:
        raise AssertionError("still profiling after 12 rounds")
    assert sorted(types) == ["a100", "rtx", "t4"], types
    assert profiled(site, "first") == {"a100", "rtx", "t4"}
    (kept,) = (site.paths.state_dir / "profiles").glob("*/newnet.json")
    document = json.loads(kept.read_text())["document"]
    assert sorted(document["max_local_bsz"]) == ["dgx", "rtx", "t4"]

    # The second job of the app reuses the profile: it starts without a sweep.
    for _ in range(4):
        played = site.round()
        if "second" in played.actions:
            break
    site.wait_started("second", played.index)
    assignment = site.assignment("second")
    assert assignment is not None and assignment.profile_sweep == ()
    assert not profiled(site, "second")

    for sia_id, slurm_id in (("first", first), ("second", second)):
        site.finish(sia_id)
        site.wait_slurm_state(slurm_id, "COMPLETED")
    site.round()
    assert site.job_phases() == {"first": "done", "second": "done"}
    assert len(site.events("first", "done")) == 1


def test_a_hostile_profile_document_is_refused_while_other_jobs_go_on(site: Site) -> None:
    hostile = site.root / "hostile.json"
    hostile.write_text(
        '{"format": 1, "app": "evil", "init_batch_size": 128, "max_batch_size": 1024, '
        '"min_local_bsz": 8, "max_local_bsz": {"t4": 64, "dgx": 64, "rtx": 64}, '
        '"seed": [{"gpu_type": "t4", "local_bsz": 8, "placement": "1", "step_time": -1, '
        '"sync_time": 0}]}'
    )
    submit(site, "evil", "evilnet", "--profiled-doc", str(hostile))
    site.submit("honest", max_gpus=2)
    refused = ""
    for _ in range(8):
        played = site.round()
        honest = played.decisions["honest"]
        assert honest["action"] in ("start", "keep", "move", "rebatch"), honest
        if played.actions.get("evil", {}).get("kind") in ("start", "move"):
            site.wait_started("evil", played.index)
            wait_profiled(site, "evil", site.assignment("evil").gpu_type)  # type: ignore[union-attr]
        refused = played.decisions["evil"].get("note", "")
        if "held" in refused:
            break
    assert "profiling: held: measurements refused 2 times" in refused, refused
    assert "step_time: expected seconds > 0" in refused
    assert not list((site.paths.state_dir / "profiles").glob("*/evilnet.json"))
    assert site.events("honest", "start")


def test_a_profiling_run_whose_node_dies_resumes_its_profiling(site: Site) -> None:
    """The node under the second profiling run dies (its slurmd and the job's processes
    SIGKILLed): Slurm requeues the job, the controller starts it again, and the profiling goes
    on with the type measured before it (never measured again) until every type is in."""
    submit(site, "nf", "nodefail", "--sweep-s", "6")
    starts: list[dict[str, Any]] = []
    victim = ""
    for _ in range(16):
        played = site.round()
        if not played.decisions["nf"].get("note", "").startswith("profiling:"):
            break
        if played.actions.get("nf", {}).get("kind") not in ("start", "move"):
            continue
        starts.append(site.wait_started("nf", played.index))
        if len(starts) == 1:
            wait_profiled(site, "nf", starts[0]["partition"])
        elif not victim:  # the second type's run: its node dies before it has measured
            victim = starts[-1]["node_list"]
            site.cluster.kill_slurmd(victim, jobs=True)
            site.cluster.wait_for_node(victim, lambda state: "DOWN" in state, "DOWN", 90)
        else:
            wait_profiled(site, "nf", starts[-1]["partition"])
    else:
        raise AssertionError("still profiling after 16 rounds")
    try:
        assert victim, starts
        kinds = [e["gpu_type"] for e in site.events("nf", "profiled")]
        assert sorted(kinds) == ["a100", "rtx", "t4"], kinds  # each type measured once
        assert starts[0]["partition"] not in [s["partition"] for s in starts[1:]]
        assert list((site.paths.state_dir / "profiles").glob("*/nodefail.json"))
    finally:
        site.cluster.start_slurmd(victim)
        site.cluster.resume(victim)


@pytest.mark.one_release
def test_a_real_pytorch_job_without_a_profile_is_profiled_and_completes(site: Site) -> None:
    """The transformer example (ElasticTrainer, real torch, gloo) submitted with sia-sbatch
    and no profile: sia-launch gives its run the sweep, the job measures each type it is
    given (the dev cluster's TaskProlog slows the slower types and caps their memory), the
    controller builds its model from what it measured, and the job trains to its end."""
    # 6000 steps: at load 15 the job trained all of 3000 during its profiling rounds and had
    # completed when the controller moved it onto its profile's choice (a failed move)
    done = subprocess.run(
        [sys.executable, "-m", "sia_slurm.job.sbatch", "--config", str(site.config_path),
         "--batch-size", "8", "--max-batch-size", "256", "--max-gpus", "2",
         f"--output={site.root / 'lm.out'}", "--export=ALL,SIA_METRICS_INTERVAL_S=1",
         "--", sys.executable, "-m", "sia_slurm.job.examples.transformer",
         "--epochs", "1000", "--max-steps", "6000", "--dataset-size", "512"],
        env=site.env(), cwd=site.root, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    slurm_id = done.stdout.split()[-1]  # "Submitted batch job N"
    site.slurm_ids.append(slurm_id)
    (sia_id,) = [p.name for p in site.paths.jobs_dir.iterdir()]
    profiled_doc = site.paths.profiled(sia_id)
    types: list[str] = []
    for _ in range(30):
        played = site.round()
        decision = played.decisions.get(sia_id, {})
        if not decision.get("note", "").startswith("profiling:"):
            break
        assert "held:" not in decision["note"], decision["note"]  # no round will change it
        if played.actions.get(sia_id, {}).get("kind") in ("start", "move"):
            gpu_type = played.actions[sia_id]["config"].split(":")[0]
            types.append(gpu_type)
            wait_for(
                lambda t=gpu_type: (
                    profiled_doc.exists()
                    and {"a100": "dgx"}.get(t, t)
                    in json.loads(profiled_doc.read_text())["max_local_bsz"]
                ),
                f"{sia_id} measured {gpu_type}",
                timeout_s=240,
                diagnose=lambda: (site.root / "lm.out").read_text(errors="replace")[-3000:],
            )
    else:
        raise AssertionError("still profiling after 30 rounds")
    # Each type once, or again where noise made a measurement look unsound (it is refused
    # and measured again in a later run: docs/profiling.md)
    assert sorted(set(types)) == ["a100", "rtx", "t4"] and len(types) <= 5, types
    document = json.loads(profiled_doc.read_text())
    limits = document["max_local_bsz"]
    # The dev cluster's TaskProlog reached the job: its emulated memory capped each type's
    # sweep (a100 320 samples, t4 128, rtx 88: the last power of two that fits), and its speed
    # factors slowed the runs on t4 and rtx (each run's log says so at its first step), not
    # a100's. Not the step times' ratio: each type is measured in a few seconds, minutes apart
    # from the others, and under CI's load a ratio of such wall times measures the load (t4
    # measured 1.16x and 1.00x a100's, 4x in theory, when a100's run came at a busier moment);
    # that a slowdown shows in the reported step times is test_devspeed.py's (a real run).
    assert limits == {"dgx": 256, "t4": 128, "rtx": 64}, limits
    log = (site.root / "lm.out").read_text(errors="replace")
    emulated = re.findall(
        r"(\w+) emulated at speed factor ([0-9.e-]+) \(SIA_DEVCLUSTER_SPEED\)", log
    )
    # (how many lines is not fixed: a100 measured again, or trained on t4 or rtx afterwards)
    assert {t for t, _ in emulated} == {"t4", "rtx"}, emulated
    assert all(float(f) < 1 for _, f in emulated), emulated
    # Scheduled from its profile now; left where it is, it trains to its end.
    wait_for(
        lambda: site.slurm_job(slurm_id)["JobState"] == "COMPLETED",
        f"{sia_id} completed",
        timeout_s=600,
        diagnose=lambda: (site.root / "lm.out").read_text(errors="replace")[-3000:],
    )
    site.round()
    assert site.job_phases()[sia_id] == "done"


@pytest.mark.one_release
def test_the_loop_moves_a_profiling_job_as_soon_as_it_has_measured(site: Site) -> None:
    """The controller's loop (systemd's way, as the service account) with rounds an hour
    apart: the job starts at the loop's first round, and each measurement it writes brings
    the next round forward (sia_slurm/service/early.py), so it moves to its next type within
    seconds, not an hour. The types go slowest first (t4, rtx, a100 on the dev cluster: the
    shipped profiles' ranking), so profiling ends on the A100s."""
    config = controller_config(
        DevClusterSpec.parse(DEFAULT_SPEC),
        site.paths.state_dir,
        round_seconds=3600,
        policy_params={"lambda_a": 0.01},
        checkpoint_timeout_s=30,
    )
    site.config_path.write_text(config)
    slurm_id = submit(site, "early", "earlynet")
    loop = subprocess.Popen(
        site.loop_argv(), env=site.env(), cwd=site.root,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        for count in (1, 2, 3):
            wait_for(
                lambda c=count: len(site.events("early", "profiled")) >= c,
                f"measurement {count}",
                timeout_s=240,
                diagnose=lambda: site.diagnosis("early"),
            )
            if count < 3:
                wait_for(
                    lambda c=count: len(site.events("early", "start")) > c,
                    f"the move after measurement {count}",
                    timeout_s=240,
                    diagnose=lambda: site.diagnosis("early"),
                )
        starts = site.events("early", "start")
        measured = site.events("early", "profiled")
        assert [e["gpu_type"] for e in measured] == ["t4", "rtx", "a100"], measured
        for before, after in zip(measured[:2], starts[1:3], strict=True):
            assert after["time"] - before["time"] < 120, (before, after)  # not the hour
        log = site.log_path.read_text()
        assert "job early wrote a profiling measurement: a round now" in log
        site.finish("early")
        site.wait_slurm_state(slurm_id, "COMPLETED")
    finally:
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=120)
    assert loop.returncode == 0
