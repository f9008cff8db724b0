"""The Slurm that ``scripts/capture_slurm_fixtures.py`` records: started, driven, torn down.

One Slurm release run either from its cached Debian root (``chroot ROOT ...``, with /proc, /dev
and /sys bound in) or from the host: munged, slurmctld and six slurmd whose slurm.conf and
gres.conf are rendered by dev/sia_slurm_dev/slurm_conf.py, as the dev cluster's. Kept apart from
what is recorded so that each file reads as one thing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from sia_slurm.slurm.records import parse_records  # noqa: E402
from sia_slurm_dev.roots import mounts_under  # noqa: E402
from sia_slurm_dev.slurm_conf import (  # noqa: E402
    ClusterLayout,
    render_gres_conf,
    render_slurm_conf,
)
from sia_slurm_dev.spec import DevClusterSpec  # noqa: E402

SPEC = DevClusterSpec.parse("a100:2x4,rtx:2x4,t4:2x4")
IN_ROOT_DIR = Path("/srv/sia-capture")
SLEEP = "sleep 3000"  # what a captured job runs: it must outlive the capture


def say(message: str) -> None:
    print(f"[capture {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class CaptureError(RuntimeError):
    pass


class Cluster:
    """One Slurm, run either from a Debian root (``chroot``) or from the host."""

    def __init__(self, root: Path | None, run_dir: Path, port_base: int):
        self.root = root
        self.run_dir = run_dir  # as the daemons see it
        self.prefix = ["chroot", str(root)] if root else []
        self.layout = ClusterLayout(
            root=run_dir, hostname=socket.gethostname(), user="root", port_base=port_base
        )
        self.env = {
            **os.environ,
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
            "SLURM_CONF": str(self.layout.slurm_conf),
        }
        self.daemons: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.mounted: list[Path] = []

    def host(self, path: Path) -> Path:
        """Where an in-root path lies on this machine."""
        return self.root / path.relative_to("/") if self.root else path

    # ---- commands -----------------------------------------------------------------------

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [*self.prefix, *argv],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=120,
            check=False,
        )
        if check and proc.returncode != 0:
            raise CaptureError(f"{' '.join(argv)}: exit {proc.returncode}: {proc.stderr.strip()}")
        return proc

    def sbatch(self, *options: str, wrap: str = SLEEP) -> str:
        jobs = self.host(self.run_dir / "jobs")
        jobs.mkdir(exist_ok=True)
        argv = [
            "sbatch",
            "--parsable",
            f"--chdir={self.run_dir / 'jobs'}",
            f"--output={self.run_dir / 'jobs'}/%j.out",
            *options,
            f"--wrap={wrap}",
        ]
        return self.run(argv).stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        records = parse_records(self.run(["scontrol", "-o", "show", "job", job_id]).stdout)
        if not records:
            raise CaptureError(f"scontrol show job {job_id}: no record")
        return records[0]

    def job_state(self, job_id: str) -> str:
        return self.job(job_id).get("JobState", "?")

    def wait(self, what: str, check: Callable[[], bool], timeout_s: float = 60.0) -> float:
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            if check():
                return time.monotonic() - started
            time.sleep(0.25)
        raise CaptureError(f"timed out after {timeout_s:g} s waiting for {what}")

    def wait_state(self, job_id: str, *states: str, timeout_s: float = 60.0) -> float:
        return self.wait(
            f"job {job_id} in {'/'.join(states)} (is {self.job_state(job_id)})",
            lambda: self.job_state(job_id) in states,
            timeout_s,
        )

    def squeue_json(self) -> str:
        return self.run(["squeue", "--json", "--all", "--states=all"]).stdout

    def gres_detail(self, job_id: str) -> list[str]:
        for job in json.loads(self.squeue_json())["jobs"]:
            if str(job["job_id"]) == job_id:
                return list(job.get("gres_detail") or [])
        return []

    # ---- set up -------------------------------------------------------------------------

    def mount(self) -> None:
        if self.root is None:
            return
        for name, argv in (
            ("proc", ["mount", "-t", "proc", "proc"]),
            ("dev", ["mount", "--bind", "/dev"]),
            ("sys", ["mount", "--bind", "/sys"]),
        ):
            target = self.root / name
            subprocess.run([*argv, str(target)], check=True)
            self.mounted.append(target)

    def write_files(self, release: str) -> dict[str, str]:
        layout = self.layout
        base = self.host(self.run_dir)
        if base.exists():
            if mounts_under(base, Path("/proc/self/mountinfo").read_text()):
                raise CaptureError(f"{base}: something is mounted under it")
            shutil.rmtree(base)
        for sub in ("etc", "state", "spool", "run", "log", "dev", "jobs"):
            (base / sub).mkdir(parents=True)
        munge_dir = self.host(layout.munge_key.parent)
        munge_dir.mkdir(mode=0o700)
        self.run(["mungekey", "-c", "-k", str(layout.munge_key)])
        minor = 0
        for group in SPEC.groups:
            for node in group.node_names():
                for path in layout.gpu_files(node, group.gpus_per_node):
                    os.mknod(self.host(path), 0o666 | stat.S_IFCHR, os.makedev(195, minor))
                    minor += 1
        files = {
            "slurm.conf": render_slurm_conf(SPEC, layout),
            "gres.conf": render_gres_conf(SPEC, layout),
        }
        if release != "22.05":
            # 24.11 and 26.05: slurmd exits "Unable to initialize cgroup plugin" without it
            # (no cgroup filesystem is mounted in the root); 22.05 needs no cgroup.conf here.
            files["cgroup.conf"] = "CgroupPlugin=disabled\n"
        for name, text in files.items():
            path = self.host(layout.slurm_conf.parent / name)
            path.write_text(text)
            path.chmod(0o644)
        return files

    def start(self, role: str, argv: Sequence[str]) -> None:
        log = self.host(self.layout.log_dir) / f"{role.replace(':', '-')}.out"
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                [*self.prefix, *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
                start_new_session=True,
            )
        self.daemons.append((role, proc))
        time.sleep(0.3)
        if proc.poll() is not None:
            raise CaptureError(f"{role} exited at once ({proc.returncode}): {log.read_text()}")

    def up(self) -> None:
        layout = self.layout
        conf = str(layout.slurm_conf)
        self.start(
            "munged",
            [
                "/usr/sbin/munged",
                "--foreground",
                "--force",
                f"--socket={layout.munge_socket}",
                f"--key-file={layout.munge_key}",
                f"--pid-file={layout.root}/run/munged.pid",
                f"--log-file={layout.log_dir}/munged.log",
                f"--seed-file={layout.root}/run/munged.seed",
            ],
        )
        self.wait("munge socket", lambda: self.host(layout.munge_socket).exists(), 20)
        self.start("slurmctld", ["/usr/sbin/slurmctld", "-D", "-c", "-f", conf])
        self.wait("slurmctld", lambda: self.run(["scontrol", "ping"], check=False).returncode == 0)
        for node in SPEC.node_names():
            self.start(f"slurmd:{node}", ["/usr/sbin/slurmd", "-D", "-N", node, "-f", conf])

        def idle() -> bool:
            records = parse_records(self.run(["scontrol", "-o", "show", "node"]).stdout)
            states = {r["NodeName"]: r.get("State", "") for r in records}
            for name, state in states.items():
                if "DOWN" in state and "NOT_RESPONDING" not in state and "*" not in state:
                    self.run(["scontrol", "update", f"NodeName={name}", "State=RESUME"], False)
            return len(states) == len(SPEC.node_names()) and all(
                s == "IDLE" for s in states.values()
            )

        took = self.wait("every node IDLE", idle, 90)
        say(f"{len(SPEC.node_names())} nodes idle after {took:.0f} s")

    # ---- take down ----------------------------------------------------------------------

    def down(self) -> None:
        """Cancel the jobs, stop our daemons by pid, then what still runs in the root; umount."""
        if any(role == "slurmctld" and p.poll() is None for role, p in self.daemons):
            with contextlib.suppress(Exception):
                ids = self.run(["squeue", "-h", "-o", "%i"], check=False).stdout.split()
                if ids:
                    self.run(["scancel", *ids], check=False)
                self.wait(
                    "jobs to end",
                    lambda: not self.run(["squeue", "-h", "-t", "R,CG", "-o", "%i"]).stdout.strip(),
                    40,
                )
        for role, proc in reversed(self.daemons):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    say(f"{role} ignored SIGTERM: SIGKILL {proc.pid}")
                    proc.kill()
                    proc.wait(5)
        # Job processes a requeue left behind (proctrack/linuxproc loses reparented children).
        left = processes_in(self.root) if self.root else processes_under(self.run_dir)
        for pid, cmd in left.items():
            say(f"still running in {self.root or self.run_dir}: {pid} {cmd}: SIGKILL")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if left:
            time.sleep(1)
        for target in reversed(self.mounted):
            subprocess.run(["umount", str(target)], check=False)
        still = (
            mounts_under(self.root, Path("/proc/self/mountinfo").read_text()) if self.root else []
        )
        if still:
            say(f"STILL MOUNTED: {still}")
        else:
            shutil.rmtree(self.host(self.run_dir), ignore_errors=True)
            say(f"stopped; unmounted; removed {self.host(self.run_dir)}")


def processes_in(root: Path) -> dict[int, str]:
    """Processes whose root directory is ``root`` (what runs inside that chroot)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if os.readlink(entry / "root") == str(root):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                found[int(entry.name)] = cmd
    return found


def processes_under(run_dir: Path) -> dict[int, str]:
    """Processes working in ``run_dir`` (jobs of a cluster run from the host)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cwd = os.readlink(entry / "cwd")
            if cwd == str(run_dir) or cwd.startswith(f"{run_dir}/"):
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
                found[int(entry.name)] = cmd
    return found
