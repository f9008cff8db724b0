"""A zygote for the tests' training processes: a Python process that has imported PyTorch
(and what else a test asks for) and nothing more, and forks one child per command.

Why: the heavy tier starts some twenty training processes of its own (gloo ranks, the
examples run by hand), and each fresh interpreter spends about 2 s of CPU importing PyTorch,
6 s with Lightning, before its first step: on 2 cores that was most of the tier's time. A
child forked from the zygote starts with the imports done, and is otherwise the process the
command would have been: its own pid, the caller's stdin/stdout/stderr (passed over the socket),
working directory, environment, ``sys.argv`` and ``sys.path``; the script or module runs as
``__main__`` and the interpreter exits as ``python`` would (atexit handlers, exit status,
traceback). What differs, and why it is fine here:

- the hash seed and numpy's global generator are the zygote's (numpy's is reseeded in each
  child; ``random``'s reseeds itself at fork): ranks that iterate a set of strings agree more
  than torchrun's ranks would. The live tier starts every rank with the real torchrun;
- variables a library reads when it loads (the thread counts, ``PYTHONPATH``) are fixed when
  the zygote starts: a zygote serves only commands that agree with it on them
  (``LOAD_TIME_VARIABLES``), and :func:`popen` starts one zygote per set of values.

Only the tests' own helpers use it (tests/job/gloo.py, tests/job/test_examples.py); a test of
a program's own start (sia-launch, torchrun's agent, what a module imports) starts it for real.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# read by a library when it loads (OpenMP, OpenBLAS, MKL), or deciding where imports come from
LOAD_TIME_VARIABLES = (
    "PYTHONPATH",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTHONHASHSEED",
)
# what a training process imports before its first step: PyTorch's modules, and
# torch._dynamo, which an optimizer's constructor imports (2 s of CPU of its own)
TORCH = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data", "torch._dynamo")
# a preload that extends one of these is forked from that one's zygote (started first if need
# be), so that it imports only what it adds: Lightning's zygote, 3 s of CPU less than its own
BASES = (TORCH,)
_HEADER = struct.Struct("!I")
_START_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class _Key:
    variables: tuple[tuple[str, str | None], ...]
    preload: tuple[str, ...]


class Child:
    """A command's process forked by a zygote, used as far as the tests use ``Popen``."""

    def __init__(self, args: list[str], connection: socket.socket, pid: int) -> None:
        self.args = args
        self.pid = pid
        self.returncode: int | None = None
        self._connection = connection
        self._pending = b""

    def wait(self, timeout: float | None = None) -> int:
        """The exit status (negative: the signal), as ``Popen.wait`` gives it."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            if b"\n" in self._pending:
                self.returncode = int(self._pending.split(b"\n", 1)[0])
                self._connection.close()
                break
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
            self._connection.settimeout(left)
            try:
                chunk = self._connection.recv(64)
            except TimeoutError:
                continue
            if not chunk:
                raise RuntimeError(f"the zygote went away before pid {self.pid} ended")
            self._pending += chunk
        return self.returncode

    def poll(self) -> int | None:
        try:
            return self.wait(timeout=0.001)
        except subprocess.TimeoutExpired:
            return None

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Zygote:
    def __init__(self, key: _Key, env: dict[str, str], base: _Zygote | None = None) -> None:
        """Start a zygote for ``key``: a fresh interpreter, or, with ``base`` (a zygote of the
        same variables whose preload ``key``'s extends), a child of ``base`` that imports the
        rest under ``env``."""
        self.directory = Path(tempfile.mkdtemp(prefix="sia-zygote-"))
        self.path = self.directory / "socket"
        self.process: subprocess.Popen[bytes] | Child
        if base is None:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "tests.zygote", str(self.path), *key.preload],
                cwd=REPO,
                env=env,
                stdin=subprocess.DEVNULL,
            )
        else:
            extra = list(key.preload[len(base.key.preload) :])
            with open(os.devnull, "rb") as devnull:
                self.process = base.fork(
                    [sys.executable, "-m", "tests.zygote", str(self.path), *extra],
                    REPO,
                    env,
                    [devnull.fileno(), 1, 2],
                    zygote=True,
                )
        self.key = key
        deadline = time.monotonic() + _START_TIMEOUT_S
        while not self.path.exists():
            if self.process.poll() is not None:
                raise RuntimeError(f"the zygote exited with status {self.process.returncode}")
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the zygote did not listen within {_START_TIMEOUT_S:.0f} s")
            time.sleep(0.02)

    def fork(
        self, args: list[str], cwd: Path, env: dict[str, str], fds: list[int], zygote: bool = False
    ) -> Child:
        """A child running ``args`` (with ``zygote``: ``args`` start a zygote, served by the
        child itself, which keeps this one's imports)."""
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(self.path))
        request = {"args": args, "cwd": str(cwd), "env": env, "zygote": zygote}
        body = json.dumps(request).encode()
        socket.send_fds(connection, [_HEADER.pack(len(body)) + body], fds)
        line = b""
        while not line.endswith(b"\n"):
            chunk = connection.recv(1)
            if not chunk:
                raise RuntimeError(f"the zygote refused {args}")
            line += chunk
        return Child(args, connection, int(line))

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            except RuntimeError:  # a forked zygote whose base went first (and took it along)
                pass
        with contextlib.suppress(OSError):
            self.path.unlink()
        with contextlib.suppress(OSError):
            self.directory.rmdir()


_zygotes: dict[_Key, _Zygote] = {}


def _stop_all() -> None:
    while _zygotes:
        _zygotes.popitem()[1].stop()


atexit.register(_stop_all)


def popen(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    stdout: int | None = None,
    stderr: int | None = None,
    preload: tuple[str, ...] = TORCH,
) -> Child:
    """Start ``args`` (``[sys.executable, "-m", module, ...]`` or ``[sys.executable, script,
    ...]``) forked from a zygote that imported ``preload`` under ``env``'s load-time variables;
    ``stdout``/``stderr`` are descriptors (None: this process's)."""
    if len(args) < 2 or args[0] != sys.executable or (args[1] == "-m" and len(args) < 3):
        raise ValueError(f"a zygote runs `python SCRIPT ...` or `python -m MODULE ...`: {args}")
    if args[1].startswith("-") and args[1] != "-m":
        raise ValueError(f"a zygote takes no interpreter option but -m: {args}")
    variables = tuple((name, env.get(name)) for name in LOAD_TIME_VARIABLES)
    zygote = _zygote(_Key(variables, tuple(preload)), env)
    fds = [0, 1 if stdout is None else stdout, 2 if stderr is None else stderr]
    return zygote.fork(list(args), cwd, dict(env), fds)


def _zygote(key: _Key, env: dict[str, str]) -> _Zygote:
    """The running zygote for ``key``, started if need be (from a base's, :data:`BASES`)."""
    zygote = _zygotes.get(key)
    if zygote is not None and zygote.process.poll() is None:
        return zygote
    bases = [b for b in BASES if len(b) < len(key.preload) and key.preload[: len(b)] == b]
    base = _zygote(_Key(key.variables, max(bases, key=len)), env) if bases else None
    zygote = _zygotes[key] = _Zygote(key, env, base)
    return zygote


def run(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    timeout: float,
    check: bool = True,
    preload: tuple[str, ...] = TORCH,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, capture_output=True, text=True)`` through a zygote."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        child = popen(
            args, cwd=cwd, env=env, stdout=out.fileno(), stderr=err.fileno(), preload=preload
        )
        try:
            code = child.wait(timeout)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
            raise
        out.seek(0)
        err.seek(0)
        done = subprocess.CompletedProcess(
            args, code, out.read().decode(errors="replace"), err.read().decode(errors="replace")
        )
    if check:
        done.check_returncode()
    return done


