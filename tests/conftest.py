"""Shared fixtures. ``dev_cluster`` brings up a real Slurm (munged, slurmctld, six slurmd with
typed fake GPUs) once per test session and takes it down afterwards. slurmctld runs as the
service account ``siasvc`` (SlurmUser), as the controller does in production; root stays
privileged in Slurm, so tests that run scontrol as root are unaffected. ``test_accounts``
creates that account and two ordinary users; ``shared_python`` lets them run this Python.

If Slurm cannot start, every test that uses it errors with the reason: these tests are never
skipped (CI installs the Debian packages; see scripts/install.sh).

``SIA_TEST_SLURM`` picks the Slurm release the real-Slurm tests run on: ``system`` (the host's,
Debian 12's 22.05; the default) or ``24.11`` / ``26.05``, run from a cached Debian root (built
first when missing; dev/sia_slurm_dev/chroot.py). For a root's release the session's PATH
starts with the cluster's client wrappers, so every Slurm command a test or the code under test
runs is that release's. ``scripts/test.sh`` runs the suite once per release, each session on
its own ``SIA_TEST_PORT_BASE``.

Any test that uses a dev-cluster fixture is marked ``slurm``, so ``-m "not slurm"`` (the inner
loop and the heavy tier) starts no daemon. SIGTERM stops a session as Ctrl-C does: its fixtures
tear down, the clusters with them (tests/slurm/test_sigterm_teardown.py).
"""

from __future__ import annotations

import atexit
import itertools
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Generator, Iterator
from pathlib import Path
from types import FrameType

import pytest

from sia_slurm_dev import DEFAULT_SPEC, DevCluster, DevClusterSpec
from sia_slurm_dev.accounts_spec import AccountingSpec
from tests.accounting_site import ACCOUNTING_CLUSTER, ACCOUNTING_PORT_OFFSET, ACCOUNTING_SPEC
from tests.accounts import (
    SharedTmp,
    TestAccounts,
    ensure_test_accounts,
    grant_traverse,
    share_python,
)
from tests.release import TEST_PORT_BASE, TEST_SLURM

REPO = Path(__file__).resolve().parent.parent


def pytest_report_header() -> str:
    return f"real-Slurm tests: SIA_TEST_SLURM={TEST_SLURM}, SIA_TEST_PORT_BASE={TEST_PORT_BASE}"


# The fixtures that start daemons: munged, slurmctld and slurmd; slurmdbd and MariaDB too for
# the accounting cluster.
DAEMON_FIXTURES = frozenset({"dev_cluster", "slurm_env", "accounting_cluster"})


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test that uses a dev cluster is a ``slurm`` test, marked by hand or not, so that
    ``pytest -m "not slurm"`` (the inner loop, docs/testing.md) starts no daemon:
    the unmarked tests/slurm/test_dev_cluster.py once brought a cluster up in that tier. First
    (tryfirst), so that ``-m`` deselects by the marks added here.

    A ``slurm`` test is never ``heavy`` as well: the tiers are separate, ``-m heavy`` starts no
    daemon either, and slurm wins. A test's own ``heavy`` mark is dropped; one it inherits from
    its module or class cannot be dropped for that test alone, so it stops the session."""
    for item in items:
        if DAEMON_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slurm)
    inherited = []
    for item in items:
        if item.get_closest_marker("slurm") is None:
            continue
        item.own_markers[:] = [mark for mark in item.own_markers if mark.name != "heavy"]
        if item.get_closest_marker("heavy") is not None:
            inherited.append(item.nodeid)
    if inherited:
        raise pytest.UsageError(
            "marked heavy by their module or class but slurm tests (a dev-cluster fixture or "
            "the slurm mark), which are never heavy: " + ", ".join(inherited) + "; mark that "
            "module's or class's heavy tests one by one instead (docs/testing.md, 'Tiers')"
        )


def may_select_slurm_tests(expression: str | None) -> bool:
    """Whether ``-m EXPRESSION`` can select a ``slurm`` test, whatever its other marks."""
    if not expression:
        return True
    from _pytest.mark.expression import Expression

    try:
        compiled = Expression.compile(expression)
    except Exception:  # a bad expression: pytest says so itself; decide safely here
        return True
    names = sorted(set(re.findall(r"[A-Za-z_][\w.-]*", expression)) - {"and", "or", "not", "slurm"})
    for count in range(len(names) + 1):
        for marks in itertools.combinations(names, count):
            chosen = {"slurm", *marks}
            if compiled.evaluate(lambda name, /, chosen=chosen, **_: name in chosen):
                return True
    return False


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto`` (pyproject.toml's addopts): a worker per core for a session that can select
    no ``slurm`` test (``-m "not slurm"``, the inner loop; its quick tier), none otherwise:
    the live tests share their session's dev cluster, a fixture of one process.

    With a test per core, each worker's thread pools get one thread (unless set): OpenBLAS's,
    as every sia-slurm program runs it (sia_slurm/clicommon.py), and PyTorch's intra-op pool,
    as the example trainers set it. Set here, before the workers start and load numpy: pools
    of spinning threads on each worker cost 2 cores a sixth of the session's CPU."""
    if may_select_slurm_tests(config.option.markexpr):
        return 0
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    return len(os.sched_getaffinity(0))


