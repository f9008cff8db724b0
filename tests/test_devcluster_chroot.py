"""The plans behind a dev cluster of another Slurm release (dev/sia_slurm_dev/chroot.py):
what is bound where, the exact mount/umount commands (a fake runner records them), the client
wrappers and the paths refused. The real thing runs in tests/slurm with SIA_TEST_SLURM=24.11 or
26.05 (scripts/test.sh runs every release)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from sia_slurm.slurm.runner import CommandError, CommandResult
from sia_slurm_dev.chroot import (
    CLIENTS,
    ChrootError,
    ChrootSlurm,
    HostPrograms,
    Mount,
    RootPrograms,
    host_mount_points,
    mount_argvs,
    mount_plan,
    python_paths,
    shared_paths,
    wrapper_text,
    write_wrappers,
)
from sia_slurm_dev.roots import MARKER

MOUNT_POINT = Path("/tmp/dev cluster/root")  # a space: every path is one argv element


class FakeRunner:
    """Records argv lists; ``fail`` maps an argv tuple to the stderr of its failure."""

    def __init__(self, fail: dict[tuple[str, ...], str] | None = None) -> None:
        self.calls: list[list[str]] = []
        self.fail = fail or {}

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        self.calls.append(list(argv))
        if tuple(argv) in self.fail:
            raise CommandError(argv, 32, self.fail[tuple(argv)])
        return CommandResult(tuple(argv), 0, "", "")


def test_mount_plan_binds_parents_before_children() -> None:
    shared = [Path("/root/.pyenv"), Path("/tmp"), Path("/work/main")]
    plan = mount_plan(
        MOUNT_POINT, Path("/var/cache/sia-slurm/roots/24.11"), shared, ["/", "/dev", "/dev/shm"]
    )
    assert plan == [
        Mount("bind", "/var/cache/sia-slurm/roots/24.11", MOUNT_POINT),
        Mount("proc", "proc", MOUNT_POINT / "proc"),
        Mount("bind", "/dev", MOUNT_POINT / "dev"),
        Mount("bind", "/dev/shm", MOUNT_POINT / "dev/shm"),  # /dev/pts: not a host mount here
        Mount("bind", "/sys", MOUNT_POINT / "sys"),
        Mount("bind", "/etc/passwd", MOUNT_POINT / "etc/passwd"),
        Mount("bind", "/etc/group", MOUNT_POINT / "etc/group"),
        Mount("bind", "/etc/shadow", MOUNT_POINT / "etc/shadow"),
        Mount("bind", "/etc/gshadow", MOUNT_POINT / "etc/gshadow"),
        Mount("bind", "/etc/hosts", MOUNT_POINT / "etc/hosts"),
        Mount("bind", "/root/.pyenv", MOUNT_POINT / "root/.pyenv"),
        Mount("bind", "/tmp", MOUNT_POINT / "tmp"),
        Mount("bind", "/work/main", MOUNT_POINT / "work/main"),
    ]


def test_mount_commands_are_argv_lists_and_binds_are_private() -> None:
    assert mount_argvs(Mount("proc", "proc", MOUNT_POINT / "proc")) == [
        ["mount", "-t", "proc", "proc", "/tmp/dev cluster/root/proc"]
    ]
    assert mount_argvs(Mount("bind", "/tmp", MOUNT_POINT / "tmp")) == [
        ["mount", "--bind", "/tmp", "/tmp/dev cluster/root/tmp"],
        ["mount", "--make-private", "/tmp/dev cluster/root/tmp"],
    ]


def test_shared_paths_keep_the_fewest_covering_directories() -> None:
    paths = [
        Path("/tmp/x/cluster"),
        Path("/tmp"),
        Path("/root/.pyenv/versions/3.11.7"),
        Path("/root/.pyenv"),
        Path("/work/main/"),
        Path("/usr/local/lib/python3.11"),
    ]
    assert shared_paths(paths) == [
        Path("/root/.pyenv"),
        Path("/tmp"),
        Path("/usr/local/lib/python3.11"),
        Path("/work/main"),
    ]


@pytest.mark.parametrize("path", ["/", "/usr", "/usr/lib/python3.11", "/etc/slurm", "/var"])
def test_paths_of_the_roots_own_system_are_refused(path: str) -> None:
    with pytest.raises(ChrootError, match="into a Slurm root"):
        shared_paths([Path(path)])


def test_python_paths_take_pyenvs_root_for_its_shims() -> None:
    paths = python_paths(
        ["/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7/lib/python3.11/site"],
        executable="/root/.pyenv/versions/3.11.7/bin/python3",
    )
    assert shared_paths(paths) == [Path("/root/.pyenv")]
    venv = python_paths(["/srv/venv", "/opt/py"], executable="/srv/venv/bin/python")
    assert shared_paths(venv) == [Path("/opt/py"), Path("/srv/venv")]


def test_programs_of_a_root_are_chrooted_and_the_hosts_found_on_path() -> None:
    programs = RootPrograms("24.11", MOUNT_POINT)
    assert programs.argv("slurmd") == ["chroot", str(MOUNT_POINT), "/usr/sbin/slurmd"]
    assert programs.argv("munged") == ["chroot", str(MOUNT_POINT), "/usr/sbin/munged"]
    assert programs.argv("scontrol") == ["chroot", str(MOUNT_POINT), "/usr/bin/scontrol"]
    assert HostPrograms({"slurmd": "/usr/sbin/slurmd"}).argv("slurmd") == ["/usr/sbin/slurmd"]


def test_host_mount_points_from_mountinfo() -> None:
    text = (
        "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "23 22 0:5 / /dev rw,nosuid - devtmpfs udev rw\n"
        "24 23 0:6 / /dev/shm rw - tmpfs tmpfs rw\n"
    )
    assert host_mount_points(text) == ["/", "/dev", "/dev/shm"]


def test_unmount_goes_deepest_first_and_detaches_a_busy_mount(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mounted = [MOUNT_POINT, MOUNT_POINT / "proc", MOUNT_POINT / "tmp"]
    busy = ("umount", str(MOUNT_POINT / "tmp"))
    runner = FakeRunner(fail={busy: "umount: target is busy."})

    def fake_mounted(self: ChrootSlurm) -> list[Path]:
        unmounted = {Path(c[-1]) for c in runner.calls if c[0] == "umount" and tuple(c) != busy}
        return [m for m in mounted if m not in unmounted]

    monkeypatch.setattr(ChrootSlurm, "mounted", fake_mounted)
    logged: list[str] = []
    chroot = ChrootSlurm("24.11", Path("/cache/24.11"), MOUNT_POINT, [], runner, logged.append)
    assert chroot.unmount() == list(reversed(mounted))
    assert runner.calls == [
        ["umount", str(MOUNT_POINT / "tmp")],
        ["umount", "--lazy", str(MOUNT_POINT / "tmp")],
        ["umount", str(MOUNT_POINT / "proc")],
        ["umount", str(MOUNT_POINT)],
    ]
    assert "target is busy" in logged[0]


def test_a_failed_mount_unmounts_what_was_mounted(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    mount_point = tmp_path / "root"
    shared = [tmp_path / "shared"]
    shared[0].mkdir()
    proc = ("mount", "-t", "proc", "proc", str(mount_point / "proc"))
    runner = FakeRunner(fail={proc: "mount: permission denied"})
    unmounts: list[str] = []
    monkeypatch.setattr(ChrootSlurm, "unmount", lambda self: unmounts.append("u") or [])
    chroot = ChrootSlurm("26.05", tmp_path / "cache", mount_point, shared, runner)
    with pytest.raises(ChrootError, match=r"(?s)could not mount the Slurm 26.05 root .*permission"):
        chroot.mount()
    assert runner.calls[-1] == list(proc)
    assert unmounts == ["u", "u"]  # leftovers before, then what this try mounted


def test_wrappers_run_the_roots_command_inside_and_outside(tmp_path: Path) -> None:
    """The wrapper itself, run by /bin/sh: inside the root (no marker at the mount point) it
    execs the command; outside it goes through unshare (checked with a stub on PATH)."""
    mount_point = tmp_path / "root"
    mount_point.mkdir()
    bin_dir = tmp_path / "bin"
    written = write_wrappers(bin_dir, "24.11", mount_point)
    assert sorted(p.name for p in written) == sorted(CLIENTS)
    assert all(os.stat(p).st_mode & 0o777 == 0o755 for p in written)
    text = wrapper_text("scontrol", "24.11", mount_point)
    assert 'exec /usr/bin/scontrol "$@"' in text  # inside: no marker at the mount point
    stubs = tmp_path / "stubs"
    stubs.mkdir()
    (stubs / "unshare").write_text('#!/bin/sh\necho unshare "$@"\n')
    (stubs / "unshare").chmod(0o755)
    (mount_point / MARKER).write_text("{}")
    (mount_point / "work dir").mkdir()
    workdir = tmp_path / "work dir"
    workdir.mkdir()
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}"}
    out = subprocess.run(
        [str(bin_dir / "squeue"), "--json", "a b"],
        env=env, cwd=workdir, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert out.startswith("unshare ")
    assert f"--root={mount_point}" in out and out.rstrip().endswith("/usr/bin/squeue --json a b")
    # The caller's directory does not exist inside the root: the command runs in /.
    assert "--wd=/ " in out


def test_down_without_a_record_unmounts_what_a_killed_up_left(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from sia_slurm_dev import DevCluster

    unmounted: list[Path] = []
    monkeypatch.setattr(ChrootSlurm, "unmount", lambda self: unmounted.append(self.mount_point))
    assert DevCluster(tmp_path).down() is False
    assert unmounted == [tmp_path / "root"]
