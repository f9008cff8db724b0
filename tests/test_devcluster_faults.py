"""The dev cluster's fault operations without Slurm: what to start, which processes a node's
jobs are, node states, the record of what runs, and the CLI's refusals. The operations on the
real daemons are tests/slurm/test_dev_cluster_faults.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sia_slurm.cli.main import cli
from sia_slurm.slurm.records import parse_records
from sia_slurm_dev import DevCluster, DevClusterError, DevClusterSpec
from sia_slurm_dev.lifecycle import (
    _registered,
    _responding,
    _schedulable,
    parse_daemon,
    slurmctld_argv,
)
from sia_slurm_dev.process import (
    DaemonRecord,
    _stat_fields,
    descendants,
    is_alive,
    kill_processes,
    node_job_processes,
    sockets_under,
)
from sia_slurm_dev.slurm_conf import ClusterLayout, render_slurm_conf

NET_UNIX = """\
Num       RefCount Protocol Flags    Type St Inode Path
0000000093ec7e8f: 00000002 00000000 00010000 0001 01 245693 /srv/dev/spool/t4-1/t4-1_9.0
00000000600bf366: 00000002 00000000 00010000 0001 01 247789 /srv/dev/spool/a100-1/a100-1_17.429
00000000e3ed7b32: 00000002 00000000 00010000 0001 01 248529 /srv/dev/spool/a100-1/a100-1_17.0
00000000aaaaaaaa: 00000002 00000000 00010000 0001 01 248530 /srv/dev/spool/a100-10/a100-10_3.0
00000000bbbbbbbb: 00000003 00000000 00000000 0001 03 248531
00000000cccccccc: 00000002 00000000 00010000 0001 01 248532 @/abstract/a100-1/x
"""


def test_the_sockets_of_a_node_are_those_under_its_spool_directory() -> None:
    assert sockets_under(NET_UNIX, Path("/srv/dev/spool/a100-1")) == {247789, 248529}
    assert sockets_under(NET_UNIX, Path("/srv/dev/spool/t4-1/")) == {245693}
    assert sockets_under(NET_UNIX, Path("/srv/dev/spool/rtx-1")) == set()


def test_descendants_are_the_whole_tree_below_the_roots() -> None:
    parents = {10: 1, 11: 10, 12: 11, 13: 10, 20: 1, 21: 20, 30: 13}
    assert descendants(parents, [10]) == {10, 11, 12, 13, 30}
    assert descendants(parents, [11, 21]) == {11, 12, 21}
    assert descendants(parents, []) == set()


def test_slurmctld_restarts_without_clearing_its_state() -> None:
    conf = Path("/srv/dev/etc/slurm.conf")
    assert slurmctld_argv(["/usr/sbin/slurmctld"], conf, True) == [
        "/usr/sbin/slurmctld", "-D", "-c", "-f", str(conf)
    ]  # fmt: skip
    assert slurmctld_argv(["/usr/sbin/slurmctld"], conf, False) == [
        "/usr/sbin/slurmctld", "-D", "-f", str(conf)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("state", "responding", "registered", "schedulable"),
    [
        ("IDLE", True, True, True),
        ("MIXED", True, True, True),
        ("UNKNOWN", True, False, True),
        ("IDLE+DRAIN", True, True, False),
        ("MIXED+DRAIN", True, True, False),
        ("MIXED+NOT_RESPONDING", False, True, False),
        ("DOWN+NOT_RESPONDING", False, True, False),
        ("DOWN", False, True, False),
        ("IDLE*", False, True, False),
        ("IDLE+NOT_RESPONDING", False, True, False),
    ],
)
def test_node_states(state: str, responding: bool, registered: bool, schedulable: bool) -> None:
    assert _responding(state) is responding
    assert _registered(state) is registered
    assert _schedulable(state) is schedulable


def test_daemons_are_named_as_status_lists_them() -> None:
    nodes = ["a100-1", "t4-1"]
    assert parse_daemon("slurmctld", nodes) is None
    assert parse_daemon("slurmd:t4-1", nodes) == "t4-1"
    for bad in ("slurmd:t4-9", "slurmd", "munged", "t4-1"):
        with pytest.raises(DevClusterError, match="choose one of slurmctld, slurmd:a100-1"):
            parse_daemon(bad, nodes)


def test_slurm_conf_lets_a_dead_slurmd_node_go_down_and_come_back() -> None:
    layout = ClusterLayout(root=Path("/srv/dev"), hostname="box", user="root", port_base=7000)
    records = {
        k: v
        for r in parse_records(render_slurm_conf(DevClusterSpec.parse("a100:1x2"), layout))
        for k, v in r.items()
    }
    assert records["SlurmdTimeout"] == "10"
    assert records["ReturnToService"] == "2"
    assert records["JobRequeue"] == "1"
    assert records["SlurmdSpoolDir"] == "/srv/dev/spool/%n"
    assert layout.spool_dir("a100-1") == Path("/srv/dev/spool/a100-1")
    slow = ClusterLayout(
        root=Path("/srv/dev"), hostname="box", user="root", port_base=7000, slurmd_timeout_s=60
    )
    assert "SlurmdTimeout=60\n" in render_slurm_conf(DevClusterSpec.parse("a100:1x2"), slow)


# ---- processes (real ones, no Slurm) ------------------------------------------------------------


def _tree(tmp_path: Path, marker: str) -> subprocess.Popen[bytes]:
    """A process holding a Unix socket under ``tmp_path`` (as slurmstepd holds one in the spool
    directory) with a child and a grandchild, all carrying ``marker`` in their command line."""
    code = (
        "import socket, subprocess, sys, time\n"
        f"s = socket.socket(socket.AF_UNIX); s.bind({str(tmp_path / 'node_1.0')!r}); s.listen()\n"
        "subprocess.Popen(['sh', '-c', 'sleep 300 & wait', sys.argv[1]])\n"
        "time.sleep(300)\n"
    )
    return subprocess.Popen([sys.executable, "-c", code, marker], start_new_session=True)


def _wait(probe, timeout_s: float = 10.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not probe():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_nodes_job_processes_are_found_by_their_spool_socket_and_killed(
    tmp_path: Path,
) -> None:
    spool = tmp_path / "spool"
    spool.mkdir()
    tree = _tree(spool, "node-job-marker")
    bystander = subprocess.Popen(["sleep", "300"])
    try:
        _wait(lambda: len(node_job_processes(spool)) >= 3)  # python, sh, sleep
        found = node_job_processes(spool)
        assert tree.pid in found and bystander.pid not in found
        assert node_job_processes(tmp_path / "elsewhere") == set()
        killed = kill_processes(lambda: node_job_processes(spool))
        assert found <= killed
        tree.wait(10)
        assert tree.returncode == -signal.SIGKILL
        assert node_job_processes(spool) == set()
        assert bystander.poll() is None
    finally:
        bystander.kill()
        bystander.wait()
        if tree.poll() is None:
            tree.kill()
            tree.wait()


def _fake_cluster(tmp_path: Path, roles: dict[str, subprocess.Popen[bytes] | None]) -> DevCluster:
    """``cluster.json`` recording ``roles`` (None: a pid that is gone), marked by a string in
    each fake daemon's command line."""
    daemons = []
    for role, process in roles.items():
        pid = process.pid if process is not None else 2**22 + 7
        daemons.append({"role": role, "pid": pid, "marker": "fake-daemon-marker"})
    record = {
        "spec": "a100:1x2,t4:1x2",
        "slurm_user": "root",
        "port_base": 7000,
        "slurm_conf": str(tmp_path / "etc" / "slurm.conf"),
        "daemons": daemons,
    }
    (tmp_path / "cluster.json").write_text(json.dumps(record))
    return DevCluster(tmp_path)


