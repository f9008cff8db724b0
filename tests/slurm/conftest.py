"""A small fake Slurm for the backend's unit tests, and a managed-job submitter for the live ones.

:class:`FakeSlurm` is a :class:`~sia_slurm.slurm.runner.CommandRunner` that answers the exact
commands the backend issues from an in-memory job table, with the 22.05.8 behaviours the backend
relies on (docs/slurm-actuation.md): a requeued job reports the node count of its last
allocation; a requeue bumps the restart count, holds the job under a *user* hold
(``JobHeldUser``) and delays it to BeginTime = now + cred_expire + 1 (squeue's
``eligible_time``, and ``start_time`` while it lies ahead);
``sbatch --hold`` is a user hold too, the controller's ``scontrol hold`` an admin hold
(``JobHeldAdmin``), which the job's user cannot release (:meth:`FakeSlurm.user_release`). Jobs
belong to the test's own uid unless submitted for another. Every argv is recorded, so tests
assert command sequences. Jobs acknowledge stop requests when signalled (like
tests/slurm/protocol_job.py), unless told not to. :meth:`FakeSlurm.fail` makes chosen
``scontrol`` commands fail for chosen jobs as 22.05 does (exit 1, ``<reason> for job <id>`` on
stderr, the other jobs of a job list done), or, for an update, exit 0 without taking.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from sia_slurm.protocol import JobSpec, StatePaths, StopRequest, read_document, write_document
from sia_slurm.slurm.runner import CommandError, CommandResult, SubprocessRunner
from sia_slurm.state.tree import prepare, set_up
from sia_slurm_dev import DevCluster

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "slurm-22.05"
PROTOCOL_JOB = Path(__file__).resolve().parent / "protocol_job.py"


class FakeClock:
    """Time that moves only when someone sleeps."""

    def __init__(self, start: float = 1_000_000.0) -> None:
        self.time = start
        self.on_sleep: Callable[[float], None] = lambda now: None

    def now(self) -> float:
        return self.time

    def sleep(self, seconds: float) -> None:
        self.time += max(seconds, 0.001)
        self.on_sleep(self.time)


# A refusal slurmctld gives any job command while it is busy (docs/slurm-actuation.md).
BUSY = "Job update not available right now, the DB index is being set, try again in a bit"


@dataclass
class CommandFailure:
    """Makes ``scontrol <verb>`` fail for Slurm job ``job_id``: ``verb`` is ``hold``,
    ``release``, ``requeuehold`` or ``update``; an update fails only if it sets ``setting``
    (``StartTime``, ``Partition``...) when one is given. The command exits 1 with ``reason``,
    or, ``silent`` (an update only), exits 0 without changing the job, which is why the backend
    reads a job back after an update (docs/slurm-actuation.md). ``times``: how many such
    commands fail before they work again."""

    verb: str
    job_id: str
    setting: str | None = None
    reason: str = BUSY
    times: float = math.inf
    silent: bool = False


class _Refused(Exception):
    """What a fake command prints on stderr when it exits 1."""


@dataclass
class FakeSlurm:
    """An in-memory Slurm answering the backend's commands."""

    paths: StatePaths
    clock: FakeClock
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    calls: list[list[str]] = field(default_factory=list)
    call_times: list[float] = field(default_factory=list)  # the clock at each call
    nodes_text: str = (FIXTURES / "show-node.txt").read_text()
    reservations_text: str = "No reservations in the system\n"
    ack_delay_s: dict[str, float] = field(default_factory=dict)  # sia id -> seconds; inf: never
    completing_s: dict[str, float] = field(default_factory=dict)  # sia id -> s COMPLETING
    ignore_fields: set[str] = field(default_factory=set)  # update fields that do not take
    on_release: Callable[[str], None] = lambda job_id: None
    failures: list[CommandFailure] = field(default_factory=list)  # see :meth:`fail`
    cred_expire_s: int = 120  # AuthInfo's cred_expire, as `scontrol show config` says
    _signalled: dict[str, float] = field(default_factory=dict)
    _completing: dict[str, float] = field(default_factory=dict)  # job id -> PENDING from then
    _next_id: int = 100

    def __post_init__(self) -> None:
        self.clock.on_sleep = self._tick

    # ---- building the table -----------------------------------------------------------------

    def submit(
        self,
        sia_id: str | None,
        partition: str = "t4",
        gpus: int = 1,
        *,
        held: bool = True,
        user_id: int | None = None,
    ) -> str:
        """A job as sia-sbatch submits it (held; its directory and spec made as the test's own
        uid), or an unmanaged one (``sia_id`` None). ``user_id``: Slurm's owner of the job
        (default: this process's uid); another uid's job gets no files."""
        uid = os.geteuid() if user_id is None else user_id
        job_id = str(self._next_id)
        self._next_id += 1
        self.jobs[job_id] = {
            "job_id": int(job_id),
            "name": "job",
            "job_state": "PENDING",
            "state_reason": "JobHeldUser" if held else "Priority",
            "priority": 0 if held else 1,
            "comment": f"sia-slurm:{sia_id}" if sia_id else "",
            "partition": partition,
            "nodes": "",
            "node_count": 1,
            "tasks": 1,
            "cpus": 1,
            "tres_per_node": f"gres:gpu:{gpus}",
            "gres_detail": [],
            "required_nodes": "",
            "restart_cnt": 0,
            "submit_time": self.clock.now(),
            "start_time": 0,
            "eligible_time": 0,
            "end_time": 0,
            "user_id": uid,
            "group_id": os.getegid(),
            "current_working_directory": "/tmp",
            "standard_output": "/tmp/out",
        }
        mine = uid == os.geteuid()
        if sia_id is not None and mine and not self.paths.spec(sia_id).exists():
            self.paths.job_dir(sia_id).mkdir(mode=0o755, exist_ok=True)  # as sia-sbatch does
            write_document(self.paths.spec(sia_id), JobSpec(sia_id=sia_id, app="cifar10"))
        return job_id

    def start(self, job_id: str, nodes: Sequence[str]) -> None:
        """Slurm starts the job on ``nodes`` (with its requested GPUs per node)."""
        job = self.jobs[job_id]
        per_node = int(job["tres_per_node"].rsplit(":", 1)[1])
        job.update(
            job_state="RUNNING",
            state_reason="None",
            priority=1,
            nodes=",".join(nodes),
            node_count=len(nodes),
            gres_detail=[f"gpu:{per_node}(IDX:0-{per_node - 1})" for _ in nodes],
            start_time=self.clock.now(),
        )

    def job(self, job_id: str) -> dict[str, Any]:
        return self.jobs[job_id]

    def _requeue(self, job: dict[str, Any], reason: str, *, priority: int) -> None:
        """Back to PENDING with one more restart; BeginTime delayed by cred_expire + 1 s."""
        job.update(
            job_state="PENDING",
            state_reason=reason,
            priority=priority,
            nodes="",
            gres_detail=[],
            restart_cnt=job["restart_cnt"] + 1,
            start_time=int(self.clock.now()) + self.cred_expire_s + 1,
            eligible_time=int(self.clock.now()) + self.cred_expire_s + 1,
        )

    def user_release(self, job_id: str) -> bool:
        """The job's user runs ``scontrol release``: it takes on a user hold only (22.05.8:
        an admin hold answers "Access/permission denied"). Whether it took."""
        job = self.jobs[job_id]
        if job["state_reason"] == "JobHeldAdmin":
            return False
        job.update(priority=1, state_reason="None")
        return True

    def user_requeue(self, job_id: str) -> None:
        """The job's user runs ``scontrol requeue`` on her running job: PENDING, *not* held,
        Reason=BeginTime, one more restart (22.05.8)."""
        job = self.jobs[job_id]
        assert job["job_state"] == "RUNNING", job
        self._requeue(job, "BeginTime", priority=1)

    def fail(
        self,
        verb: str,
        job_id: str,
        *,
        setting: str | None = None,
        reason: str = BUSY,
        times: float = math.inf,
        silent: bool = False,
    ) -> CommandFailure:
        """Make ``scontrol <verb>`` fail for ``job_id`` (see :class:`CommandFailure`)."""
        failure = CommandFailure(verb, job_id, setting, reason, times, silent)
        self.failures.append(failure)
        return failure

    def _failure(self, verb: str, job_id: str, fields: Sequence[str] = ()) -> CommandFailure | None:
        """The failure this command meets for ``job_id`` (counted), if any."""
        for failure in self.failures:
            if (failure.verb, failure.job_id) != (verb, job_id) or failure.times <= 0:
                continue
            if failure.setting is not None and failure.setting not in fields:
                continue
            failure.times -= 1
            return failure
        return None

    def clear_calls(self) -> None:
        self.calls.clear()
        self.call_times.clear()

    def time_of(self, argv: Sequence[str]) -> float:
        """When ``argv`` was (first) issued, on the fake clock."""
        return self.call_times[self.calls.index(list(argv))]

    def verbs(self) -> list[str]:
        """The commands issued, as short strings (``squeue``, ``scontrol update``...)."""
        return [" ".join(argv[:2]) if argv[0] == "scontrol" else argv[0] for argv in self.calls]

    # ---- the runner ---------------------------------------------------------------------------

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        argv = list(argv)
        self.calls.append(argv)
        self.call_times.append(self.clock.now())
        try:
            stdout = self._answer(argv)
        except KeyError as exc:
            if check:
                raise CommandError(argv, 1, f"Invalid job id specified {exc}") from None
            return CommandResult(tuple(argv), 1, "", "Invalid job id specified")
        except _Refused as exc:
            if check:
                raise CommandError(argv, 1, str(exc)) from None
            return CommandResult(tuple(argv), 1, "", str(exc))
        return CommandResult(tuple(argv), 0, stdout, "")

    def _answer(self, argv: list[str]) -> str:
        command = shlex.join(argv)
        if argv[0] == "squeue":
            jobs = list(self.jobs.values())
            wanted = [a.split("=", 1)[1].split(",") for a in argv if a.startswith("--jobs=")]
            if wanted:  # as 23.02+ do; an unknown id fails the whole query
                for job_id in wanted[0]:
                    self.jobs[job_id]
                jobs = [job for job in jobs if str(job["job_id"]) in wanted[0]]
            return json.dumps({"jobs": jobs, "errors": []})
        if argv[:2] == ["scontrol", "-d"]:  # -d -o show node
            return self.nodes_text
        if argv[:3] == ["scontrol", "-o", "show"]:
            return self.nodes_text if argv[3] == "node" else self.reservations_text
        if argv[:2] == ["scancel", "--batch"]:
            for job_id in argv[3:]:
                self.jobs[job_id]
                self._signalled[job_id] = self.clock.now()
            self._tick(self.clock.now())
            return ""
        if argv[0] == "scancel":
            for job_id in argv[1:]:
                self.jobs[job_id].update(job_state="CANCELLED", gres_detail=[])
            return ""
        if argv[0] == "sbatch":
            return self._sbatch(argv)
        if argv == ["scontrol", "show", "config"]:
            return f"AuthInfo                = cred_expire={self.cred_expire_s}\n"
        verb = argv[1]
        if verb == "update":
            return self._update(argv[2:])
        if verb == "write":
            return "#!/bin/bash\nexec true\n"
        refused = []
        for job_id in argv[2].split(","):
            job = self.jobs[job_id]
            failure = self._failure(verb, job_id)
            if failure is not None:
                refused.append(f"{failure.reason} for job {job_id}")
                continue
            if verb == "requeuehold":
                self._requeue(job, "JobHeldUser", priority=0)  # a user hold, whoever asks
                delay = self.completing_s.get(job["comment"].split(":", 1)[-1], 0.0)
                if delay > 0:
                    job.update(job_state="COMPLETING")
                    self._completing[job_id] = self.clock.now() + delay
            elif verb == "hold":
                job.update(priority=0, state_reason="JobHeldAdmin")
            elif verb == "release":
                job.update(priority=1, state_reason="None")
                self.on_release(job_id)
            else:
                raise AssertionError(f"unexpected command {command}")
        if refused:  # the others of the list were done; 22.05 says why per job, then this
            reason = refused[-1].rsplit(" for job ", 1)[0]
            raise _Refused("\n".join([*refused, f"slurm_suspend error: {reason}"]))
        return ""

    def _update(self, fields: list[str]) -> str:
        values = dict(f.split("=", 1) for f in fields)
        refused = []
        for job_id in values.pop("JobId").split(","):
            job = self.jobs[job_id]
            failure = self._failure("update", job_id, list(values))
            if failure is not None:
                if not failure.silent:
                    refused.append(f"{failure.reason} for job {job_id}")
                continue  # refused, or exit 0 without taking
            for key, value in values.items():
                if key in self.ignore_fields:
                    continue
                if key == "Partition":
                    job["partition"] = value
                elif key == "TresPerNode":
                    job["tres_per_node"] = value
                elif key == "NumNodes" and job["restart_cnt"] == 0:
                    job["node_count"] = int(value.split("-")[0])  # 22.05: stale once it ran
                elif key == "NumTasks":
                    job["tasks"] = int(value)
                elif key == "NumCPUs":
                    job["cpus"] = int(value)
                elif key == "ReqNodeList":
                    job["required_nodes"] = value
                elif key == "StartTime":
                    job["start_time"] = job["eligible_time"] = self._begin_time(value)
        if refused:
            raise _Refused("\n".join(refused))
        return ""

    def _begin_time(self, value: str) -> int:
        """``StartTime=now`` or a local ``YYYY-MM-DDTHH:MM:SS``, as seconds since the epoch."""
        if value == "now":
            return int(self.clock.now())
        return int(time.mktime(time.strptime(value, "%Y-%m-%dT%H:%M:%S")))

    def _sbatch(self, argv: list[str]) -> str:
        options = dict(a[2:].split("=", 1) for a in argv if a.startswith("--") and "=" in a)
        owner = int(options["uid"]) if "uid" in options else None
        job_id = self.submit(
            None, options["partition"], int(options["gpus-per-node"]), user_id=owner
        )
        nodes = int(options["nodes"].split("-")[0])
        self.jobs[job_id].update(
            comment=options["comment"],
            node_count=nodes,
            tasks=int(options["ntasks"]),
            required_nodes=options["nodelist"],
        )
        return f"{job_id}\n"

    def _tick(self, now: float) -> None:
        """Signalled jobs acknowledge their stop request after their delay; requeued jobs
        leave COMPLETING after theirs."""
        for job_id, until in list(self._completing.items()):
            if now >= until:
                self.jobs[job_id].update(job_state="PENDING")
                del self._completing[job_id]
        for job_id, since in list(self._signalled.items()):
            sia_id = self.jobs[job_id]["comment"].split(":", 1)[1]
            if now - since >= self.ack_delay_s.get(sia_id, 0.0):
                request = read_document(StopRequest, self.paths.stop_request(sia_id))
                run = (job_id, self.jobs[job_id]["restart_cnt"])
                self.paths.ack(sia_id, request.round_index, *run).write_text("")
                del self._signalled[job_id]


