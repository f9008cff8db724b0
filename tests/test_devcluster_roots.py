"""Debian roots of other Slurm releases (dev/sia_slurm_dev/roots.py): the pure parts, and
``ensure_root``'s reuse / rebuild / refusal with a fake runner standing in for debootstrap and
chroot. The real build runs in ``scripts/capture_slurm_fixtures.py`` (about a minute per root)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from sia_slurm.slurm.runner import CommandError, CommandResult
from sia_slurm_dev.roots import (
    DEFAULT_CACHE_DIR,
    MARKER,
    RootError,
    check_release,
    debootstrap_argv,
    default_cache_dir,
    ensure_root,
    mounts_under,
    parse_slurm_version,
    remove_unmounted,
    root_dir,
    slurm_version_argv,
    suite_of,
)


class FakeDebootstrap:
    """Answers debootstrap by making the target directory and ``chroot .. slurmctld -V`` with
    ``version``; records every argv."""

    def __init__(self, version: str = "24.11.5", fail: bool = False):
        self.version = version
        self.fail = fail
        self.calls: list[list[str]] = []

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        argv = list(argv)
        self.calls.append(argv)
        if argv[0] == "debootstrap":
            target = Path(argv[4])
            (target / "usr" / "sbin").mkdir(parents=True)
            if self.fail:
                (target / "debootstrap").mkdir()
                (target / "debootstrap" / "debootstrap.log").write_text("E: Couldn't download\n")
                raise CommandError(argv, 1, "E: Couldn't download packages")
            return CommandResult(tuple(argv), 0, "I: Base system installed successfully.\n", "")
        if argv[0] == "chroot" and "dpkg-query" in argv:
            return CommandResult(tuple(argv), 0, "install ok installed", "")
        if argv[0] == "chroot":
            return CommandResult(tuple(argv), 0, f"slurm {self.version}\n", "")
        return CommandResult(tuple(argv), 0, "", "")


def test_releases_suites_and_command_lines() -> None:
    assert suite_of("24.11") == "trixie" and suite_of("26.05") == "forky"
    with pytest.raises(RootError, match=r"'23.02'; choose one of 24.11, 26.05"):
        suite_of("23.02")
    cache = Path("/var/cache/x")
    assert root_dir(cache, "26.05") == Path("/var/cache/x/26.05")
    assert debootstrap_argv("forky", Path("/r/.26.05.partial-7")) == [
        "debootstrap",
        "--variant=minbase",
        "--include=slurmctld,slurmd,slurmdbd,slurm-client,munge,python3",
        "forky",
        "/r/.26.05.partial-7",
        "http://deb.debian.org/debian",
        "/usr/share/debootstrap/scripts/sid",
    ]
    assert slurm_version_argv(Path("/r/24.11")) == [
        "chroot",
        "/r/24.11",
        "/usr/sbin/slurmctld",
        "-V",
    ]
    assert default_cache_dir({}) == DEFAULT_CACHE_DIR
    assert default_cache_dir({"SIA_SLURM_ROOTS": "/srv/roots"}) == Path("/srv/roots")


def test_version_check() -> None:
    assert parse_slurm_version("slurm 24.11.5\n") == "24.11.5"
    assert parse_slurm_version("slurm-wlm 26.05.5\n") == "26.05.5"
    with pytest.raises(RootError, match="printed no version: 'slurmctld: error'"):
        parse_slurm_version("slurmctld: error\n")
    check_release("24.11.5", "24.11", Path("/r"))
    with pytest.raises(RootError, match=r"/r holds Slurm 24.11.5, not 26.05"):
        check_release("24.11.5", "26.05", Path("/r"))


MOUNTINFO = """\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
90 22 0:5 / /var/cache/r/24.11/dev rw shared:2 - devtmpfs udev rw
91 22 0:21 / /var/cache/r/24.11/proc rw - proc proc rw
92 22 0:22 / /var/cache/r/24.11x/sys rw - sysfs sysfs rw
93 22 0:23 / /var/cache/r/with\\040space rw - tmpfs tmpfs rw
"""


def test_mounts_under_a_root() -> None:
    assert mounts_under(Path("/var/cache/r/24.11"), MOUNTINFO) == [
        Path("/var/cache/r/24.11/dev"),
        Path("/var/cache/r/24.11/proc"),
    ]
    assert mounts_under(Path("/var/cache/r/with space"), MOUNTINFO) == [
        Path("/var/cache/r/with space")
    ]
    assert mounts_under(Path("/var/cache/r/26.05"), MOUNTINFO) == []


def test_a_mounted_directory_is_never_removed(tmp_path: Path) -> None:
    target = tmp_path / "24.11"
    (target / "dev").mkdir(parents=True)
    info = f"90 22 0:5 / {target}/dev rw - devtmpfs udev rw\n"
    with pytest.raises(RootError, match=f"mounted under it: {target}/dev; umount them first"):
        remove_unmounted(target, info)
    assert target.exists()
    remove_unmounted(target, "")
    assert not target.exists()


def test_builds_once_then_reuses(tmp_path: Path) -> None:
    runner = FakeDebootstrap()
    said: list[str] = []
    built = ensure_root("24.11", tmp_path, runner=runner, log=said.append)
    assert (built.path, built.version, built.suite) == (tmp_path / "24.11", "24.11.5", "trixie")
    assert [call[0] for call in runner.calls] == ["debootstrap", "chroot"]
    assert runner.calls[0][4].startswith(str(tmp_path / ".24.11.partial-"))
    assert json.loads((built.path / MARKER).read_text())["version"] == "24.11.5"
    assert not list(tmp_path.glob(".24.11.partial-*"))

    again = FakeDebootstrap()
    assert ensure_root("24.11", tmp_path, runner=again, log=said.append) == built
    assert [call[0] for call in again.calls] == ["chroot"]  # checked, not rebuilt
    assert said[-1] == f"Slurm 24.11.5 (Debian trixie) already in {tmp_path / '24.11'}"


def test_a_root_built_without_slurmdbd_gets_it_added_once(tmp_path: Path) -> None:
    """Roots cached before accounting ran from them lack slurmdbd: apt-get adds it inside the
    root (no service started there), and the marker records it."""
    built = ensure_root("24.11", tmp_path, runner=FakeDebootstrap())
    marker = json.loads((built.path / MARKER).read_text())
    marker["packages"] = "slurmctld,slurmd,slurm-client,munge,python3"
    (built.path / MARKER).write_text(json.dumps(marker))
    runner = FakeDebootstrap()
    ensure_root("24.11", tmp_path, runner=runner)
    root = str(built.path)
    install = ["chroot", root, "apt-get", "install", "-y", "-qq", "--no-install-recommends"]
    assert runner.calls[:2] == [
        [*install, "slurmdbd"],
        ["chroot", root, "dpkg-query", "-W", "-f=${Status}", "slurmdbd"],
    ]
    assert (built.path / "usr/sbin/policy-rc.d").read_text().endswith("exit 101\n")
    packages = json.loads((built.path / MARKER).read_text())["packages"].split(",")
    assert packages[-1] == "slurmdbd"
    again = FakeDebootstrap()
    ensure_root("24.11", tmp_path, runner=again)
    assert [call[2] for call in again.calls] == ["/usr/sbin/slurmctld"]  # only the version check


def test_stale_lists_are_updated_and_a_failed_add_is_an_error(tmp_path: Path) -> None:
    built = ensure_root("26.05", tmp_path, runner=FakeDebootstrap("26.05.5"))
    marker = json.loads((built.path / MARKER).read_text())
    (built.path / MARKER).write_text(json.dumps({**marker, "packages": "slurmctld"}))

    class StaleLists(FakeDebootstrap):
        def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
            if "dpkg-query" in argv:
                self.calls.append(list(argv))
                return CommandResult(tuple(argv), 1, "unknown ok not-installed", "")
            if "install" in argv and not [c for c in self.calls if "update" in c]:
                self.calls.append(list(argv))
                raise CommandError(argv, 100, "E: Failed to fetch ... 404 Not Found")
            return super().run(argv, check=check)

    runner = StaleLists("26.05.5")
    with pytest.raises(RootError, match=r"(?s)could not add slurmdbd to .*build it"):
        ensure_root("26.05", tmp_path, runner=runner)
    assert [call[2:4] for call in runner.calls[:3]] == [
        ["apt-get", "install"],
        ["apt-get", "update"],
        ["apt-get", "install"],
    ]
    assert "slurmdbd" not in (built.path / MARKER).read_text()


def test_an_unfinished_build_is_removed_and_built_again(tmp_path: Path) -> None:
    stale = tmp_path / ".26.05.partial-123"
    (stale / "usr").mkdir(parents=True)
    runner = FakeDebootstrap("26.05.5")
    built = ensure_root("26.05", tmp_path, runner=runner)
    assert not stale.exists() and built.version == "26.05.5"
    assert runner.calls[0][:5] == debootstrap_argv("forky", Path(runner.calls[0][4]))[:5]


def test_a_root_of_another_release_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RootError, match=r"holds Slurm 25.05.1, not 24.11"):
        ensure_root("24.11", tmp_path, runner=FakeDebootstrap("25.05.1"))
    assert not (tmp_path / "24.11").exists() and not list(tmp_path.glob(".24.11.*-*"))

    ensure_root("24.11", tmp_path, runner=FakeDebootstrap())
    # Debian updated the suite under a finished root (or someone replaced it): refused on reuse.
    with pytest.raises(RootError, match=r"holds Slurm 24.12.0, not 24.11"):
        ensure_root("24.11", tmp_path, runner=FakeDebootstrap("24.12.0"))


def test_a_directory_without_the_marker_is_not_taken_for_a_root(tmp_path: Path) -> None:
    (tmp_path / "24.11").mkdir()
    with pytest.raises(RootError, match=r"not a finished root of Slurm 24.11 \(no valid"):
        ensure_root("24.11", tmp_path, runner=FakeDebootstrap())
    assert (tmp_path / "24.11").exists()  # not ours to delete


def test_a_failed_debootstrap_says_why_and_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(RootError, match=r"(?s)failed: debootstrap .*Couldn't download"):
        ensure_root("24.11", tmp_path, runner=FakeDebootstrap(fail=True))
    assert not (tmp_path / "24.11").exists() and not list(tmp_path.glob(".24.11.partial-*"))
