"""The grant: the controller's assignment for this very Slurm run, checked against what Slurm
gave it. ``sia-launch`` trains only in the run an assignment names, on what it names
(partition -> GPU type, node count, GPUs per node, node list); anything else was not granted
by the controller, which requeues such a run at its next round (``docs/protocol.md``); a
mismatch only the launcher can see (the assignment is for this very run, Slurm's allocation as
the batch step sees it is not) is written down for the controller (:class:`RunRefusal`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sia_slurm.job_settings import JobSiteSettings
from sia_slurm.protocol import (
    Assignment,
    ProtocolError,
    RunRefusal,
    StatePaths,
    read_document,
    refusal_name,
    write_document,
)

logger = logging.getLogger("sia-launch")

EXIT_USAGE = 2  # bad configuration or protocol file
EXIT_MISMATCH = 3  # Slurm's allocation is not the assignment


class LaunchError(RuntimeError):
    """The job cannot be launched; ``status`` is the exit status to use."""

    def __init__(self, message: str, status: int = EXIT_USAGE):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class SlurmAllocation:
    """What Slurm gave this run, from the batch step's environment at launch time."""

    job_id: str
    partition: str
    nodes: int
    gpus_per_node: int
    node_list: str
    restart_count: int

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SlurmAllocation:
        def need(name: str) -> str:
            value = environ.get(name, "")
            if not value:
                raise LaunchError(f"{name}: not set; sia-launch runs as a Slurm batch script")
            return value

        def count(name: str, default: str | None = None) -> int:
            raw = environ.get(name, default) if default is not None else need(name)
            try:
                value = int(raw or "")
            except ValueError:
                raise LaunchError(f"{name}: expected an integer, got {raw!r}") from None
            if value < 0:
                raise LaunchError(f"{name}: expected an integer >= 0, got {raw!r}")
            return value

        return cls(
            job_id=need("SLURM_JOB_ID"),
            partition=need("SLURM_JOB_PARTITION"),
            nodes=count("SLURM_JOB_NUM_NODES"),
            gpus_per_node=count("SLURM_GPUS_ON_NODE", "0"),
            node_list=need("SLURM_JOB_NODELIST"),
            restart_count=count("SLURM_RESTART_COUNT", "0"),
        )


def check_allocation(
    assignment: Assignment,
    allocation: SlurmAllocation,
    settings: JobSiteSettings,
    hostnames: Sequence[str] | None = None,
) -> None:
    """Raise :class:`LaunchError` (exit 3) listing every way the allocation differs."""
    where = "assignment.json"
    problems = []
    partition = settings.partitions.get(allocation.partition)
    if partition is None:
        known = ", ".join(settings.partitions)
        problems.append(
            f"SLURM_JOB_PARTITION={allocation.partition} is not a partition of the config ({known})"
        )
    else:
        if partition.gpu_type != assignment.gpu_type:
            problems.append(
                f"{where}: gpu_type: {assignment.gpu_type}, but partition "
                f"{allocation.partition} holds {partition.gpu_type}"
            )
        if assignment.partition != allocation.partition:
            problems.append(
                f"{where}: partition: {assignment.partition}, but SLURM_JOB_PARTITION="
                f"{allocation.partition}"
            )
    if assignment.nodes != allocation.nodes:
        problems.append(
            f"{where}: nodes: {assignment.nodes}, but SLURM_JOB_NUM_NODES={allocation.nodes}"
        )
    if assignment.gpus_per_node != allocation.gpus_per_node:
        problems.append(
            f"{where}: gpus per node: {assignment.gpus_per_node} (gpus={assignment.gpus}), but "
            f"SLURM_GPUS_ON_NODE={allocation.gpus_per_node}"
        )
    run = (assignment.slurm_job_id, assignment.slurm_restart_count)
    if run != (allocation.job_id, allocation.restart_count):
        problems.append(
            f"{where}: written for Slurm job {assignment.slurm_job_id or '-'} run "
            f"{assignment.slurm_restart_count}, but this is SLURM_JOB_ID={allocation.job_id} "
            f"SLURM_RESTART_COUNT={allocation.restart_count}: not granted by the controller"
        )
    listed = assignment.node_list and hostnames is not None
    if listed and sorted(assignment.node_list) != sorted(hostnames or ()):
        problems.append(
            f"{where}: node_list: {','.join(assignment.node_list)}, but "
            f"SLURM_JOB_NODELIST={allocation.node_list}"
        )
    if problems:
        raise LaunchError(
            f"job {assignment.sia_id}: Slurm's allocation is not the controller's assignment "
            f"(round {assignment.round_index}):\n  " + "\n  ".join(problems),
            EXIT_MISMATCH,
        )


