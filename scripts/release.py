"""Cut a release: check, bump the version, date the changelog, test, build, check the wheel, tag.

    python scripts/release.py 0.2.0 [--skip-tests] [--dry-run] [--no-isolation]

Refuses, before it changes anything, unless the tree is clean and on ``main``, the version is a
PEP 440 version (in its normal form, so that the tag, the metadata and the file names agree)
above the last ``v*`` tag and above ``sia_slurm.__version__``, and CHANGELOG.md's
"Unreleased" section has entries and an "Upgrading" subsection (the changelog promises one for
every release). Then it runs the README's test command (unless ``--skip-tests``), writes the
version into ``sia_slurm/__init__.py`` (the one place it is written), moves "Unreleased" to
"[VERSION] - DATE" under a fresh empty "Unreleased", builds the sdist and the wheel into
``dist/`` (``python -m build``), checks the wheel (its metadata version, both packages, the
programs, every shipped profile file), commits "Release VERSION" and makes the annotated tag
``vVERSION``. It pushes nothing. A failure after the bump puts the two files back.

``--dry-run`` does the same in a temporary clone, which it removes afterwards: the real
repository gets no commit and no tag. Its tests run in the real repository, on the very commit
the clone is made from (running the test command in the clone would point the editable install
at a directory about to be deleted). ``--no-isolation`` builds with this environment's
setuptools instead of a fresh one from the package index (offline; the tests use it).

docs/operations.md ("Cutting a release") is the maintainer's page for it.
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

ROOT = Path(__file__).resolve().parents[1]
BRANCH = "main"
VERSION_FILE = "sia_slurm/__init__.py"
# The dev cluster's distribution (dev/: sia-slurm-dev) is released with sia-slurm: the same
# version, pinned both ways (tests/test_dev_package.py keeps them equal).
DEV_PYPROJECT = "dev/pyproject.toml"
DEV_VERSION_LINE = re.compile(r'^version = "[^"]+"', re.M)
DEV_PIN = re.compile(r'"sia-slurm==[^"]+"')
CHANGELOG = "CHANGELOG.md"
# The distribution's name as wheel and sdist file names write it.
DIST_NAME = "sia_slurm"
# The job side's package (the programs users run on compute nodes); the wheel must hold it.
JOB_PACKAGE = "sia_slurm.job"
# Its old name, a deprecated alias for one release (launcher/__init__.py): jobs submitted before
# an upgrade still run `python -m launcher.launch`.
ALIAS_PACKAGE = "launcher"
PACKAGES = ("sia_slurm", JOB_PACKAGE, ALIAS_PACKAGE)
PROGRAMS = ("sia-slurm", "sia-sbatch", "sia-launch")
# pyproject.toml's data-files put profiles/ here in the wheel (sia_slurm.protocol.profile).
PROFILES_DIR = "profiles"
INSTALLED_PROFILES = "share/sia-slurm/profiles"
VERSION_LINE = re.compile(r'^__version__ = "([^"]+)"$', re.M)
UNRELEASED = "## [Unreleased]"


class ReleaseError(Exception):
    """A reason not to release; the message says what to fix."""


def git(repo: Path, *args: str) -> str:
    """Run git in ``repo``; its stdout, stripped. A failure carries git's own message."""
    done = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        raise ReleaseError(f"git {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip()


def check_clean_main(repo: Path) -> None:
    """Refuse a tree with changes or untracked files, or a branch other than main: a release
    is made of a commit everybody can see."""
    changes = git(repo, "status", "--porcelain")
    if changes:
        raise ReleaseError(f"the tree is not clean; commit or stash first:\n{changes}")
    branch = git(repo, "rev-parse", "--abbrev-ref", "HEAD")
    if branch != BRANCH:
        raise ReleaseError(f"on branch {branch!r}; releases are cut from {BRANCH!r}")


def tagged_versions(repo: Path) -> list[Version]:
    """The versions of the repository's ``v*`` tags (tags that are not versions are ignored)."""
    versions = []
    for tag in git(repo, "tag", "--list", "v*").split():
        try:
            versions.append(Version(tag[1:]))
        except InvalidVersion:
            continue
    return versions


def current_version(repo: Path) -> str:
    """``__version__`` as written in the repository (read, not imported: the repository being
    released need not be the one this Python imports)."""
    match = VERSION_LINE.search((repo / VERSION_FILE).read_text())
    if match is None:
        raise ReleaseError(f'{VERSION_FILE}: no line `__version__ = "..."`')
    return match.group(1)


def check_version(text: str, current: str, tagged: Sequence[Version]) -> Version:
    """``text`` as a version, refused unless it is PEP 440 in normal form and above both the
    current version and every tagged one."""
    try:
        version = Version(text)
    except InvalidVersion:
        raise ReleaseError(f"{text!r} is not a PEP 440 version (e.g. 0.2.0, 0.2.0rc1)") from None
    if str(version) != text:
        raise ReleaseError(f"write the version in its normal form, {version}, not {text!r}")
    if version <= Version(current):
        raise ReleaseError(f"{version} is not above the current version {current} ({VERSION_FILE})")
    if tagged and version <= max(tagged):
        raise ReleaseError(f"{version} is not above the last tagged version v{max(tagged)}")
    return version


def write_version(repo: Path, version: Version) -> None:
    """Write ``version`` into the one line that holds it, and into the dev distribution's
    version and its pin of sia-slurm (when the tree has one)."""
    path = repo / VERSION_FILE
    path.write_text(VERSION_LINE.sub(f'__version__ = "{version}"', path.read_text(), count=1))
    dev = repo / DEV_PYPROJECT
    if dev.exists():
        text = DEV_VERSION_LINE.sub(f'version = "{version}"', dev.read_text(), count=1)
        dev.write_text(DEV_PIN.sub(f'"sia-slurm=={version}"', text, count=1))


def _version_files(repo: Path) -> list[str]:
    return [VERSION_FILE, CHANGELOG, *([DEV_PYPROJECT] if (repo / DEV_PYPROJECT).exists() else [])]


def _has_text(lines: Sequence[str]) -> bool:
    return any(line.strip() and not line.startswith("#") for line in lines)


def release_changelog(text: str, version: Version, date: datetime.date) -> str:
    """The changelog with its Unreleased entries under ``## [VERSION] - DATE`` and an empty
    Unreleased above them. Refused when Unreleased is missing, has no entries, or has no
    "Upgrading" subsection with text (what an admin must do belongs to every release)."""
    lines = text.splitlines()
    try:
        start = lines.index(UNRELEASED)
    except ValueError:
        raise ReleaseError(f"{CHANGELOG}: no {UNRELEASED!r} section") from None
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    body = lines[start + 1 : end]
    if not _has_text(body):
        raise ReleaseError(f"{CHANGELOG}: the Unreleased section is empty: nothing to release")
    try:
        upgrading = body.index("### Upgrading")
    except ValueError:
        raise ReleaseError(
            f"{CHANGELOG}: the Unreleased section has no '### Upgrading' subsection "
            "(what to do to upgrade, even if it is only 'nothing to do')"
        ) from None
    following = body[upgrading + 1 :]
    upgrade_end = next((i for i, line in enumerate(following) if line.startswith("### ")), None)
    if not _has_text(following[:upgrade_end]):
        raise ReleaseError(f"{CHANGELOG}: the Unreleased section's Upgrading subsection is empty")
    while body and not body[0].strip():
        body.pop(0)
    while body and not body[-1].strip():
        body.pop()
    released = [UNRELEASED, "", f"## [{version}] - {date.isoformat()}", "", *body]
    rest = lines[end:]
    return "\n".join([*lines[:start], *released, *([""] if rest else []), *rest]) + "\n"


def readme_test_command(repo: Path) -> str:
    """The test command the README gives between its ``<!-- test-command -->`` markers (the
    one CI runs, .ci/run), so that a release is tested the way every change is."""
    block = re.search(
        r"<!-- test-command -->\n(.*?)<!-- /test-command -->",
        (repo / "README.md").read_text(),
        re.S,
    )
    command = "\n".join(
        line
        for line in (block.group(1) if block else "").splitlines()
        if not line.startswith("```")
    ).strip()
    if not command:
        raise ReleaseError("README.md: no test command between <!-- test-command --> markers")
    return command


def run_tests(repo: Path) -> None:
    """Run the README's test command in ``repo``; refuse the release if it fails."""
    command = readme_test_command(repo)
    print(f"release: testing: {command}", file=sys.stderr)
    if subprocess.run(["bash", "-c", command], cwd=repo).returncode != 0:
        raise ReleaseError(f"the tests failed ({command}); nothing was changed")


def build(repo: Path, version: Version, isolation: bool) -> tuple[Path, Path]:
    """Build the sdist and the wheel into ``repo/dist``; their paths."""
    # Where a second distribution (e.g. one under dev/) would be built and checked too.
    outdir = repo / "dist"
    argv = [sys.executable, "-m", "build", "--outdir", str(outdir), str(repo)]
    if not isolation:
        argv.insert(3, "--no-isolation")
    done = subprocess.run(argv, cwd=repo, capture_output=True, text=True)
    if done.returncode != 0:
        hint = (
            " (pip install build: the [dev] extra)"
            if "No module named build" in done.stderr
            else ""
        )
        raise ReleaseError(
            f"{' '.join(argv)}: exit {done.returncode}{hint}:\n{done.stderr[-2000:]}"
        )
    sdist = outdir / f"{DIST_NAME}-{version}.tar.gz"
    wheel = outdir / f"{DIST_NAME}-{version}-py3-none-any.whl"
    for path in (sdist, wheel):
        if not path.is_file():
            raise ReleaseError(f"the build made no {path.name} in {outdir}")
    return sdist, wheel


def wheel_problems(wheel: Path, version: Version, profile_files: Sequence[str]) -> list[str]:
    """What the wheel lacks: its metadata version, a package, a program, a profile file
    (``profile_files``: paths relative to ``profiles/``). Empty when it is complete."""
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        info = f"{DIST_NAME}-{version}.dist-info"
        metadata = archive.read(f"{info}/METADATA").decode() if f"{info}/METADATA" in names else ""
        entry_points = (
            archive.read(f"{info}/entry_points.txt").decode()
            if f"{info}/entry_points.txt" in names
            else ""
        )
    problems = []
    found = re.search(r"^Version: (.+)$", metadata, re.M)
    if found is None or found.group(1).strip() != str(version):
        problems.append(f"metadata version {found.group(1) if found else None}, not {version}")
    problems += [
        f"no package {package}"
        for package in PACKAGES
        if f"{package.replace('.', '/')}/__init__.py" not in names
    ]
    problems += [
        f"no program {program}" for program in PROGRAMS if f"{program} =" not in entry_points
    ]
    data = f"{DIST_NAME}-{version}.data/data/{INSTALLED_PROFILES}"
    problems += [
        f"no profile file {PROFILES_DIR}/{name} (pyproject.toml's data-files)"
        for name in profile_files
        if f"{data}/{name}" not in names
    ]
    return problems


def tracked_profile_files(repo: Path) -> list[str]:
    """The profile files git tracks, relative to ``profiles/``: what the wheel must ship."""
    listed = git(repo, "ls-files", "--", PROFILES_DIR).splitlines()
    return [path.removeprefix(f"{PROFILES_DIR}/") for path in listed]


def check_wheel(repo: Path, wheel: Path, version: Version) -> None:
    """Refuse a wheel that :func:`wheel_problems` finds incomplete."""
    problems = wheel_problems(wheel, version, tracked_profile_files(repo))
    if problems:
        raise ReleaseError(f"{wheel.name}: " + "; ".join(problems))


def commit_and_tag(repo: Path, version: Version) -> None:
    """Commit the bump and the dated changelog, and tag that commit ``vVERSION`` (annotated,
    so that it carries who cut the release and when)."""
    git(repo, "add", "--", *_version_files(repo))
    git(repo, "commit", "-q", "-m", f"Release {version}")
    git(repo, "tag", "-a", f"v{version}", "-m", f"sia-slurm {version}")


def cut(repo: Path, version: Version, isolation: bool, date: datetime.date) -> Path:
    """Bump, date the changelog, build, check, commit and tag in ``repo`` (already checked);
    the wheel. A failure before the commit puts the two changed files back."""
    changelog = repo / CHANGELOG
    new_changelog = release_changelog(changelog.read_text(), version, date)
    try:
        write_version(repo, version)
        changelog.write_text(new_changelog)
        _, wheel = build(repo, version, isolation)
        check_wheel(repo, wheel, version)
    except BaseException:
        git(repo, "checkout", "--", *_version_files(repo))
        raise
    commit_and_tag(repo, version)
    return wheel


def check(repo: Path, text: str) -> Version:
    """Every refusal that needs no build: the tree, the version, the changelog."""
    check_clean_main(repo)
    version = check_version(text, current_version(repo), tagged_versions(repo))
    release_changelog((repo / CHANGELOG).read_text(), version, datetime.date.today())
    return version


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("version", help="the new version, e.g. 0.2.0")
    parser.add_argument("--skip-tests", action="store_true", help="do not run the test command")
    parser.add_argument(
        "--dry-run", action="store_true", help="do it all in a temporary clone; tag nothing here"
    )
    parser.add_argument(
        "--no-isolation",
        action="store_true",
        help="build with this environment's setuptools (python -m build --no-isolation)",
    )
    parser.add_argument(
        "--repo", type=Path, default=ROOT, help="the repository (default: this one)"
    )
    args = parser.parse_args(argv)
    repo = args.repo.resolve()
    today = datetime.date.today()
    try:
        version = check(repo, args.version)
        if not args.skip_tests:
            run_tests(repo)
        if not args.dry_run:
            wheel = cut(repo, version, not args.no_isolation, today)
            print(f"release: {wheel.relative_to(repo)} and tag v{version}; publish with:")
            print(f"  git push origin {BRANCH} v{version}")
            return 0
        with tempfile.TemporaryDirectory(prefix="sia-release-") as scratch:
            clone = Path(scratch) / "repo"
            git(repo, "clone", "-q", str(repo), str(clone))
            wheel = cut(clone, version, not args.no_isolation, today)
            names = sorted(path.name for path in wheel.parent.iterdir())
            print(f"release: dry run: built and checked {', '.join(names)}; would tag v{version}")
        return 0
    except ReleaseError as error:
        print(f"release: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
