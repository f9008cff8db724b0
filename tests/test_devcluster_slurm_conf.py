"""Dev cluster spec parsing and the rendered Slurm config (pure; no daemons)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from sia_slurm.cli.main import cli
from sia_slurm.config import parse_config
from sia_slurm.slurm.records import parse_records
from sia_slurm_dev import DevClusterSpec, NodeGroupSpec, controller_config
from sia_slurm_dev.access import Account, untraversable
from sia_slurm_dev.chroot import ChrootError, HostPrograms
from sia_slurm_dev.lifecycle import DevCluster, DevClusterError
from sia_slurm_dev.slurm_conf import (
    ClusterLayout,
    PowerSavingConfig,
    render_gres_conf,
    render_slurm_conf,
)

LAYOUT = ClusterLayout(root=Path("/srv/dev"), hostname="box", user="root", port_base=7000)
SPEC = DevClusterSpec.parse("a100:1x2")


def test_spec_round_trip() -> None:
    spec = DevClusterSpec.parse("a100:2x4, t4:3x8")
    assert spec.groups == (NodeGroupSpec("a100", 2, 4), NodeGroupSpec("t4", 3, 8))
    assert str(spec) == "a100:2x4,t4:3x8"
    assert spec.node_names() == ["a100-1", "a100-2", "t4-1", "t4-2", "t4-3"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a100", "expected TYPE:NODESxGPUS"),
        ("A100:1x4", "lower-case"),
        ("a100:0x4", "between 1 and 64"),
        ("a100:1x4,a100:2x8", "appears twice"),
        ("a100:1x4,", "bad cluster spec part ''"),
    ],
)
def test_bad_specs(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DevClusterSpec.parse(text)


def test_slurm_conf_has_one_port_per_node_and_a_partition_per_type() -> None:
    text = render_slurm_conf(DevClusterSpec.parse("a100:2x4,t4:1x2"), LAYOUT)
    records = parse_records(text)
    nodes = [r for r in records if "NodeName" in r]
    assert [(n["NodeName"], n["Port"], n["Gres"]) for n in nodes] == [
        ("a100-1", "7001", "gpu:a100:4"),
        ("a100-2", "7002", "gpu:a100:4"),
        ("t4-1", "7003", "gpu:t4:2"),
    ]
    assert all(n["NodeAddr"] == "127.0.0.1" and n["NodeHostname"] == "box" for n in nodes)
    partitions = {r["PartitionName"]: r for r in records if "PartitionName" in r}
    assert partitions["a100"]["Nodes"] == "a100-1,a100-2" and partitions["a100"]["Default"] == "YES"
    assert partitions["t4"]["Nodes"] == "t4-1" and partitions["t4"]["Default"] == "NO"
    # One hidden partition of a higher tier over every node preempts (requeues) the others.
    urgent = partitions["urgent"]
    assert (urgent["Nodes"], urgent["PriorityTier"], urgent["Hidden"]) == ("ALL", "10", "YES")
    assert {partitions[p]["PriorityTier"] for p in ("a100", "t4")} == {"1"}
    assert "PreemptType=preempt/partition_prio" in text and "PreemptMode=REQUEUE" in text
    assert "SlurmctldPort=7000" in text and "SlurmctldHost=box(127.0.0.1)" in text
    assert "AuthInfo=socket=/srv/dev/run/munge.socket,cred_expire=30" in text
    assert "GresTypes=gpu" in text


def test_cred_expire_sets_the_requeue_floor_and_the_scheduler_looks_every_second() -> None:
    layout = ClusterLayout(
        root=Path("/srv/dev"), hostname="box", user="root", port_base=7000, cred_expire_s=5
    )
    text = render_slurm_conf(DevClusterSpec.parse("a100:1x2"), layout)
    assert "AuthInfo=socket=/srv/dev/run/munge.socket,cred_expire=5" in text
    records = {k: v for r in parse_records(text) for k, v in r.items()}
    assert "sched_interval=1" in records["SchedulerParameters"].split(",")


def test_gres_conf_points_every_gpu_at_a_file() -> None:
    text = render_gres_conf(DevClusterSpec.parse("a100:1x2"), LAYOUT)
    assert "AutoDetect=off" in text
    assert (
        "NodeName=a100-1 Name=gpu Type=a100 "
        "File=/srv/dev/dev/a100-1-nvidia0,/srv/dev/dev/a100-1-nvidia1"
    ) in text


def test_missing_binaries_name_the_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    import sia_slurm_dev.chroot as chroot_module

    monkeypatch.setattr(chroot_module, "_SEARCH_PATH", "/nonexistent")
    with pytest.raises(ChrootError) as caught:
        HostPrograms.find()
    assert "missing programs: munged" in str(caught.value)
    assert "apt-get install -y --no-install-recommends slurmctld slurmd slurm-client munge" in str(
        caught.value
    )


def test_down_without_a_cluster_is_harmless(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path)
    assert cluster.down() is False
    assert cluster.is_up() is False
    assert "no dev cluster" in cluster.status()


def test_corrupt_record_is_reported(tmp_path: Path) -> None:
    (tmp_path / "cluster.json").write_text("{not json")
    with pytest.raises(DevClusterError, match="unreadable record of the dev cluster"):
        DevCluster(tmp_path).status()


def test_controller_config_manages_every_partition_of_the_spec(tmp_path: Path) -> None:
    spec = DevClusterSpec.parse("a100:1x2,t4:2x4,v100:1x8")
    text = controller_config(
        spec,
        tmp_path / "state",
        round_seconds=6,
        policy_params={"lambda_a": 0.01},
        checkpoint_timeout_s=30,
        comment="made by a test",
    )
    assert text.startswith("# made by a test\n")
    config = parse_config(text)
    assert [(p.name, p.gpu_type, p.gpus_per_node) for p in config.partitions] == [
        ("a100", "a100", 2),
        ("t4", "t4", 4),
        ("v100", "v100", 8),
    ]
    assert {t.name: t.profile for t in config.gpu_types} == {
        "a100": "dgx",
        "t4": "t4",
        "v100": "v100",
    }
    assert config.round_seconds == 6 and config.state_dir == tmp_path / "state"
    assert config.policy.name == "sia" and config.policy.params.lambda_a == 0.01
    assert config.restart.checkpoint_timeout_s == 30 and not config.dry_run


def test_controller_config_refuses_a_name_among_the_policy_params(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="policy="):
        controller_config(DevClusterSpec.parse("a100:1x2"), tmp_path, policy_params={"name": "x"})


def test_slurm_user_runs_slurmctld_and_slurmd_stays_the_invoker() -> None:
    layout = ClusterLayout(
        root=Path("/srv/dev"), hostname="box", user="root", port_base=7000, slurm_user="siasvc"
    )
    records = {k: v for r in parse_records(render_slurm_conf(SPEC, layout)) for k, v in r.items()}
    assert records["SlurmUser"] == "siasvc"
    assert records["SlurmdUser"] == "root"
    # What slurmctld writes lives where DevCluster hands it to SlurmUser.
    assert records["StateSaveLocation"] == str(layout.state_dir)
    assert records["SlurmctldLogFile"] == str(layout.slurmctld_log)
    assert records["SlurmctldPidFile"] == str(layout.slurmctld_pid)


def test_without_slurm_user_both_daemons_run_as_the_invoker() -> None:
    records = {k: v for r in parse_records(render_slurm_conf(SPEC, LAYOUT)) for k, v in r.items()}
    assert records["SlurmUser"] == records["SlurmdUser"] == "root"


def test_a_missing_slurm_user_is_named_with_the_command_that_creates_it(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path, slurm_user="sia-no-such-user")
    with pytest.raises(DevClusterError) as caught:
        cluster.up(SPEC)
    message = str(caught.value)
    assert "SlurmUser 'sia-no-such-user' does not exist" in message
    assert "useradd --system" in message
    assert not (tmp_path / "etc").exists()  # refused before anything was written


def test_untraversable_names_the_directories_another_user_cannot_enter(tmp_path: Path) -> None:
    stranger = Account("stranger", uid=54321, gid=54321, groups=frozenset({54321}))
    closed = tmp_path / "closed"
    inner = closed / "inner"
    inner.mkdir(parents=True)
    closed.chmod(0o700)
    inner.chmod(0o755)
    tmp_path.chmod(0o755)
    assert untraversable(inner, stranger) == [
        d for d in [*reversed(tmp_path.parents), tmp_path] if not d.stat().st_mode & 0o001
    ] + [closed]
    closed.chmod(0o701)  # traverse only is enough
    assert closed not in untraversable(inner, stranger)
    # As the kernel decides: a member of the directory's group gets the group's bits only.
    member = Account("member", uid=54322, gid=54322, groups=frozenset({closed.stat().st_gid}))
    assert closed in untraversable(inner, member)
    closed.chmod(0o710)
    assert closed not in untraversable(inner, member)


def test_cli_up_passes_the_slurm_user(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        cli, ["dev-cluster", "up", "--dir", str(tmp_path), "--slurm-user", "sia-no-such-user"]
    )
    assert result.exit_code == 1
    assert "SlurmUser 'sia-no-such-user' does not exist" in result.output


def test_power_saving_is_off_unless_asked_and_then_only_on_the_nodes_named() -> None:
    spec = DevClusterSpec.parse("a100:2x4,t4:1x2")
    normal = render_slurm_conf(spec, LAYOUT)
    assert not [line for line in normal.splitlines() if line.startswith(("Suspend", "Resume"))]
    layout = replace(LAYOUT, power_saving=PowerSavingConfig(("a100-2",), resume_timeout_s=4))
    records = {k: v for r in parse_records(render_slurm_conf(spec, layout)) for k, v in r.items()}
    assert records["ResumeProgram"] == str(layout.resume_program)
    assert records["SuspendProgram"] == str(layout.suspend_program)
    assert records["SuspendExcNodes"] == "a100-1,t4-1"
    assert records["ResumeTimeout"] == "4"
    # Not INFINITE (power saving on), and longer than any test: Slurm powers nothing down.
    assert int(records["SuspendTime"]) >= 3600
    with pytest.raises(ValueError, match=r"\['rtx-1'\] are not in a100:2x4,t4:1x2"):
        render_slurm_conf(spec, replace(LAYOUT, power_saving=PowerSavingConfig(("rtx-1",))))