@pytest.hookimpl(wrapper=True)
def pytest_cmdline_main(
    config: pytest.Config,
) -> Generator[None, int | pytest.ExitCode, int | pytest.ExitCode]:
    """An xdist worker ends as soon as its session has: its atexit handlers run (the zygotes
    stop) and the process exits without the interpreter's teardown, which freed every object
    of PyTorch, Lightning and scipy one by one and joined leftover threads: 2-3 s at the end
    of each worker, waited for by the controller, in a session of 90. The worker's results
    reached the controller before this (xdist's ``workerfinished`` event, sent at the
    worker's ``pytest_sessionfinish``); the controller's own process ends as usual."""
    status = yield
    if not hasattr(config, "workerinput"):
        return status
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(int(status or 0))


class SessionTerminated(KeyboardInterrupt):
    """SIGTERM received by the test session (a CI timeout sends it). Raised like Ctrl-C's
    KeyboardInterrupt, which pytest answers by tearing down every fixture set up (the dev
    clusters, their slurmdbd and MariaDB go down) before it exits with status 2; a plain SIGTERM
    killed the session at once and left the daemons holding the ports the next session needs."""


class _SigtermHandler:
    """Raises :class:`SessionTerminated` on the first SIGTERM, in the main thread, wherever the
    session is (a test, a fixture, a sleep or a subprocess wait). Once teardown has begun,
    whether after that SIGTERM or at the session's normal end, a SIGTERM is only noted: raised
    inside a finalizer it would cut that cluster's ``down`` short, the very thing to avoid.

    A process forked from the session (a DataLoader worker, a multiprocessing child) inherits
    the handler: there SIGTERM must end the process as it always did, not raise in it."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.received = False
        self.tearing_down = False

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self.pid:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGTERM)
            return
        first = not (self.received or self.tearing_down)
        self.received = True
        if first:
            self.tearing_down = True
            raise SessionTerminated("SIGTERM: the session stops, its fixtures tear down")


_sigterm = _SigtermHandler()
_sigterm_before: object = None  # the handler before ours (None: not installed)


def pytest_configure(config: pytest.Config) -> None:
    """Install the SIGTERM handler for the whole session, collection included. Tests that set
    their own SIGTERM handler get this one back after them (:func:`_signal_handlers_restored`).
    Only the main thread may set handlers (pytest run inside a thread sets none)."""
    global _sigterm_before
    if threading.current_thread() is threading.main_thread():
        _sigterm_before = signal.signal(signal.SIGTERM, _sigterm)
    _one_last_collection(config)


def _one_last_collection(config: pytest.Config) -> None:
    """In an xdist worker, pytest's last look for unraisable exceptions (at its cleanup,
    after the session) runs one garbage collection, not five: each is a full pass over the
    worker's heap (PyTorch, Lightning, scipy: 0.46-0.53 million objects), 0.28-0.34 s at
    the end of the inner loop, so 1.1-1.4 s saved per worker. What one pass cannot free is
    left to os._exit (:func:`pytest_cmdline_main`) either way. The key is pytest's own (its
    pytester sets it to 0); a pytest without it keeps its five."""
    if not hasattr(config, "workerinput"):
        return
    try:
        from _pytest.unraisableexception import gc_collect_iterations_key
    except ImportError:
        return
    config.stash[gc_collect_iterations_key] = 1


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Teardown of the session's fixtures starts after this hook: from here a SIGTERM must not
    interrupt it (see :class:`_SigtermHandler`)."""
    _sigterm.tearing_down = True


def pytest_unconfigure(config: pytest.Config) -> None:
    if _sigterm_before is not None and signal.getsignal(signal.SIGTERM) is _sigterm:
        signal.signal(signal.SIGTERM, _sigterm_before)  # type: ignore[arg-type]