def await_grant(
    paths: StatePaths,
    sia_id: str,
    allocation: SlurmAllocation,
    settings: JobSiteSettings,
    hostnames: Sequence[str],
    wait_s: float,
    *,
    poll_s: float = 2.0,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Assignment:
    """The controller's assignment for this very run; until there is one, train nothing.

    A run without a matching assignment was not granted by the controller, which requeues it
    at its next round (Slurm's SIGTERM ends this process then). The assignment is re-read
    meanwhile: one written late (or seen late over NFS) lets the run go on. An assignment for
    this very run (job id, restart count, nodes) that Slurm's allocation does not match is
    a mismatch the controller cannot see in ``scontrol`` (a run started with
    ``SLURM_GPUS_ON_NODE=0`` while Slurm's record holds the GPUs): the refusal is left in
    ``refusal-<run>.json`` (:class:`RunRefusal`) for the controller to requeue the run, and
    withdrawn when this function returns or gives up. After ``wait_s`` without either,
    :class:`LaunchError` (exit 3).
    """
    deadline = clock() + wait_s
    said, refused = "", False
    try:
        while True:
            assignment: Assignment | None = None
            try:
                assignment = read_document(Assignment, paths.assignment(sia_id))
                if assignment.sia_id != sia_id:
                    raise LaunchError(
                        f"{paths.assignment(sia_id)}: sia_id is {assignment.sia_id!r}"
                    )
                check_allocation(assignment, allocation, settings, hostnames)
                return assignment
            except (ProtocolError, LaunchError) as exc:
                problem = str(exc)
                mismatch = isinstance(exc, LaunchError) and exc.status == EXIT_MISMATCH
            mine = (
                mismatch
                and assignment is not None
                and _names_run(assignment, allocation, hostnames)
            )
            if clock() >= deadline:
                raise LaunchError(problem, EXIT_MISMATCH)
            if mine and (problem != said or not refused):
                assert assignment is not None
                refused = record_refusal(paths, assignment, allocation, hostnames, problem)
            elif refused and not mine:
                refused = not _withdraw(paths, sia_id, allocation)
            if problem != said:
                said = problem
                logger.warning(
                    "[job=%s] not training: %s; waiting for the controller to requeue this "
                    "run (at most %.0f s)",
                    sia_id,
                    problem,
                    wait_s,
                )
            sleep(poll_s)
    finally:
        if refused:
            _withdraw(paths, sia_id, allocation)


def _names_run(
    assignment: Assignment, allocation: SlurmAllocation, hostnames: Sequence[str]
) -> bool:
    """Whether ``assignment`` is for this very run: its job id and restart count, and its
    nodes when it lists them (:meth:`Assignment.hands_over`). One for another run, or for
    none, is not a refusal: it may be late, and the run keeps waiting."""
    return bool(assignment.slurm_job_id) and not assignment.hands_over(
        allocation.job_id, allocation.restart_count, hostnames
    )


def record_refusal(
    paths: StatePaths,
    assignment: Assignment,
    allocation: SlurmAllocation,
    hostnames: Sequence[str],
    problem: str,
) -> bool:
    """Write this run's :class:`RunRefusal`; whether it was written (a failure is logged:
    the launcher then gives up after its wait, as before)."""
    refusal = RunRefusal(
        sia_id=assignment.sia_id,
        slurm_job_id=allocation.job_id,
        slurm_restart_count=allocation.restart_count,
        node_list=tuple(hostnames),
        round_index=assignment.round_index,
        time=time.time(),
        message=problem,
    )
    path = paths.job_dir(assignment.sia_id) / refusal_name(
        allocation.job_id, allocation.restart_count
    )
    try:
        write_document(path, refusal)
    except (OSError, ProtocolError) as exc:
        logger.warning("[job=%s] cannot record the refusal of this run: %s", assignment.sia_id, exc)
        return False
    logger.warning("[job=%s] refusal recorded in %s for the controller", assignment.sia_id, path)
    return True


def _withdraw(paths: StatePaths, sia_id: str, allocation: SlurmAllocation) -> bool:
    """Remove this run's refusal (the run trains after all, or gives up); whether it is gone."""
    path = paths.job_dir(sia_id) / refusal_name(allocation.job_id, allocation.restart_count)
    try:
        path.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("[job=%s] cannot withdraw %s: %s", sia_id, path, exc)
        return False
    return True
