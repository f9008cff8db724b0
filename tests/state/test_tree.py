"""The state directory's tree: ``sia-slurm setup`` makes it (owners, modes, sticky jobs/), the
controller checks it before it starts and refuses a tree another account could rewrite."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from sia_slurm.cli.main import cli
from sia_slurm.config import SiaConfig
from sia_slurm.service import ServiceError, ServiceOptions, run_service
from sia_slurm.state.tree import check, prepare, set_up

ME, MY_GROUP = os.geteuid(), os.getegid()
OTHER_UID = 4242


def modes(state: Path) -> dict[str, int]:
    return {name: stat.S_IMODE(os.lstat(state / name).st_mode) for name in (".", "control", "jobs")}


def owners(state: Path) -> dict[str, tuple[int, int]]:
    return {
        name: (os.lstat(state / name).st_uid, os.lstat(state / name).st_gid)
        for name in (".", "control", "jobs")
    }


@pytest.fixture
def state(tmp_path: Path) -> Path:
    """A tree as setup makes it, for this account."""
    path = tmp_path / "state"
    set_up(path, ME, MY_GROUP)
    return path


def test_setup_makes_the_tree_with_its_modes(tmp_path: Path) -> None:
    path = tmp_path / "state"
    old = os.umask(0o077)  # setup's modes do not depend on the caller's umask
    try:
        done = set_up(path, ME, MY_GROUP)
    finally:
        os.umask(old)
    assert [line for line in done if line.startswith("created ")] == [
        f"created {path}",
        f"created {path / 'control'}",
        f"created {path / 'jobs'}",
    ]
    assert modes(path) == {".": 0o755, "control": 0o755, "jobs": 0o1777}
    assert set(owners(path).values()) == {(ME, MY_GROUP)}
    assert check(path, ME) == []
    assert set_up(path, ME, MY_GROUP) == []  # nothing left to do


def test_setup_repairs_the_modes_of_an_existing_tree(state: Path) -> None:
    os.chmod(state / "jobs", 0o777)
    os.chmod(state / "control", 0o777)
    assert set_up(state, ME, MY_GROUP) == [
        f"mode of {state / 'control'}: 777 -> 755",
        f"mode of {state / 'jobs'}: 777 -> 1777",
    ]
    assert modes(state)["jobs"] == 0o1777 and check(state, ME) == []


def test_setup_gives_the_tree_to_the_service_account(tmp_path: Path) -> None:
    path = tmp_path / "state"
    done = set_up(path, OTHER_UID, OTHER_UID)
    assert f"owner of {path / 'jobs'}: 0:{MY_GROUP} -> {OTHER_UID}:{OTHER_UID}" in done
    assert set(owners(path).values()) == {(OTHER_UID, OTHER_UID)}
    assert check(path, OTHER_UID) == []
    assert check(path, ME) != []  # not root's tree any more


def test_setup_refuses_a_symlink_where_a_directory_belongs(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.mkdir()
    (tmp_path / "elsewhere").mkdir()
    (path / "control").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(NotADirectoryError, match="control: not a directory; move it aside"):
        set_up(path, ME, MY_GROUP)
    assert stat.S_IMODE(os.stat(tmp_path / "elsewhere").st_mode) != 0o1777  # left alone
    (path / "control").unlink()
    (path / "control").symlink_to(tmp_path / "nowhere")  # dangling: there, not missing
    with pytest.raises(NotADirectoryError, match="control: not a directory; move it aside"):
        set_up(path, ME, MY_GROUP)
    assert (path / "control").is_symlink()


def test_setup_command(tmp_path: Path) -> None:
    path = tmp_path / "state"
    result = CliRunner().invoke(cli, ["setup", "--state-dir", str(path)])
    assert result.exit_code == 0, result.output
    assert f"created {path / 'jobs'}" in result.output
    assert "ready for the controller" in result.output
    assert modes(path)["jobs"] == 0o1777
    nobody = CliRunner().invoke(cli, ["setup", "--state-dir", str(path), "--user", "no-such-x"])
    assert nobody.exit_code != 0 and "--user: no such account 'no-such-x'" in nobody.output


# ------------------------------------------------------------------------------------------------
# check: what makes a tree unsafe


def test_a_jobs_directory_without_the_sticky_bit(state: Path) -> None:
    os.chmod(state / "jobs", 0o777)
    (problem,) = check(state, ME)
    assert problem.startswith(f"{state / 'jobs'}: mode 777 lets users remove each other's")


@pytest.mark.parametrize("name", [".", "control"])
@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_a_directory_others_may_write(state: Path, name: str, mode: int) -> None:
    os.chmod(state / name, mode)
    (problem,) = check(state, ME)
    where = state if name == "." else state / name
    assert problem == (
        f"{where}: mode {mode:o} is writable by group or others; chmod {0o755:o} {where}"
    )


def test_a_directory_of_another_account(state: Path) -> None:
    os.chown(state / "control", OTHER_UID, OTHER_UID)
    (problem,) = check(state, ME)
    assert problem.startswith(
        f"{state / 'control'}: owned by uid {OTHER_UID}, but the controller runs as uid {ME}"
    )
    assert "sia-slurm setup" in problem


def test_a_root_owned_jobs_directory_is_accepted_for_a_service_account(tmp_path: Path) -> None:
    path = tmp_path / "state"
    set_up(path, OTHER_UID, OTHER_UID)
    os.chown(path / "jobs", 0, 0)  # made by root: users still cannot replace it
    assert check(path, OTHER_UID) == []


def test_a_symlink_or_a_missing_part(state: Path, tmp_path: Path) -> None:
    (tmp_path / "real-control").mkdir(mode=0o755)
    (state / "control").rmdir()
    (state / "control").symlink_to(tmp_path / "real-control")
    (state / "jobs").rmdir()
    problems = check(state, ME)
    assert problems[0].startswith(f"{state / 'control'}: not a directory (a symlink?); run ")
    assert problems[1].startswith(f"{state / 'jobs'}: does not exist; run `sia-slurm setup")
    assert len(problems) == 2


def test_an_ancestor_anyone_may_write_without_the_sticky_bit(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    set_up(shared / "state", ME, MY_GROUP)
    (problem,) = check(shared / "state", ME)
    assert problem.startswith(f"{shared}: writable by everyone without the sticky bit")
    os.chmod(shared, 0o1777)  # like /tmp: nobody can rename another's entry
    assert check(shared / "state", ME) == []


# ------------------------------------------------------------------------------------------------
# prepare: what the controller does at start


def test_prepare_makes_a_missing_tree_in_a_directory_of_its_own(tmp_path: Path) -> None:
    path = tmp_path / "state"
    assert prepare(path, ME) == []
    assert modes(path) == {".": 0o755, "control": 0o755, "jobs": 0o1777}
    (path / "jobs").rmdir()  # a part lost later is made again
    assert prepare(path, ME) == [] and modes(path)["jobs"] == 0o1777


def test_prepare_leaves_an_unsafe_tree_alone_and_says_why(state: Path) -> None:
    os.chmod(state / "control", 0o777)
    (state / "jobs").rmdir()
    (state / "jobs").symlink_to(state / "control")
    problems = prepare(state, ME)
    assert len(problems) == 2
    assert "control: mode 777 is writable by group or others" in problems[0]
    assert "jobs: not a directory (a symlink?)" in problems[1]
    assert (state / "jobs").is_symlink() and modes(state)["control"] == 0o777


def test_prepare_creates_nothing_in_another_accounts_directory(tmp_path: Path) -> None:
    path = tmp_path / "state"
    path.mkdir(mode=0o755)
    os.chown(path, OTHER_UID, OTHER_UID)
    problems = prepare(path, ME)
    assert not (path / "control").exists() and not (path / "jobs").exists()
    assert any(f"owned by uid {OTHER_UID}" in p for p in problems)
    assert any(p.startswith(f"{path / 'control'}: does not exist") for p in problems)


def test_the_controller_refuses_to_start_on_an_unsafe_tree(config: SiaConfig) -> None:
    prepare(config.state_dir, ME)
    os.chmod(config.state_dir / "jobs", 0o777)
    with pytest.raises(ServiceError) as caught:
        run_service(config, ServiceOptions(once=True))
    message = str(caught.value)
    assert message.startswith(f"the state directory {config.state_dir} is not safe to run on:")
    assert "lets users remove each other's job directories" in message
    assert not config.db_path.exists()  # refused before anything was opened