@pytest.fixture(autouse=True)
def _signal_handlers_restored() -> Iterator[None]:
    """A trainer built in this process installs SIGTERM/SIGINT/SIGUSR1 handlers that only set
    flags; left in place they outlive the test, and every process the suite forks later
    inherits them (the CPU spinners of tests/slurm/test_relaunch_live.py then ignored
    ``terminate()`` and spun their whole 600 s, loading both cores for 8 minutes more)."""
    numbers = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
    before = {number: signal.getsignal(number) for number in numbers}
    yield
    for number, handler in before.items():
        signal.signal(number, handler)


@pytest.fixture(scope="session")
def dev_cluster_spec() -> DevClusterSpec:
    return DevClusterSpec.parse(DEFAULT_SPEC)


@pytest.fixture(scope="session")
def test_accounts() -> TestAccounts:
    """``siasvc`` (system account, no shell, no home), ``siaalice`` and ``siabob``; created
    if missing, kept afterwards (creating them again every session would gain nothing)."""
    return ensure_test_accounts()


@pytest.fixture(scope="session")
def shared_python(test_accounts: TestAccounts) -> str:
    """This interpreter and the checkout, reachable by the test users (checked: siaalice can
    import sia_slurm and torch); returns the interpreter's path for their job scripts."""
    share_python(test_accounts.alice.name)
    return sys.executable


@pytest.fixture(scope="session")
def shared_tmp(test_accounts: TestAccounts, request: pytest.FixtureRequest) -> Iterator[SharedTmp]:
    """Directories other accounts can traverse (slurmctld as siasvc, the controller, the test
    users' jobs), outside pytest's own temporary root: pytest resets /tmp/pytest-of-<user> to
    0700 whenever another pytest session starts, which would cut those accounts off mid-run.
    Kept after a session with failures: the dev clusters' logs under it are what explains them
    (the paths the failures print point there)."""
    base = Path(tempfile.mkdtemp(prefix="sia-tests-"))
    base.chmod(0o711)
    grant_traverse(base)
    try:
        yield SharedTmp(base)
    finally:
        if not request.session.testsfailed:
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def shared_tmp_path(shared_tmp: SharedTmp, request: pytest.FixtureRequest) -> Path:
    """A fresh directory per test under :func:`shared_tmp` (mode 0711)."""
    return shared_tmp.mktemp(request.node.name)


@pytest.fixture(scope="session")
def dev_cluster(
    shared_tmp: SharedTmp,
    dev_cluster_spec: DevClusterSpec,
    test_accounts: TestAccounts,
    shared_python: str,
) -> Iterator[DevCluster]:
    """The session's dev cluster. This Python is shared first: a release's root copies the
    modes of the host directories above it (/root) when it is mounted, so a grant made after
    that would not reach the jobs (seen: a session whose first test was the privileges test
    ran its users' jobs into "Permission denied" on 26.05)."""
    root = shared_tmp.mktemp("dev-cluster")
    cluster = DevCluster(
        root, port_base=TEST_PORT_BASE, slurm_user=test_accounts.service.name, slurm=TEST_SLURM
    )
    cluster.up(dev_cluster_spec)
    try:
        with pytest.MonkeyPatch.context() as patch:
            if "PATH" in cluster.env:  # a root's release: its clients, not the host's
                patch.setenv("PATH", cluster.env["PATH"])
            yield cluster
    finally:
        cluster.down()


@pytest.fixture
def slurm_env(dev_cluster: DevCluster, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Point Slurm client commands run by the code under test at the dev cluster."""
    for key, value in dev_cluster.env.items():
        monkeypatch.setenv(key, value)
    return dev_cluster.env


@pytest.fixture(scope="session")
def accounting_cluster(
    shared_tmp: SharedTmp, test_accounts: TestAccounts, shared_python: str
) -> Iterator[DevCluster]:
    """A dev cluster of the session's Slurm release with accounting: ``biology`` limited to 4
    GPUs (GrpTRES), ``physics`` twice its share, QOS ``short`` at 6 GPUs per user and 2
    A100s per job. This Python is shared first, as for :func:`dev_cluster`."""
    cluster = DevCluster(
        shared_tmp.mktemp("accounting-cluster"),
        port_base=TEST_PORT_BASE + ACCOUNTING_PORT_OFFSET,
        slurm_user=test_accounts.service.name,
        slurm=TEST_SLURM,
        accounting=AccountingSpec.parse(ACCOUNTING_SPEC, "ACCOUNTING_SPEC"),
    )
    cluster.up(DevClusterSpec.parse(ACCOUNTING_CLUSTER))
    try:
        yield cluster
    finally:
        cluster.down()
