"""The dev cluster's fault operations on the real daemons: slurmctld SIGKILLed and started
again from its saved state, a slurmd killed (alone, or with its node's jobs) and started again,
a node drained and resumed. What Slurm does then is what the controller has to live with
(tests/e2e/test_slurm_faults_live.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sia_slurm.slurm.records import parse_records
from sia_slurm_dev import DevCluster, DevClusterError, DevClusterSpec
from sia_slurm_dev.process import node_job_processes
from tests.e2e.test_controller_live import wait_for

pytestmark = pytest.mark.slurm


def job(cluster: DevCluster, job_id: str) -> dict[str, str]:
    shown = cluster.runner().run(["scontrol", "-o", "show", "job", job_id]).stdout
    (record,) = parse_records(shown)
    return record


def in_state(cluster: DevCluster, job_id: str, state: str) -> dict[str, str] | None:
    record = job(cluster, job_id)
    return record if record["JobState"] == state else None


def log_tail(cluster: DevCluster, lines: int = 40) -> str:
    text = cluster.layout.slurmctld_log.read_text(errors="replace")
    return "\n".join(line for line in text.splitlines() if "pmix" not in line)[-6000:]


def story(cluster: DevCluster, job_id: str, out: Path, node: str) -> str:
    """What Slurm says of a job, its start lines, and the daemons' log lines about it."""
    lines = [f"job: {job(cluster, job_id)}", f"starts: {starts(out)}"]
    for log in (cluster.layout.slurmctld_log, *cluster.layout.log_dir.glob(f"slurmd*{node}*")):
        text = log.read_text(errors="replace").splitlines()
        lines.append(f"--- {log.name}")
        lines += [line for line in text if job_id in line or "revoke" in line.lower()][-40:]
    return "\n".join(lines)


def starts(out: Path) -> list[str]:
    """The job's start lines; none while its output file does not exist yet (a job is RUNNING
    before slurmd's step creates the file: seen on 24.11)."""
    if not out.exists():
        return []
    return [line for line in out.read_text().splitlines() if line.startswith("start")]


@pytest.fixture
def submit(dev_cluster: DevCluster, tmp_path: Path) -> Iterator[Callable[[str], tuple[str, Path]]]:
    """sbatch a --requeue job pinned to a node; it logs each start and sleeps."""
    jobs: list[str] = []

    def sbatch(node: str) -> tuple[str, Path]:
        out = tmp_path / f"{node}-{len(jobs)}.out"
        argv = ["sbatch", "--parsable", "--requeue", "--open-mode=append", "-w", node]
        argv += ["-p", node.rsplit("-", 1)[0], "--gpus-per-node=1", "-o", str(out)]
        script = 'echo "start ${SLURM_RESTART_COUNT:-0} $SLURM_GPUS_ON_NODE"; sleep 600'
        job_id = dev_cluster.runner().run([*argv, "--wrap", script]).stdout.strip()
        jobs.append(job_id)
        return job_id, out

    yield sbatch
    dev_cluster.start_killed()
    if jobs:
        dev_cluster.runner().run(["scancel", *jobs], check=False)


def test_slurmctld_killed_and_started_again_keeps_running_jobs(
    dev_cluster: DevCluster,
    dev_cluster_spec: DevClusterSpec,
    submit: Callable[[str], tuple[str, Path]],
) -> None:
    job_id, out = submit("rtx-2")
    wait_for(lambda: in_state(dev_cluster, job_id, "RUNNING"), "the job to run")
    # What slurmctld has not written down when it dies is gone (a start by its backfill
    # scheduler may stay unwritten for minutes): the test asks it to save first.
    saved = dev_cluster.save_state(job_id)
    assert (dev_cluster.layout.state_dir / "job_state").stat().st_mtime == saved
    killed = dev_cluster.kill_slurmctld()
    assert not dev_cluster.is_up()
    assert "STOPPED" in dev_cluster.status()
    with pytest.raises(DevClusterError, match=r"partly running.*dev-cluster start DAEMON"):
        dev_cluster.up(dev_cluster_spec)
    failed = dev_cluster.runner(timeout_s=60).run(["scontrol", "ping"], check=False)
    assert "DOWN" in failed.stdout, failed

    started = dev_cluster.start_slurmctld()
    assert started.pid != killed.pid and dev_cluster.is_up()
    assert all("UNKNOWN" not in dev_cluster.node_state(n) for n in dev_cluster.node_names())
    record = wait_for(lambda: in_state(dev_cluster, job_id, "RUNNING"), "the job, recovered")
    assert (record["Restarts"], record["NodeList"]) == ("0", "rtx-2")
    time.sleep(2)
    assert starts(out) == ["start 0 1"], log_tail(dev_cluster)  # never relaunched
    with pytest.raises(DevClusterError, match="slurmctld still runs"):
        dev_cluster.start_slurmctld()


