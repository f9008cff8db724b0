"""The Slurm command lines of the backend, built as argv lists (never shell strings).

Pure functions, so the exact commands are unit-tested and the sequences in
``docs/slurm-actuation.md`` (verified on Slurm 22.05.8) are written down once, here.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.slurm.observe.jsonparse import SlurmJob

# Observation: one command per kind per round.
# -d adds GresUsed: the GPUs Slurm counts as allocated (phantom ones included, see
# slurm/observe/capacity.py).
SHOW_NODES = ("scontrol", "-d", "-o", "show", "node")
SHOW_RESERVATIONS = ("scontrol", "-o", "show", "reservation")
# --all: hidden partitions too; --states=all: finished jobs too (23.02+ honour filters with
# --json; 22.05 ignores them and prints every job it still remembers).
SQUEUE_JSON = ("squeue", "--json", "--all", "--states=all")


def squeue_json_of(job_ids: list[str]) -> list[str]:
    """``squeue --json`` about ``job_ids`` alone (the actuator's waits)."""
    return [*SQUEUE_JSON, f"--jobs={','.join(job_ids)}"]


@dataclass(frozen=True)
class Shape:
    """Where a job should run: partition, node count, GPUs per node and the exact nodes."""

    partition: str
    nodes: int
    gpus_per_node: int
    node_list: tuple[str, ...]

    def matches(self, job: SlurmJob) -> list[str]:
        """What differs between this shape and the job's request (empty when it took).

        A pending job that has run shows the node count of its last allocation, not its
        request (22.05), so the node count is checked through the task count (one task per
        node) and, for a job that never ran, directly.
        """
        differences = []
        if job.partition != self.partition:
            differences.append(f"Partition={job.partition} (wanted {self.partition})")
        if job.tasks != self.nodes:
            differences.append(f"NumTasks={job.tasks} (wanted {self.nodes})")
        if job.restart_count == 0 and job.node_count != self.nodes:
            differences.append(f"NumNodes={job.node_count} (wanted {self.nodes})")
        if job.requested_gpus_per_node != self.gpus_per_node:
            differences.append(
                f"GPUs per node={job.requested_gpus_per_node} (wanted {self.gpus_per_node})"
            )
        if sorted(job.required_nodes) != sorted(self.node_list):
            differences.append(
                f"ReqNodeList={','.join(job.required_nodes) or '-'} "
                f"(wanted {','.join(self.node_list)})"
            )
        return differences


def job_list(job_ids: Sequence[str]) -> str:
    """Slurm's job list argument: ``12,13,14``."""
    return ",".join(job_ids)


def signal_checkpoint(job_ids: Sequence[str]) -> list[str]:
    """Wake the jobs' batch shells with SIGUSR1 (``scontrol requeue`` never sends it)."""
    return ["scancel", "--batch", "--signal=USR1", *job_ids]


def requeue_hold(job_ids: Sequence[str]) -> list[str]:
    """Requeue running or finished jobs and keep them held. The hold is a *user* hold whoever
    issues it (the owner may release it): follow it with :func:`hold` (docs/slurm-actuation.md)."""
    return ["scontrol", "requeuehold", job_list(job_ids)]


def hold(job_ids: Sequence[str]) -> list[str]:
    return ["scontrol", "hold", job_list(job_ids)]


def release(job_ids: Sequence[str]) -> list[str]:
    return ["scontrol", "release", job_list(job_ids)]


def start_at(job_id: str, when: float) -> list[str]:
    """Move a requeued job's BeginTime to ``when`` (seconds since the epoch on slurmctld's
    clock, as :func:`relaunch_floor` computes it; written in local time, as scontrol reads it)."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(math.ceil(when)))
    return ["scontrol", "update", f"JobId={job_id}", f"StartTime={stamp}"]


def relaunch_floor(begin_time: float, cred_expire_s: int) -> float:
    """The earliest second a requeued job may start again without meeting its revoked
    credential, from Slurm's own record of the requeue (no other clock involved).

    A requeue makes slurmd revoke the job's credential at the kill's second K, and slurmctld
    delays the job to BeginTime = K + cred_expire + 1. slurmd refuses any later launch whose
    credential was created in a second <= K ("Job credential revoked", the job then ends
    FAILED), so the job may start from K + 2 on, i.e. BeginTime - cred_expire + 1; waiting
    out the whole cred_expire (120 s by default) is not needed (docs/slurm-actuation.md).
    """
    return begin_time - cred_expire_s + 1


def kill_second(begin_time: float, cred_expire_s: int) -> float:
    """The second K a requeue killed the job (slurmctld's clock; its BeginTime is K +
    cred_expire + 1): where a relaunch may start on nodes the killed run did not use.

    Only the killed run's nodes revoke its credential (slurmd keeps the revocation itself);
    a node that never ran it launches a credential of the kill's second. As a StartTime this
    second is in the past, which Slurm takes as "now" (docs/slurm-actuation.md).
    """
    return begin_time - cred_expire_s - 1


# Slurm's default when AuthInfo sets no cred_expire (seconds).
DEFAULT_CRED_EXPIRE_S = 120
SHOW_CONFIG = ("scontrol", "show", "config")


def parse_cred_expire(config_text: str) -> int:
    """``cred_expire`` from ``scontrol show config`` (its AuthInfo line), else the default."""
    match = re.search(r"^AuthInfo\s*=.*\bcred_expire=(\d+)", config_text, re.MULTILINE)
    return int(match[1]) if match else DEFAULT_CRED_EXPIRE_S


def cancel(job_ids: Sequence[str]) -> list[str]:
    return ["scancel", *job_ids]


def reshape(job_id: str, shape: Shape, cpus_per_task: int = 1) -> list[str]:
    """Retype and resize a pending job: untyped GPUs per node, the type chosen by partition.

    ``NumNodes=N-N`` (``N`` alone only sets the minimum), ``NumTasks=N`` (one task per node)
    and ``NumCPUs=N*cpus_per_task``: a job that has run keeps its old CPU count, and a node
    count shrink without it ends in BadConstraints (verified on 22.05.8). All fields in one
    update, which Slurm applies all or nothing.
    """
    return [
        "scontrol",
        "update",
        f"JobId={job_id}",
        f"Partition={shape.partition}",
        f"TresPerNode=gres:gpu:{shape.gpus_per_node}",
        f"NumNodes={shape.nodes}-{shape.nodes}",
        f"NumTasks={shape.nodes}",
        f"NumCPUs={shape.nodes * cpus_per_task}",
        f"ReqNodeList={','.join(shape.node_list)}",
    ]


def write_batch_script(job_id: str) -> list[str]:
    """The job's batch script on stdout (works while slurmctld still holds the job)."""
    return ["scontrol", "write", "batch_script", job_id, "-"]


def resubmit(job: SlurmJob, shape: Shape, script: Path, *, run_as_owner: bool) -> list[str]:
    """Submit ``script`` again for ``job`` (same name, comment, files, directory), held,
    in ``shape``. The fallback when Slurm refuses to shrink the job's node count in place
    (the job sits in BadConstraints after an update).

    Carried over from Slurm's record of the old job: name, comment, working directory,
    stdout/stderr/stdin, time limit, account, QOS; ``--requeue --open-mode=append`` as
    sia-sbatch submits. ``--export=NONE``: the job starts from the owner's login environment
    (the submitting shell's environment is not kept by Slurm). Options given on the original
    sbatch command line beyond these are lost; ``#SBATCH`` lines in the script are kept (the
    options here override them). ``run_as_owner`` (root only) submits as the job's user.
    """
    argv = [
        "sbatch",
        "--parsable",
        "--hold",
        f"--job-name={job.name}",
        f"--comment={job.comment}",
        f"--partition={shape.partition}",
        f"--nodes={shape.nodes}-{shape.nodes}",
        f"--ntasks={shape.nodes}",
        f"--cpus-per-task={job.cpus_per_task}",
        f"--gpus-per-node={shape.gpus_per_node}",
        f"--nodelist={','.join(shape.node_list)}",
        "--requeue",
        "--open-mode=append",
        "--export=NONE",
    ]
    if job.working_dir:
        argv.append(f"--chdir={job.working_dir}")
    for option, value in (
        ("--output", job.stdout),
        ("--error", job.stderr),
        ("--input", job.stdin),
        ("--account", job.account),
        ("--qos", job.qos),
    ):
        if value:
            argv.append(f"{option}={value}")
    if job.time_limit_min is not None:
        argv.append(f"--time={job.time_limit_min}")
    if run_as_owner:
        argv += [f"--uid={job.user_id}", f"--gid={job.group_id}"]
    argv.append(str(script))
    return argv


def parse_parsable(stdout: str) -> str:
    """The job id from ``sbatch --parsable`` output (``123`` or ``123;cluster``)."""
    job_id = stdout.strip().split(";")[0].strip()
    if not job_id.isdigit():
        raise ValueError(f"sbatch --parsable printed {stdout.strip()!r}, expected a job id")
    return job_id
