"""scripts/release.py on a temporary clone of this checkout, and the offline install of the
wheel it builds (scripts/install.sh --wheel --find-links).

The refusals run the script and check that it changed nothing. One real release (module-scoped:
one build for the module) bumps a clone to a version the checkout does not have, so that the
offline-install test can tell the wheel's copy from the editable install a venv with the system
site packages also sees.
"""

from __future__ import annotations

import datetime
import importlib.util
import os
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "release.py"
NEXT = "9.0.0"  # above the checkout's version, and unlike it


def load_release() -> ModuleType:
    spec = importlib.util.spec_from_file_location("release_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


release = load_release()


def clean_env() -> dict[str, str]:
    """This environment without PYTHONPATH: what runs must import what it installed or built,
    not the checkout a focused test run puts first."""
    return {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True)
    return done.stdout.strip()


def clone(target: Path) -> Path:
    """A clone of this checkout's HEAD on a branch ``main``, with a committer."""
    subprocess.run(["git", "clone", "-q", str(ROOT), str(target)], check=True)
    git(target, "checkout", "-q", "-B", "main")
    git(target, "config", "user.name", "Release Test")
    git(target, "config", "user.email", "release-test@example.invalid")
    return target


UNRELEASED = "## [Unreleased]\n"
TEST_ENTRY = "\n### Added\n- An entry for the test.\n\n### Upgrading\n- Nothing to do.\n"


def give_unreleased(repo: Path) -> None:
    """Right after a release the checkout has nothing Unreleased, which the script refuses to
    release: give the clone an entry (committed) where its section is empty."""
    path = repo / "CHANGELOG.md"
    text = path.read_text()
    start = text.index(UNRELEASED) + len(UNRELEASED)
    section = text[start : text.find("\n## ", start)]
    if "\n- " not in section:
        commit_changelog(repo, text[:start] + TEST_ENTRY + text[start:])


def run_release(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(SCRIPT), *args, "--no-isolation", "--repo", str(repo)]
    return subprocess.run(
        argv, cwd=repo.parent, capture_output=True, text=True, env=clean_env(), timeout=300
    )


def commit_changelog(repo: Path, text: str) -> None:
    (repo / "CHANGELOG.md").write_text(text)
    git(repo, "commit", "-q", "-am", "changelog for the test")


# One worker runs them all: the module-scoped clones and the one release build below are made
# once, not once per xdist worker (3 s of CPU each on two cores)
pytestmark = pytest.mark.xdist_group("release")


@pytest.fixture(scope="module")
def released(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A clone released as NEXT with --skip-tests: the one build of this module."""
    repo = clone(tmp_path_factory.mktemp("released") / "repo")
    give_unreleased(repo)
    done = run_release(repo, NEXT, "--skip-tests")
    assert done.returncode == 0, done.stderr
    yield repo


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One clone for the tests that release nothing (a clone takes seconds on a loaded machine)."""
    return clone(tmp_path_factory.mktemp("pristine") / "repo")


@pytest.fixture
def repo(pristine: Path) -> Path:
    """The pristine clone, put back as it was cloned: main at this checkout's HEAD, no other
    branch, no tag, no stray file."""
    git(pristine, "checkout", "-q", "-f", "main")
    git(pristine, "reset", "-q", "--hard", git(ROOT, "rev-parse", "HEAD"))
    git(pristine, "clean", "-q", "-fdx")
    for tag in git(pristine, "tag", "--list").split():
        git(pristine, "tag", "-d", tag)
    for branch in git(pristine, "branch", "--format=%(refname:short)").split():
        if branch != "main":
            git(pristine, "branch", "-q", "-D", branch)
    give_unreleased(pristine)
    return pristine


def unchanged(repo: Path, head: str) -> None:
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "tag", "--list") == ""
    assert release.current_version(repo) == release.current_version(ROOT)


def test_it_refuses_a_dirty_tree(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    (repo / "stray.txt").write_text("not committed\n")
    done = run_release(repo, NEXT, "--skip-tests")
    assert done.returncode == 1
    assert "the tree is not clean" in done.stderr and "stray.txt" in done.stderr
    unchanged(repo, head)


def test_it_refuses_a_branch_other_than_main(repo: Path) -> None:
    git(repo, "checkout", "-q", "-b", "topic")
    done = run_release(repo, NEXT, "--skip-tests")
    assert done.returncode == 1
    assert "on branch 'topic'; releases are cut from 'main'" in done.stderr


@pytest.mark.parametrize(
    ("version", "tag", "message"),
    [
        (release.current_version(ROOT), None, "is not above the current version"),
        ("0.0.1", None, "is not above the current version"),
        ("9.1.0", "v9.5.0", "is not above the last tagged version v9.5.0"),
        ("9.5.0", "v9.5.0", "is not above the last tagged version v9.5.0"),
        ("nine", None, "'nine' is not a PEP 440 version"),
        ("9.0.0-rc1", None, "write the version in its normal form, 9.0.0rc1"),
    ],
)
def test_it_refuses_a_version_not_above_the_current_and_the_tagged_ones(
    repo: Path, version: str, tag: str | None, message: str
) -> None:
    head = git(repo, "rev-parse", "HEAD")
    if tag:
        git(repo, "tag", tag)
    done = run_release(repo, version, "--skip-tests")
    assert done.returncode == 1
    assert message in done.stderr
    assert git(repo, "rev-parse", "HEAD") == head
    assert git(repo, "tag", "--list") == (tag or "")
    assert release.current_version(repo) == release.current_version(ROOT)


CHANGELOG_HEAD = "# Changelog\n\nIntroduction.\n\n"
OLDER = "## 0.1.0\n\nThe first version.\n"


@pytest.mark.parametrize(
    ("unreleased", "message"),
    [
        ("## [Unreleased]\n\n", "the Unreleased section is empty"),
        ("## [Unreleased]\n\n### Added\n\n", "the Unreleased section is empty"),
        ("## [Unreleased]\n\n### Added\n- a thing\n\n", "has no '### Upgrading' subsection"),
        (
            "## [Unreleased]\n\n### Added\n- a thing\n\n### Upgrading\n\n### Fixed\n- x\n\n",
            "Upgrading subsection is empty",
        ),
        ("## Unreleased\n\n### Added\n- a thing\n\n", "no '## [Unreleased]' section"),
    ],
)
def test_it_refuses_a_changelog_without_entries_or_upgrading(
    repo: Path, unreleased: str, message: str
) -> None:
    commit_changelog(repo, CHANGELOG_HEAD + unreleased + OLDER)
    head = git(repo, "rev-parse", "HEAD")
    done = run_release(repo, NEXT, "--skip-tests")
    assert done.returncode == 1
    assert message in done.stderr
    unchanged(repo, head)


def test_the_unreleased_entries_move_under_the_version_and_date() -> None:
    text = CHANGELOG_HEAD + "## [Unreleased]\n\n### Added\n- a\n\n### Upgrading\n- b\n\n" + OLDER
    out = release.release_changelog(text, release.Version("9.0.0"), datetime.date(2031, 2, 3))
    assert out == (
        CHANGELOG_HEAD
        + "## [Unreleased]\n\n## [9.0.0] - 2031-02-03\n\n### Added\n- a\n\n### Upgrading\n- b\n\n"
        + OLDER
    )


def test_the_readme_test_command_is_the_one_ci_runs() -> None:
    assert release.readme_test_command(ROOT) == "bash scripts/test.sh"


@pytest.mark.heavy
def test_a_real_run_builds_the_wheel_commits_and_tags(released: Path) -> None:
    wheel = released / "dist" / f"sia_slurm-{NEXT}-py3-none-any.whl"
    assert (released / "dist" / f"sia_slurm-{NEXT}.tar.gz").is_file()
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(f"sia_slurm-{NEXT}.dist-info/METADATA").decode()
    assert f"\nVersion: {NEXT}\n" in metadata
    assert release.wheel_problems(wheel, release.Version(NEXT), ["gpu_types.csv"]) == []
    assert git(released, "cat-file", "-t", f"v{NEXT}") == "tag"  # annotated
    assert git(released, "rev-list", "-n1", f"v{NEXT}") == git(released, "rev-parse", "HEAD")
    assert git(released, "log", "-1", "--format=%s") == f"Release {NEXT}"
    assert git(released, "status", "--porcelain") == ""
    assert release.current_version(released) == NEXT
    dev = (released / "dev" / "pyproject.toml").read_text()  # released with it, pinned to it
    assert f'\nversion = "{NEXT}"' in dev and f'"sia-slurm=={NEXT}"' in dev
    changelog = (released / "CHANGELOG.md").read_text()
    today = datetime.date.today().isoformat()
    assert f"## [Unreleased]\n\n## [{NEXT}] - {today}\n\n### Added\n" in changelog
    again = run_release(released, NEXT, "--skip-tests")
    assert again.returncode == 1 and "is not above the current version" in again.stderr


@pytest.mark.heavy
def test_the_wheel_check_names_what_is_missing(released: Path, tmp_path: Path) -> None:
    wheel = released / "dist" / f"sia_slurm-{NEXT}-py3-none-any.whl"
    gutted = tmp_path / wheel.name
    dropped = f"sia_slurm-{NEXT}.data/data/share/sia-slurm/profiles/bert/seed.csv"
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(gutted, "w") as target:
        for item in source.infolist():
            if item.filename != dropped and not item.filename.startswith("sia_slurm/job/"):
                target.writestr(item, source.read(item))
    files = release.tracked_profile_files(released)
    assert "bert/seed.csv" in files and "gpu_types.csv" in files
    assert release.wheel_problems(wheel, release.Version(NEXT), files) == []
    assert release.wheel_problems(gutted, release.Version(NEXT), files) == [
        f"no package {release.JOB_PACKAGE}",
        "no profile file profiles/bert/seed.csv (pyproject.toml's data-files)",
    ]
    assert release.wheel_problems(wheel, release.Version("9.0.1"), [])[0].startswith(
        "metadata version None"
    )


@pytest.mark.heavy
def test_a_dry_run_builds_in_a_clone_and_tags_nothing(repo: Path) -> None:
    head = git(repo, "rev-parse", "HEAD")
    done = run_release(repo, NEXT, "--skip-tests", "--dry-run")
    assert done.returncode == 0, done.stderr
    assert f"dry run: built and checked sia_slurm-{NEXT}-py3-none-any.whl" in done.stdout
    assert f"would tag v{NEXT}" in done.stdout
    unchanged(repo, head)
    assert git(repo, "status", "--porcelain") == ""
    assert not (repo / "dist").exists()


@pytest.mark.heavy
def test_the_wheel_installs_offline_and_its_programs_print_its_version(
    released: Path, tmp_path: Path
) -> None:
    """install.sh --wheel --find-links into a venv that borrows the system site's dependencies
    (torch and the rest need no download); the venv's programs and profiles are the wheel's."""
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir()
    wheel = released / "dist" / f"sia_slurm-{NEXT}-py3-none-any.whl"
    (wheelhouse / wheel.name).write_bytes(wheel.read_bytes())
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
        check=True,
    )
    env = clean_env() | {"PATH": f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    shared_before = outside_version(tmp_path)
    offline = ["--wheel", str(wheelhouse / wheel.name), "--find-links", str(wheelhouse)]
    install = subprocess.run(
        ["bash", str(ROOT / "scripts" / "install.sh"), *offline],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr
    assert f"install: done offline (Python {sys.version.split()[0]}, sia-slurm {NEXT})" in (
        install.stderr
    )
    for program in ("sia-slurm", "sia-launch"):
        done = subprocess.run(
            [str(venv / "bin" / program), "--version"],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.stdout == f"{program}, version {NEXT}\n", done.stderr
    code = (
        "import sia_slurm\n"
        "from sia_slurm.protocol.profile import default_profiles_dir, load_profiles\n"
        "print(sia_slurm.__file__)\n"
        "print(default_profiles_dir())\n"
        "print(' '.join(sorted(load_profiles().apps)))\n"
    )
    done = subprocess.run(
        [str(venv / "bin" / "python"), "-c", code],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
    )
    module, profiles, apps = done.stdout.splitlines()
    site = venv.resolve() / "lib"
    assert Path(module).is_relative_to(site), module
    assert Path(profiles) == venv.resolve() / "share" / "sia-slurm" / "profiles"
    assert apps.split() == sorted(p.name for p in (ROOT / "profiles").iterdir() if p.is_dir())
    assert outside_version(tmp_path) == shared_before  # the shared install is untouched


def outside_version(cwd: Path) -> str:
    """The version of sia-slurm this test's own Python has installed (outside the venv)."""
    code = (
        "import importlib.metadata as m, sia_slurm as s; print(m.version('sia-slurm'), s.__file__)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=clean_env(), capture_output=True, text=True
    )
    return done.stdout.strip()