def test_a_node_that_dies_with_its_jobs_goes_down_and_comes_back(
    dev_cluster: DevCluster, submit: Callable[[str], tuple[str, Path]]
) -> None:
    job_id, out = submit("t4-2")
    wait_for(lambda: in_state(dev_cluster, job_id, "RUNNING"), "the job to run")
    spool = dev_cluster.layout.spool_dir("t4-2")
    # Its script's first line, not only its processes: under load slurmstepd runs a while
    # before the script echoes, and a kill then left only the second start (loaded run 8).
    wait_for(lambda: starts(out) == ["start 0 1"], "the job's script to run (RUNNING comes first)")
    wait_for(lambda: node_job_processes(spool), "the job's processes")
    killed_at = time.monotonic()
    killed = dev_cluster.kill_slurmd("t4-2", jobs=True)
    assert killed and not node_job_processes(spool)
    dev_cluster.wait_for_node("t4-2", lambda state: "DOWN" in state, "DOWN", 90)
    down_after = time.monotonic() - killed_at
    record = wait_for(lambda: in_state(dev_cluster, job_id, "PENDING"), "the job requeued")
    assert record["Restarts"] == "1", record  # Slurm requeued the --requeue job

    dev_cluster.start_slurmd("t4-2")
    assert dev_cluster.node_state("t4-2") in ("IDLE", "MIXED", "ALLOCATED")
    explain = lambda: story(dev_cluster, job_id, out, "t4-2")  # noqa: E731
    wait_for(
        lambda: in_state(dev_cluster, job_id, "RUNNING"), "the job again", 90, diagnose=explain
    )
    wait_for(
        lambda: starts(out) == ["start 0 1", "start 1 1"], "its second start", 60, diagnose=explain
    )
    assert down_after < 60, f"DOWN only after {down_after:.0f} s"


def test_a_slurmd_that_dies_alone_leaves_its_job_running_until_it_is_back(
    dev_cluster: DevCluster, submit: Callable[[str], tuple[str, Path]]
) -> None:
    """The job's processes outlive slurmd; Slurm requeues the job once the node is DOWN and
    kills the leftover run only when the node's slurmd reports it again."""
    job_id, out = submit("t4-1")
    wait_for(lambda: in_state(dev_cluster, job_id, "RUNNING"), "the job to run")
    spool = dev_cluster.layout.spool_dir("t4-1")
    wait_for(lambda: len(starts(out)) == 1, "the job's script to run (RUNNING comes first)")
    leftover = node_job_processes(spool)
    assert dev_cluster.kill_slurmd("t4-1") == set()
    dev_cluster.wait_for_node("t4-1", lambda state: "DOWN" in state, "DOWN", 90)
    wait_for(lambda: in_state(dev_cluster, job_id, "PENDING"), "the job requeued")
    assert leftover and leftover <= node_job_processes(spool)  # the old run still runs

    dev_cluster.start_slurmd("t4-1")
    wait_for(lambda: not (leftover & node_job_processes(spool)), "the old run killed", 30)
    wait_for(lambda: in_state(dev_cluster, job_id, "RUNNING"), "the job running again", 90)
    wait_for(lambda: len(starts(out)) == 2, "its second start")


def test_drain_and_resume(
    dev_cluster: DevCluster, submit: Callable[[str], tuple[str, Path]]
) -> None:
    dev_cluster.drain("a100-2", "test")
    assert "DRAIN" in dev_cluster.node_state("a100-2")
    job_id, _ = submit("a100-2")
    time.sleep(3)
    assert in_state(dev_cluster, job_id, "PENDING")
    assert dev_cluster.resume("a100-2") in ("IDLE", "MIXED", "ALLOCATED")
    wait_for(lambda: in_state(dev_cluster, job_id, "RUNNING"), "the job to run after resume")
    assert dev_cluster.resume("a100-2") in ("MIXED", "ALLOCATED")  # nothing to resume: no-op
