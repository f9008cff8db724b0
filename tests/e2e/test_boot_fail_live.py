"""Issue 18 item 2: a node that fails to boot, on a real dev cluster with Slurm's power saving.

Power saving changes how Slurm treats idle nodes, so this test has a cluster of its own (two
a100 nodes, on the session's second port range), not the session's. What Slurm does (22.05,
24.11, 26.05 alike; docs/slurm-actuation.md, "A node that fails to boot"): a ``--requeue``
batch job allocated a powered-down node is CONFIGURING while Slurm runs ResumeProgram; when
the node has not booted ResumeTimeout later, slurmctld logs "node N not resumed by
ResumeTimeout", sets the node DOWN ("ResumeTimeout reached") and requeues the job (Restarts
+1, PENDING), never BOOT_FAIL. The job's code never ran there: no failure of the job's.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm_dev import DevCluster, DevClusterSpec  # noqa: E402
from sia_slurm_dev.slurm_conf import PowerSavingConfig  # noqa: E402
from tests.accounts import SharedTmp, TestAccounts  # noqa: E402
from tests.e2e.test_slurm_faults_live import ControllerLoop, Faults, controller_site  # noqa: E402
from tests.release import SECOND_PORT_OFFSET, TEST_PORT_BASE, TEST_SLURM  # noqa: E402

pytestmark = pytest.mark.slurm

SPEC = DevClusterSpec.parse("a100:2x4")
NODES = tuple(SPEC.node_names())
# Slurm looks at booting nodes every ~10 s, so a boot fails 5 to ~15 s after its request.
RESUME_TIMEOUT_S = 5


@pytest.fixture(scope="module")
def power_cluster(shared_tmp: SharedTmp, test_accounts: TestAccounts) -> Iterator[DevCluster]:
    """Two a100 nodes, both under power saving (Slurm powers neither down by itself)."""
    cluster = DevCluster(
        shared_tmp.mktemp("power-cluster"),
        port_base=TEST_PORT_BASE + SECOND_PORT_OFFSET,
        slurm_user=test_accounts.service.name,
        slurm=TEST_SLURM,
        power_saving=PowerSavingConfig(NODES, resume_timeout_s=RESUME_TIMEOUT_S),
    )
    cluster.up(SPEC)
    try:
        yield cluster
    finally:
        cluster.down()


@pytest.fixture
def boot_faults(
    power_cluster: DevCluster, test_accounts: TestAccounts, shared_tmp_path: Path
) -> Iterator[Faults]:
    """A controller site on the power-saving cluster, its loop not started yet."""
    site = controller_site(power_cluster, SPEC, test_accounts, shared_tmp_path)
    loop = ControllerLoop(site)
    try:
        yield Faults(site, loop)
    finally:
        loop.stop()
        if site.slurm_ids:
            site.run(["scancel", *site.slurm_ids], check=False)


def test_a_job_moved_onto_a_node_that_fails_to_boot_comes_back_from_its_checkpoint(
    boot_faults: Faults,
) -> None:
    """The job runs and checkpoints on one node; the other is powered down and its power
    cut (its slurmd killed). The job's node is drained: the controller moves the job onto
    the powered-down node (capacity: Slurm boots it), the boot fails, Slurm sets that node
    DOWN and requeues the job. Once its first node is back, the controller starts the job
    there from the move's checkpoint; nothing is counted against the job, and it completes
    once."""
    faults = boot_faults
    site, loop, cluster = faults.site, faults.loop, faults.cluster
    job_id = site.submit("boot", partition="a100", max_gpus=1)
    loop.start()
    faults.wait(lambda: faults.settled(time.time() - 1), "the job running, then a quiet round")
    (home,) = faults.where("boot")
    (dark,) = [node for node in NODES if node != home]
    site.run(["scontrol", "update", f"NodeName={dark}", "State=POWER_DOWN_FORCE"])
    cluster.wait_for_node(dark, lambda state: "POWERED_DOWN" in state.split("+"), "off", 60)
    cluster.kill_slurmd(dark)  # the power is off: nothing will answer a boot
    before = len(faults.runs("boot"))
    moved = time.time()
    cluster.drain(home, "boot-fail test")

    log = cluster.layout.slurmctld_log
    requeued = f"requeue job JobId={job_id} due to failure of node {dark}"
    faults.wait(
        lambda: requeued in log.read_text(errors="replace"),
        f"the job moved onto {dark}, its boot failed and Slurm requeued the job",
    )
    lines = log.read_text(errors="replace").splitlines()
    print(*[line for line in lines if dark in line or f"JobId={job_id} " in line][-8:], sep="\n")
    assert any(f"node {dark} not resumed by ResumeTimeout({RESUME_TIMEOUT_S})" in line
               for line in lines)  # fmt: skip
    state = cluster.node_state(dark)
    assert "DOWN" in state.split("+"), state
    cluster.resume(home)
    resumed = faults.wait(
        lambda: faults.reporting("boot", after=moved), f"the job running again on {home}", 90
    )
    print(f"back after {time.time() - moved:.1f} s: {resumed}")
    assert resumed["node_list"] == home
    acked = [e for e in site.events("boot") if e["event"] == "acked" and e["time"] > moved]
    assert acked and resumed["counter"] == acked[-1]["counter"] > 0  # from the move's checkpoint
    # The failed boot never started the job's code: one run more than before the move.
    assert len(faults.runs("boot")) == before + 1
    # The booting job was seen all along (22.05's squeue prints its state CONFIGURING alone).
    skipped = [line["message"] for line in loop.lines()
               if line.get("message", "").startswith(f"squeue job {job_id}: skipped")]  # fmt: skip
    assert not skipped, skipped
    record = json.loads(site.paths.slurm_record("boot").read_text())
    assert not record.get("failed_runs"), record  # never counted as the job's own failure
    faults.finish_all()
    faults.check_completed_once()