def _fake_daemon(children: bool = False) -> subprocess.Popen[bytes]:
    """A process whose command line carries the record's marker (and, as slurmctld has
    slurmscriptd, optionally children)."""
    code = "import subprocess, time\n"
    if children:
        code += "kids = [subprocess.Popen(['sleep', '300']) for _ in range(2)]\n"
    code += "time.sleep(300)\n"
    return subprocess.Popen([sys.executable, "-c", code, "fake-daemon-marker"])


def test_kill_slurmctld_kills_it_and_its_children_and_the_record_shows_it(tmp_path: Path) -> None:
    ctld = _fake_daemon(children=True)
    slurmd = _fake_daemon()
    cluster = _fake_cluster(tmp_path, {"slurmctld": ctld, "slurmd:a100-1": slurmd})
    try:
        _wait(lambda: len(descendants_of(ctld.pid)) == 3)
        children = descendants_of(ctld.pid) - {ctld.pid}
        record = cluster.kill_slurmctld()
        assert record.role == "slurmctld" and record.pid == ctld.pid
        ctld.wait(10)  # (reaped by the liveness check already: no exit status to read)
        assert not _running(ctld.pid)
        _wait(lambda: not any(_running(pid) for pid in children))
        assert slurmd.poll() is None
        assert not cluster.is_up()
        assert "slurmctld            pid" in cluster.status() and "STOPPED" in cluster.status()
        with pytest.raises(DevClusterError, match="slurmctld is not running"):
            cluster.kill_slurmctld()
        with pytest.raises(DevClusterError, match="slurmd:a100-1 still runs"):
            cluster.start_slurmd("a100-1")
        cluster.kill_slurmd("a100-1")
        slurmd.wait(10)
        assert not _running(slurmd.pid)
    finally:
        for process in (ctld, slurmd):
            if process.poll() is None:
                process.kill()
                process.wait()


def descendants_of(pid: int) -> set[int]:
    from sia_slurm_dev.process import process_parents

    return descendants(process_parents(), [pid])