# ---- the zygote's side --------------------------------------------------------------------


def _die_with_parent() -> None:
    """The zygote ends when the test session does, even one killed with SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        sys.exit(0)


def _receive(connection: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _address = socket.recv_fds(connection, 1 << 16, 3)
    while len(data) < _HEADER.size:
        data += connection.recv(1 << 16)
    (size,) = _HEADER.unpack_from(data)
    body = data[_HEADER.size :]
    while len(body) < size:
        chunk = connection.recv(1 << 16)
        if not chunk:
            raise ConnectionError("a request ended early")
        body += chunk
    return json.loads(body), list(fds)


def _serve(path: str) -> tuple[dict[str, Any], list[int]]:
    """Fork a child per request and tell each requester its child's pid, then its status.
    Returns only in a child: the request it is to run."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)  # the caller waits for the name: it appears listening
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    waiting: dict[int, socket.socket] = {}
    while True:
        ready, _, _ = select.select([listener, wake_r], [], [])
        if wake_r in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(wake_r, 4096)
            while waiting:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                requester = waiting.pop(pid, None)
                if requester is not None:
                    with contextlib.suppress(OSError):
                        requester.sendall(f"{os.waitstatus_to_exitcode(status)}\n".encode())
                    requester.close()
        if listener in ready:
            connection, _ = listener.accept()
            try:
                request, fds = _receive(connection)
            except (OSError, ValueError):
                connection.close()
                continue
            pid = os.fork()
            if pid == 0:
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                for held in (listener, connection, *waiting.values()):
                    held.close()
                os.close(wake_r)
                os.close(wake_w)
                return request, fds
            for fd in fds:
                os.close(fd)
            connection.sendall(f"{pid}\n".encode())
            waiting[pid] = connection


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """Turn this forked child into ``python ARGS`` started in the request's directory."""
    import runpy

    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threads = os.environ.get("OMP_NUM_THREADS")
    if threads and threads.isdigit() and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(int(threads))
    args = request["args"][1:]
    base_path = sys.path[1:]
    if args[0] == "-m":
        sys.path[:] = [os.getcwd(), *base_path]
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        script = os.path.abspath(args[0])
        sys.path[:] = [os.path.dirname(script), *base_path]
        sys.argv = list(args)
        runpy.run_path(script, run_name="__main__")


def _main() -> None:
    _die_with_parent()
    path, *preload = sys.argv[1:]
    for name in preload:
        __import__(name)
    request, fds = _serve(path)
    while request.get("zygote"):  # a zygote forked from this one: it imports what it adds
        for fd in fds:
            os.close(fd)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        _die_with_parent()
        path, *preload = request["args"][3:]
        for name in preload:
            __import__(name)
        request, fds = _serve(path)
    _become(request, fds)


if __name__ == "__main__":
    _main()
