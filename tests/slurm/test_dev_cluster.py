"""The dev cluster against the real daemons: typed GPUs schedule where they should, `up` is
idempotent, `down` stops exactly what `up` started, and `config check --live` sees mismatches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sia_slurm.cli.main import cli
from sia_slurm.slurm.observe.inventory import read_inventory
from sia_slurm.slurm.records import parse_records
from sia_slurm_dev import DevCluster, DevClusterSpec
from sia_slurm_dev.process import DaemonRecord, is_alive
from sia_slurm_dev.roots import mounts_under
from tests.release import SECOND_PORT_OFFSET, TEST_PORT_BASE, TEST_RELEASE, TEST_SLURM

REPO = Path(__file__).resolve().parents[2]

# Every test here runs real daemons: the session's cluster, or a second one it starts itself.
pytestmark = pytest.mark.slurm


def wait_for_job(cluster: DevCluster, job_id: str, timeout_s: float = 60) -> dict[str, str]:
    runner = cluster.runner()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        (record,) = parse_records(runner.run(["scontrol", "-o", "show", "job", job_id]).stdout)
        if record["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            return record
        time.sleep(0.3)
    others = runner.run(["squeue", "-h", "-o", "%i %u %T %P %N %r %k"], check=False).stdout
    nodes = runner.run(["scontrol", "-d", "-o", "show", "node"], check=False).stdout
    reservations = runner.run(["scontrol", "-o", "show", "reservation"], check=False).stdout
    log = cluster.layout.slurmctld_log.read_text(errors="replace").splitlines()[-40:]
    raise AssertionError(
        f"job {job_id} did not finish in {timeout_s} s: {record}\nsqueue:\n{others}\n"
        f"nodes:\n{nodes}\nreservations:\n{reservations}\nslurmctld.log:\n" + "\n".join(log)
    )


def sbatch(cluster: DevCluster, *args: str) -> str:
    out = cluster.runner().run(["sbatch", "--parsable", *args]).stdout
    return out.strip().split(";")[0]


def test_nodes_are_idle_with_typed_gpus(
    dev_cluster: DevCluster, dev_cluster_spec: DevClusterSpec
) -> None:
    # An earlier test's cancelled job may leave a node IDLE+COMPLETING for a few seconds.
    deadline = time.monotonic() + 30
    while True:
        inventory = read_inventory(dev_cluster.runner())
        states = {
            n.name: n.state
            for g in dev_cluster_spec.groups
            for n in inventory.nodes_of(g.partition)
        }
        if all("COMPLETING" not in s for s in states.values()) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    for group in dev_cluster_spec.groups:
        nodes = inventory.nodes_of(group.partition)
        assert [n.name for n in nodes] == group.node_names()
        for node in nodes:
            assert node.state == "IDLE"
            assert node.gpus(group.gpu_type) == group.gpus_per_node == node.gpus()


@pytest.mark.parametrize("gpu_type", ["a100", "rtx", "t4"])
def test_typed_gpu_job_runs_on_its_partition(
    dev_cluster: DevCluster, tmp_path: Path, gpu_type: str
) -> None:
    out = tmp_path / "job.out"
    script = (
        'echo "$SLURMD_NODENAME $SLURM_JOB_PARTITION $SLURM_GPUS_ON_NODE $CUDA_VISIBLE_DEVICES"'
    )
    job = sbatch(
        dev_cluster, "-p", gpu_type, f"--gres=gpu:{gpu_type}:2", "-o", str(out), "--wrap", script
    )
    record = wait_for_job(dev_cluster, job)
    assert record["JobState"] == "COMPLETED", record
    node, partition, gpus, visible = out.read_text().split()
    assert node in (f"{gpu_type}-1", f"{gpu_type}-2")
    assert partition == gpu_type
    assert gpus == "2"
    assert len(visible.split(",")) == 2  # fake device nodes make Slurm bind GPUs


def test_gpu_type_not_in_partition_is_refused(dev_cluster: DevCluster) -> None:
    result = dev_cluster.runner().run(
        ["sbatch", "-p", "t4", "--gres=gpu:a100:1", "--wrap", "true"], check=False
    )
    assert result.returncode != 0
    assert "Requested node configuration is not available" in result.stderr


def test_two_node_job_gets_whole_nodes(dev_cluster: DevCluster, tmp_path: Path) -> None:
    out = tmp_path / "job.out"
    job = sbatch(
        dev_cluster,
        "-p",
        "a100",
        "-N",
        "2",
        "--gres=gpu:a100:4",
        "-o",
        str(out),
        "--wrap",
        "srun bash -c 'echo $SLURMD_NODENAME:$SLURM_GPUS_ON_NODE'",
    )
    assert wait_for_job(dev_cluster, job)["JobState"] == "COMPLETED"
    assert sorted(out.read_text().split()) == ["a100-1:4", "a100-2:4"]


def test_up_twice_starts_nothing(dev_cluster: DevCluster, dev_cluster_spec: DevClusterSpec) -> None:
    before = json.loads(dev_cluster.layout.state_file.read_text())["daemons"]
    assert dev_cluster.up(dev_cluster_spec) is False
    after = json.loads(dev_cluster.layout.state_file.read_text())["daemons"]
    assert before == after
    other = DevClusterSpec.parse("a100:1x4")
    with pytest.raises(Exception, match="already runs"):
        dev_cluster.up(other)


def test_config_check_live(slurm_env: dict[str, str], tmp_path: Path) -> None:
    runner = CliRunner()
    good = runner.invoke(cli, ["config", "check", "--live", str(REPO / "etc" / "sia.yaml")])
    assert good.exit_code == 0, good.output
    assert "OK (live: a100=gpu:a100:4, rtx=gpu:rtx:4, t4=gpu:t4:4)" in good.output
    assert f": Slurm {TEST_RELEASE}." in good.output
    # The dev cluster's only unmapped partition is the hidden preempting overlay (root sees it).
    warnings = [line for line in good.output.splitlines() if "warning" in line]
    assert all("partition 'urgent' overlays managed nodes" in w for w in warnings), warnings

    bad = tmp_path / "sia.yaml"
    bad.write_text(
        "state_dir: /tmp/sia\npartitions:\n"
        "  a100: {gpu_type: a100, gpus_per_node: 8}\n"
        "  t4: {gpu_type: rtx, gpus_per_node: 4}\n"
        "  h100: {gpu_type: h100, gpus_per_node: 8}\n"
    )
    result = runner.invoke(cli, ["config", "check", "--live", str(bad)])
    assert result.exit_code == 1
    assert "node a100-1 has Gres=gpu:a100:4, expected gpu:a100:8" in result.output
    assert "node t4-2 has Gres=gpu:t4:4, expected gpu:rtx:4" in result.output
    assert "Slurm has no partition 'h100' (it has: a100, rtx, t4, urgent)" in result.output
    assert "5 mismatch(es) with the running Slurm" in result.output


def test_status_shows_nodes_and_jobs(dev_cluster: DevCluster) -> None:
    job = sbatch(
        dev_cluster,
        "-p",
        "rtx",
        "--gres=gpu:rtx:1",
        "-J",
        "status-probe",
        "-o",
        "/dev/null",
        "--wrap",
        "sleep 30",
    )
    try:
        text = (
            CliRunner()
            .invoke(cli, ["dev-cluster", "status", "--dir", str(dev_cluster.layout.root)])
            .output
        )
        assert "slurmd:t4-2" in text and "STOPPED" not in text
        assert "rtx-1 rtx idle gpu:rtx:4" in text or "rtx-2 rtx idle gpu:rtx:4" in text
        assert f"{job} rtx status-probe" in text
    finally:
        dev_cluster.runner().run(["scancel", job])


def test_cli_lifecycle_of_a_second_cluster(tmp_path: Path) -> None:
    """up (twice), status and down through the installed console script, on other ports."""
    root = tmp_path / "second"
    env = {**os.environ, "SIA_DEV_CLUSTER_DIR": str(root)}
    env.pop("SLURM_CONF", None)
    command = [sys.executable, "-m", "sia_slurm.cli", "dev-cluster"]

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*command, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )

    port_base = str(TEST_PORT_BASE + SECOND_PORT_OFFSET)
    up = run("up", "--spec", "v100:2x2", "--port-base", port_base, "--slurm", TEST_SLURM)
    assert up.returncode == 0, up.stderr
    exports = f"export SLURM_CONF={root}/etc/slurm.conf\n"
    if TEST_SLURM != "system":  # a root's release: its client wrappers come first on PATH
        exports += f'export PATH={root}/bin:"$PATH"\n'
        env["PATH"] = f"{root}/bin:{env['PATH']}"
    assert up.stdout == exports
    daemons = [
        DaemonRecord(**d) for d in json.loads((root / "cluster.json").read_text())["daemons"]
    ]
    try:
        assert [d.role for d in daemons] == [
            "munged",
            "slurmctld",
            "slurmd:v100-1",
            "slurmd:v100-2",
        ]
        assert all(is_alive(d) for d in daemons)
        again = run("up", "--spec", "v100:2x2", "--port-base", port_base, "--slurm", TEST_SLURM)
        assert again.returncode == 0 and "already up" in again.stderr
        assert [
            DaemonRecord(**d) for d in json.loads((root / "cluster.json").read_text())["daemons"]
        ] == daemons
        status = run("status")
        assert status.returncode == 0
        assert "v100-2 v100* idle gpu:v100:2" in status.stdout
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    assert not any(is_alive(d) for d in daemons)
    assert not (root / "cluster.json").exists()
    assert mounts_under(root, Path("/proc/self/mountinfo").read_text()) == []
    assert run("status").returncode == 1