def _running(pid: int) -> bool:
    return is_alive(DaemonRecord("x", pid, ""))


ZOMBIE_LEADER = """
import ctypes, socket, threading, time
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen()
print(listener.getsockname()[1], flush=True)
threading.Thread(target=time.sleep, args=(3600,)).start()
ctypes.CDLL(None).pthread_exit(None)  # the main thread exits; the other one holds the port
"""


def test_a_process_whose_main_thread_exited_is_alive_until_its_last_thread_is_gone() -> None:
    """A SIGKILLed multi-threaded slurmctld reads ``Z`` while its other threads still exit,
    holding its port (loaded run 19: the restarted one found it "already in use"). Such a
    process is alive, in the process tree, and killed for good before its port is free."""
    process = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE_LEADER], stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        deadline = time.monotonic() + 10
        while _stat_fields(Path(f"/proc/{process.pid}/stat").read_text())[0] != "Z":
            assert time.monotonic() < deadline, "the main thread did not exit"
            time.sleep(0.01)
        assert _running(process.pid)
        assert process.pid in descendants_of(os.getpid())
        with pytest.raises(OSError), socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # still held: the process is not gone
        killed = kill_processes(lambda: {process.pid} if _running(process.pid) else set())
        assert killed == {process.pid} and not _running(process.pid)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", port))  # free once it is called dead
    finally:
        process.kill()
        process.wait()


def test_operations_need_a_recorded_cluster(tmp_path: Path) -> None:
    cluster = DevCluster(tmp_path)
    for operation in (cluster.kill_slurmctld, cluster.start_slurmctld, cluster.start_killed):
        with pytest.raises(DevClusterError, match="no dev cluster in"):
            operation()
    assert cluster.node_names() == []


def test_a_record_is_replaced_by_role_and_the_rest_kept(tmp_path: Path) -> None:
    slurmd = _fake_daemon()
    cluster = _fake_cluster(tmp_path, {"munged": None, "slurmctld": None, "slurmd:t4-1": slurmd})
    try:
        recorded = cluster._recorded()
        assert recorded is not None
        old = recorded.daemons[1]
        cluster._replace_record(recorded, old, DaemonRecord("slurmctld", os.getpid(), "x"))
        saved = json.loads((tmp_path / "cluster.json").read_text())
        assert saved["spec"] == "a100:1x2,t4:1x2" and saved["slurm_user"] == "root"
        assert [(d["role"], d["pid"]) for d in saved["daemons"]] == [
            ("munged", recorded.daemons[0].pid),
            ("slurmctld", os.getpid()),
            ("slurmd:t4-1", slurmd.pid),
        ]
        assert cluster.node_names() == ["a100-1", "t4-1"]
        with pytest.raises(DevClusterError, match="munged is not running"):
            cluster.start_killed()
    finally:
        slurmd.kill()
        slurmd.wait()


def test_cli_fault_commands_refuse_what_cannot_be(tmp_path: Path) -> None:
    slurmd = _fake_daemon()
    _fake_cluster(tmp_path, {"slurmctld": None, "slurmd:t4-1": slurmd})
    runner = CliRunner()
    try:
        cases = [
            (["kill", "slurmd:rtx-1"], "choose one of slurmctld, slurmd:a100-1, slurmd:t4-1"),
            (["kill", "slurmctld", "--jobs"], "--jobs goes with slurmd:NODE"),
            (["kill", "slurmctld"], "slurmctld is not running"),
            (["start", "slurmd:t4-1"], "slurmd:t4-1 still runs"),
        ]
        for argv, message in cases:
            result = runner.invoke(cli, ["dev-cluster", *argv, "--dir", str(tmp_path)])
            assert result.exit_code == 1, (argv, result.output)
            assert message in result.output, (argv, result.output)
        result = runner.invoke(cli, ["dev-cluster", "kill", "slurmd:t4-1", "--dir", str(tmp_path)])
        assert result.exit_code == 0, result.output
        assert "slurmd of t4-1" in result.output and "killed with SIGKILL" in result.output
        slurmd.wait(10)
    finally:
        if slurmd.poll() is None:
            slurmd.kill()
            slurmd.wait()
    empty = tmp_path / "none"
    result = runner.invoke(cli, ["dev-cluster", "drain", "t4-1", "--dir", str(empty)])
    assert result.exit_code == 1 and "dev-cluster drain: no dev cluster in" in result.output


def test_unix_sockets_are_listed_in_proc_net_unix(tmp_path: Path) -> None:
    """What node_job_processes relies on: a bound socket's path and inode appear there."""
    with socket.socket(socket.AF_UNIX) as bound:
        bound.bind(str(tmp_path / "x"))
        inodes = sockets_under(Path("/proc/net/unix").read_text(), tmp_path)
        assert inodes == {os.fstat(bound.fileno()).st_ino}
