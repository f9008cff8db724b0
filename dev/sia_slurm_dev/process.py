"""Start daemons in the foreground under our control and stop exactly those, by pid.

Each daemon runs with its "stay in the foreground" flag, so the pid we get from Popen is the
daemon's own; it gets a session of its own so it outlives the command that started it. Before
signalling a recorded pid we check that it still runs the same program with our config (a pid can
be reused after a crash), and a daemon that is our own exited child is reaped, not mistaken for
alive.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class DaemonRecord:
    """A started daemon: its role (e.g. ``slurmd:a100-1``), pid and an identifying marker.

    ``marker`` is a string that must appear in the process's command line (the path of our
    slurm.conf or munge socket), which ties the pid to this cluster.
    """

    role: str
    pid: int
    marker: str


def start_daemon(
    role: str,
    argv: Sequence[str],
    log_path: Path,
    marker: str,
    env: Mapping[str, str] | None = None,
) -> DaemonRecord:
    """Start ``argv`` in a session of its own, output appended to ``log_path``. ``env``: extra
    environment; a daemon with no option that names our files (slurmdbd) gets ``argv[0]`` set
    to ``marker`` instead, so its command line still ties it to this cluster."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    executable = None
    if env is not None and marker not in " ".join(argv):
        executable, argv = argv[0], [marker, *argv[1:]]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(
            list(argv),
            executable=executable,
            env=None if env is None else {**os.environ, **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _await_cmdline(proc)
    return DaemonRecord(role=role, pid=proc.pid, marker=marker)


def _await_cmdline(proc: subprocess.Popen[bytes], timeout_s: float = 2.0) -> None:
    """Wait until the new process shows its command line (or exits).

    Right after exec, ``/proc/<pid>/cmdline`` can still read empty for a moment; a liveness
    check in that window would call a healthy daemon dead.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            if Path(f"/proc/{proc.pid}/cmdline").read_bytes():
                return
        time.sleep(0.01)


def is_alive(record: DaemonRecord) -> bool:
    """True when ``record.pid`` is a live (not zombie) process that carries our marker."""
    _reap(record.pid)
    try:
        stat = Path(f"/proc/{record.pid}/stat").read_text()
        cmdline = Path(f"/proc/{record.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    if _stat_fields(stat)[0] in EXITED:
        return _has_live_thread(record.pid)
    # An empty command line is a process still in exec: ours, not yet readable.
    return not cmdline.strip() or record.marker in cmdline


EXITED = ("Z", "X")  # a /proc stat state: zombie or dead


def _stat_fields(stat: str) -> list[str]:
    """The fields of a ``/proc/<pid>/stat`` line after the command name (state first); the
    name is in parentheses and may itself hold spaces and parentheses."""
    return stat.rsplit(")", 1)[-1].split()


def _has_live_thread(pid: int) -> bool:
    """True when a thread of ``pid`` still runs although its main thread is a zombie.

    A SIGKILLed multi-threaded daemon's main thread can read ``Z`` while its other threads
    are still exiting, and the process keeps its files until the last one is gone: a slurmctld
    started again in that window found its port "already in use" (loaded run 19). Such a
    process is not dead yet.
    """
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tasks:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        if _stat_fields(stat)[0] not in EXITED:
            return True
    return False


def stop_daemons(records: Sequence[DaemonRecord], timeout_s: float = 15.0) -> list[str]:
    """SIGTERM each live daemon, wait, then SIGKILL stragglers; return what was killed hard."""
    live = [r for r in records if is_alive(r)]
    for record in live:
        _signal(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(is_alive(r) for r in live):
        time.sleep(0.1)
    killed = []
    for record in live:
        if is_alive(record):
            _signal(record.pid, signal.SIGKILL)
            killed.append(record.role)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and any(is_alive(r) for r in live):
        time.sleep(0.05)
    return killed


def _signal(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


# ---- a node's job processes (for a node that crashes with its jobs) -----------------------------


def sockets_under(net_unix: str, directory: Path) -> set[int]:
    """Inodes of the Unix sockets bound under ``directory``, from ``/proc/net/unix``'s text.

    Each slurmstepd listens on ``<SlurmdSpoolDir>/<node>_<job>.<step>``, so the sockets under
    a node's spool directory name the steps that node runs.
    """
    prefix = str(directory).rstrip("/") + "/"
    inodes = set()
    for line in net_unix.splitlines()[1:]:
        fields = line.split()
        # Num RefCount Protocol Flags Type St Inode [Path]
        if len(fields) >= 8 and fields[7].startswith(prefix) and fields[6].isdigit():
            inodes.add(int(fields[6]))
    return inodes


def descendants(parents: Mapping[int, int], roots: Iterable[int]) -> set[int]:
    """``roots`` and every process below them, from a pid -> parent pid map."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    found: set[int] = set()
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, ()))
    return found


def node_job_processes(spool_dir: Path) -> set[int]:
    """The processes of the jobs a node runs: each slurmstepd with a socket under the node's
    ``spool_dir``, and everything it started (the batch script, srun's tasks, ...)."""
    inodes = sockets_under(Path("/proc/net/unix").read_text(), spool_dir)
    holders = {pid for pid, held in _socket_inodes().items() if held & inodes}
    return descendants(process_parents(), holders) if holders else set()


def kill_processes(find: Callable[[], set[int]], timeout_s: float = 10.0) -> set[int]:
    """SIGKILL every process ``find`` returns, until it returns none; the pids killed.

    Each pass stops the processes first (SIGSTOP) and looks again, so a child forked while
    the tree was being read is caught before anything dies.
    """
    killed: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while pids := find():
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes {sorted(pids)} survived SIGKILL for {timeout_s:g} s")
        for pid in pids:
            _signal(pid, signal.SIGSTOP)
        pids |= find()
        for pid in pids:
            _signal(pid, signal.SIGKILL)
        killed |= pids
        time.sleep(0.05)
    return killed


def process_parents() -> dict[int, int]:
    """pid -> parent pid of every live process (zombies left out, but not a process whose
    main thread alone has exited: :func:`_has_live_thread`)."""
    parents = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = _stat_fields(stat)
        if fields and (fields[0] not in EXITED or _has_live_thread(int(entry.name))):
            parents[int(entry.name)] = int(fields[1])
    return parents


def _socket_inodes() -> dict[int, set[int]]:
    """The socket inodes each process holds open (``socket:[N]`` in ``/proc/<pid>/fd``)."""
    held: dict[int, set[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        inodes = set()
        try:
            fds = list((entry / "fd").iterdir())
        except OSError:  # gone, or not ours to read
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(int(target[8:-1]))
        if inodes:
            held[int(entry.name)] = inodes
    return held