@pytest.fixture
def state_paths(tmp_path: Path) -> StatePaths:
    """A state tree as `sia-slurm setup` makes it, for this process's account."""
    paths = StatePaths(tmp_path / "state")
    set_up(paths.state_dir, os.geteuid(), os.getegid())
    return paths


@pytest.fixture
def fake_slurm(state_paths: StatePaths) -> FakeSlurm:
    return FakeSlurm(state_paths, FakeClock())


# ------------------------------------------------------------------------------------------------
# Live: submit managed jobs to the dev cluster as sia-sbatch does.


@dataclass
class LiveSubmitter:
    cluster: DevCluster
    paths: StatePaths
    runner: SubprocessRunner
    # Another release's jobs (tests/e2e/test_upgrade_live.py): its interpreter writes the spec
    # with that release's JobSpec and runs that release's protocol_job.py.
    python: str = sys.executable
    protocol_job: Path = PROTOCOL_JOB

    def submit(
        self,
        sia_id: str,
        partition: str = "t4",
        gpus: int = 1,
        steps: int = 0,
        *,
        job_args: Sequence[str] = (),
        **spec_fields: Any,
    ) -> str:
        """Submit held, as sia-sbatch does; ``job_args`` go to protocol_job.py, ``spec_fields``
        to the job's :class:`JobSpec` (kind, max_gpus, restart_cost...)."""
        prepare(self.paths.state_dir, os.geteuid())  # the state tree, as the controller makes it
        self.paths.job_dir(sia_id).mkdir(mode=0o755)
        self.write_spec(
            sia_id,
            {
                "sia_id": sia_id,
                "app": "cifar10",
                "checkpoint_dir": str(self.paths.job_dir(sia_id)),
                **spec_fields,
            },
        )
        script = self.paths.job_dir(sia_id) / "job.sh"
        extra = f" --steps {steps}" if steps else ""
        extra += "".join(f" {shlex.quote(str(arg))}" for arg in job_args)
        script.write_text(
            "#!/bin/bash\n"
            f"exec {self.python} {self.protocol_job} --state-dir {self.paths.state_dir} "
            f"--sia-id {sia_id}{extra}\n"
        )
        out = self.runner.run(
            [
                "sbatch",
                "--parsable",
                "--hold",
                "--requeue",
                "--open-mode=append",
                f"--gpus-per-node={gpus}",
                f"--partition={partition}",
                f"--comment=sia-slurm:{sia_id}",
                f"--output={self.paths.job_dir(sia_id) / 'out.txt'}",
                str(script),
            ]
        ).stdout
        return out.strip().split(";")[0]

    def write_spec(self, sia_id: str, fields: dict[str, Any]) -> None:
        """The job's spec.json, as :attr:`python`'s release writes it."""
        path = self.paths.spec(sia_id)
        if self.python == sys.executable:
            write_document(path, JobSpec(**fields))
            return
        program = (
            "import json, sys\n"
            "from pathlib import Path\n"
            "from sia_slurm.protocol import JobSpec, write_document\n"
            "write_document(Path(sys.argv[1]), JobSpec(**json.loads(sys.argv[2])))\n"
        )
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        argv = [self.python, "-c", program, str(path), json.dumps(fields)]
        subprocess.run(argv, env=env, cwd="/", check=True, capture_output=True, timeout=60)

    def events(self, sia_id: str) -> list[dict[str, Any]]:
        path = self.paths.job_dir(sia_id) / "events.jsonl"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def live_submitter(dev_cluster: DevCluster, tmp_path: Path) -> LiveSubmitter:
    return LiveSubmitter(dev_cluster, StatePaths(tmp_path / "state"), dev_cluster.runner())
