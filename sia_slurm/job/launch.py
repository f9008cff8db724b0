"""``sia-launch``: the batch script of a managed job; checks the allocation, runs torchrun.

``sia-sbatch`` writes a batch script that ``exec``s ``sia-launch --config C --sia-id J``, so
this process *is* the batch step and receives the controller's SIGUSR1. It

1. reads ``jobs/<J>/spec.json`` and the controller's ``control/<J>/assignment.json`` and
   trains only in the Slurm run the assignment was written for (job id and restart count)
   and only on what it names (partition -> GPU type, node count, GPUs per node, node list).
   Otherwise the run was not granted by the controller (a user's own release, Slurm's own
   requeue, an update the controller did not make): it does not train, re-reads the
   assignment every few seconds, and waits for the controller to requeue it (SIGTERM), which
   it does at its next round; only after ``SIA_MISMATCH_WAIT_S`` does it give up (exit 3).
   An assignment for this very run that Slurm's allocation does not match (a mismatch the
   controller cannot see in ``scontrol``) is also left in ``refusal-<run>.json`` for the
   controller. A refused run is the controller's to repair, never the job's failure;
2. unsets the variables sbatch set at submission that went stale when the controller
   resized the pending job (``srun`` would read them as options);
3. starts the training command under torchrun on every node (one ``srun`` task per node, a
   c10d rendezvous on the first node), with the ``SIA_*`` variables of
   :class:`sia_slurm.job.jobenv.JobEnvironment`;
4. forwards SIGTERM/SIGINT to ``srun``, logs SIGUSR1 (the workers poll the stop file), and
   exits with 0 when training completed, 75 when it stopped on the controller's request
   (checkpointed and acknowledged: requeue it), 77 when srun exited 0 under a trainer that was
   killed (a node failure), otherwise with srun's status. How the run ended is judged from
   the status and what the job side recorded (:mod:`sia_slurm.job.runs`).

Exit statuses and the whole job side of the protocol: ``docs/protocol.md``.
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import FrameType

import click

from sia_slurm import __version__
from sia_slurm.clicommon import CONTEXT_SETTINGS, single_threaded_blas
from sia_slurm.job.grant import (
    EXIT_MISMATCH,
    EXIT_USAGE,
    LaunchError,
    SlurmAllocation,
    await_grant,
)
from sia_slurm.job.jobenv import (
    DEFAULT_LINGER_S,
    DEFAULT_METRICS_INTERVAL_S,
    DEFAULT_POLL_INTERVAL_S,
    DEFAULT_PROFILE_MIN_S,
    DEFAULT_PROFILE_STEPS,
    MAX_PROFILE_STEPS,
    JobEnvironment,
    env_name,
)
from sia_slurm.job.runs import (
    EXIT_OK,
    EXIT_STOPPED,
    EXIT_SUPERSEDED,
    RunError,
    await_successor,
    clear_evidence,
    dumps,
    read_evidence,
    reserve_port,
    run_end,
    slurm_ended,
    stopped_on_request,
    superseded_by,
)
from sia_slurm.job.settings import (
    ConfigError,
    JobSiteSettings,
    load_job_settings,
    resolve_config_path,
)
from sia_slurm.protocol import (
    Assignment,
    ExitCause,
    JobSpec,
    ProtocolError,
    RunExit,
    StatePaths,
    exit_name,
    read_document,
    write_document,
)
from sia_slurm.protocol.profile import (
    GPU_TYPES_FILE,
    ProfileError,
    default_profiles_dir,
    load_app_profile,
    load_gpu_types,
)
from sia_slurm.slurm.runner import CommandError, CommandRunner, SubprocessRunner

# As every sia-slurm program: OPENBLAS_NUM_THREADS=1 unless set, for the job's workers too
# (they inherit this process's environment).
single_threaded_blas()

logger = logging.getLogger("sia-launch")
STOPPED = "stopped on the controller's request"  # the message of a stopped run's record
STOPPED_LINE = "stopped on request and checkpointed"  # what the job's log says of it

# Set by sbatch at submission from the job's original request; wrong after the controller
# resized the pending job, and srun reads them as options (docs/slurm-actuation.md).
STALE_SLURM_VARIABLES = (
    "SLURM_GPUS",
    "SLURM_GPUS_PER_NODE",
    "SLURM_GPUS_PER_SOCKET",
    "SLURM_GPUS_PER_TASK",
    "SLURM_GRES",
    "SLURM_NPROCS",
    "SLURM_NTASKS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_TRES_PER_TASK",
)
_PYTHON = re.compile(r"^python[0-9.]*$")


def split_command(command: Sequence[str], default_python: str) -> tuple[str, list[str]]:
    """``(python, torchrun's script arguments)`` for the user's training command.

    ``python[3] script.py ARGS`` or ``python -m module ARGS`` run under that interpreter;
    ``script.py ARGS`` under ``default_python``; anything else is an executable run with
    torchrun's ``--no-python``.
    """
    if not command:
        raise LaunchError("spec.json: command: empty; nothing to train")
    explicit = bool(_PYTHON.match(Path(command[0]).name))
    interpreter = command[0] if explicit else default_python
    args = list(command[1:] if explicit else command)
    if not args:
        raise LaunchError("spec.json: command: a python interpreter without a script")
    if args[0] == "-m":
        if len(args) < 2:
            raise LaunchError("spec.json: command: '-m' without a module name")
        return interpreter, ["--module", *args[1:]]
    if args[0].startswith("-"):
        raise LaunchError(
            f"spec.json: command: python option {args[0]!r} is not supported; give a script "
            "or '-m module'"
        )
    if explicit or args[0].endswith(".py"):
        return interpreter, args
    return interpreter, ["--no-python", *args]


def torchrun_argv(
    allocation: SlurmAllocation,
    assignment: Assignment,
    endpoint: str,
    command: list[str],
    python: str,
) -> list[str]:
    """The ``srun`` command line: one torchrun agent per node, ``gpus_per_node`` workers each."""
    nodes, per_node = allocation.nodes, assignment.gpus_per_node
    return [
        "srun",
        f"--nodes={nodes}",
        f"--ntasks={nodes}",
        "--ntasks-per-node=1",
        f"--gpus-per-node={per_node}",
        "--kill-on-bad-exit=1",
        python,
        "-m",
        "sia_slurm.job.agent",
        f"--nnodes={nodes}",
        f"--nproc-per-node={per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={endpoint}",
        f"--rdzv-id={allocation.job_id}",
        "--max-restarts=0",
        *command,
    ]


def job_environment(
    spec: JobSpec,
    assignment: Assignment,
    allocation: SlurmAllocation,
    settings: JobSiteSettings,
    environ: Mapping[str, str],
    hostnames: Sequence[str] = (),
) -> JobEnvironment:
    """The ``SIA_*`` variables for the workers (``hostnames``: the run's nodes, expanded)."""
    init_batch, max_batch = spec.init_batch_size, spec.max_batch_size
    if not init_batch or not max_batch:
        init_batch, max_batch = _profile_batch_limits(spec)
    paths = StatePaths(settings.state_dir)
    checkpoint_dir = spec.checkpoint_dir or str(paths.job_dir(spec.sia_id) / "checkpoints")
    return JobEnvironment(
        sia_id=spec.sia_id,
        state_dir=settings.state_dir,
        checkpoint_dir=Path(checkpoint_dir),
        app=spec.app,
        gpu_type=assignment.gpu_type,
        profile_gpu_type=settings.profile_key(assignment.gpu_type),
        nodes=assignment.nodes,
        gpus=assignment.gpus,
        batch_size=assignment.batch_size,
        local_bsz=assignment.local_bsz,
        accum_steps=assignment.accum_steps,
        init_batch_size=init_batch,
        max_batch_size=max_batch,
        launch_round=assignment.round_index,
        restarts=allocation.restart_count,
        slurm_job_id=allocation.job_id,
        node_list=",".join(hostnames),
        profile=spec.profile or "",
        metrics_interval_s=_seconds(environ, "metrics_interval_s", DEFAULT_METRICS_INTERVAL_S),
        linger_s=_seconds(environ, "linger_s", DEFAULT_LINGER_S),
        poll_interval_s=_seconds(environ, "poll_interval_s", DEFAULT_POLL_INTERVAL_S),
        profile_sweep=",".join(str(batch) for batch in assignment.profile_sweep),
        profile_steps=_profile_steps(environ),
        profile_min_s=_profile_min_s(environ),
    )


def worker_environment(environ: Mapping[str, str], job: JobEnvironment) -> dict[str, str]:
    """The batch step's environment without the stale variables, plus the job's."""
    clean = {k: v for k, v in environ.items() if k not in STALE_SLURM_VARIABLES}
    return {**clean, **job.to_env()}


# ------------------------------------------------------------------------------------------------
# I/O: Slurm queries, the child process, signals


def expand_hostnames(runner: CommandRunner, node_list: str) -> list[str]:
    return runner.run(["scontrol", "show", "hostnames", node_list]).stdout.split()


def node_address(runner: CommandRunner, node: str) -> str:
    """The node's ``NodeAddr`` as Slurm knows it (node names need not resolve)."""
    output = runner.run(["scontrol", "-o", "show", "node", node]).stdout
    match = re.search(r"\bNodeAddr=(\S+)", output)
    return match[1] if match else node


class _Child:
    """``srun`` as a child process, with SIGTERM/SIGINT forwarded and SIGUSR1 logged."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.terminated = 0
        self._proc = subprocess.Popen(argv, env=env, start_new_session=True)
        signal.signal(signal.SIGTERM, self._forward)
        signal.signal(signal.SIGINT, self._forward)
        signal.signal(signal.SIGUSR1, self._hint)

    def _forward(self, signum: int, _frame: FrameType | None) -> None:
        self.terminated = signum
        logger.info("signal %d: forwarding SIGTERM to srun", signum)
        if self._proc.poll() is None:
            self._proc.send_signal(signal.SIGTERM)

    def _hint(self, _signum: int, _frame: FrameType | None) -> None:
        logger.info("SIGUSR1: the controller asked for a stop; rank 0 polls the stop file")

    def wait(self, on_terminate: Callable[[], None] | None = None) -> int:
        """srun's exit status; ``on_terminate`` runs once, within a second of a forwarded
        SIGTERM, while srun may still wait for its step."""
        noticed = False
        while True:
            try:
                return self._proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                if self.terminated and not noticed and on_terminate is not None:
                    noticed = True
                    on_terminate()


def launch(settings: JobSiteSettings, sia_id: str, environ: Mapping[str, str]) -> int:
    """Check, start and supervise one run of the job; the process exit status. How the run
    ended is left in ``jobs/<id>/exit-<run>.json`` (:class:`RunExit`) for the controller,
    which brings back a run that did not fail by itself (``docs/protocol.md``)."""
    paths = StatePaths(settings.state_dir)
    allocation = SlurmAllocation.from_env(environ)
    try:
        status, cause, message = _launch(settings, paths, sia_id, allocation, environ)
    except LaunchError as exc:
        cause = ExitCause.REFUSED if exc.status == EXIT_MISMATCH else ExitCause.INVALID
        record_exit(paths, sia_id, allocation, cause, exc.status, str(exc))
        raise
    record_exit(paths, sia_id, allocation, cause, status, message)
    clear_evidence(paths.job_dir(sia_id), allocation.job_id, allocation.restart_count)
    return status


def record_exit(
    paths: StatePaths,
    sia_id: str,
    allocation: SlurmAllocation,
    cause: ExitCause,
    status: int,
    message: str = "",
) -> None:
    """Write this run's :class:`RunExit`; a failure to write is logged, never raised (the
    controller then reads the run as ended by Slurm, and brings it back)."""
    record = RunExit(
        sia_id=sia_id,
        slurm_job_id=allocation.job_id,
        slurm_restart_count=allocation.restart_count,
        cause=cause.value,
        status=status,
        time=time.time(),
        message=message,
    )
    try:
        name = exit_name(allocation.job_id, allocation.restart_count)
        write_document(paths.job_dir(sia_id) / name, record)
    except (OSError, ProtocolError) as exc:
        logger.warning("[job=%s] cannot record how this run ended (%s): %s", sia_id, cause, exc)


def _launch(
    settings: JobSiteSettings,
    paths: StatePaths,
    sia_id: str,
    allocation: SlurmAllocation,
    environ: Mapping[str, str],
) -> tuple[int, ExitCause, str]:
    """The run itself: ``(exit status, how it ended, what to say)``."""
    try:
        spec = read_document(JobSpec, paths.spec(sia_id))
    except ProtocolError as exc:
        raise LaunchError(str(exc)) from None
    runner = SubprocessRunner(timeout_s=30)
    try:
        hostnames = expand_hostnames(runner, allocation.node_list)
        address = node_address(runner, hostnames[0])
    except (CommandError, IndexError) as exc:
        raise LaunchError(f"cannot resolve the job's nodes: {exc}", EXIT_MISMATCH) from None
    wait_s = _seconds(environ, "mismatch_wait_s", max(3 * settings.round_seconds, 60.0))
    assignment = await_grant(paths, sia_id, allocation, settings, hostnames, wait_s)
    job = job_environment(spec, assignment, allocation, settings, environ, hostnames)
    python, command = split_command(spec.command, sys.executable)
    # A random start: two jobs relaunched at once on one node, both starting from the job id,
    # walked past the same busy ports to the same free one (seen on 26.05 in the fidelity run:
    # the second job's agents joined the first job's c10d store and died with it).
    try:
        reservation = reserve_port(random.randrange(1 << 30))
    except RunError as exc:
        raise LaunchError(str(exc), EXIT_MISMATCH) from None
    try:
        return _supervise(paths, sia_id, allocation, assignment, environ, job, address,
                          reservation.port, python, command, wait_s)  # fmt: skip
    finally:
        reservation.release()


def _supervise(
    paths: StatePaths,
    sia_id: str,
    allocation: SlurmAllocation,
    assignment: Assignment,
    environ: Mapping[str, str],
    job: JobEnvironment,
    address: str,
    port: int,
    python: str,
    command: list[str],
    wait_s: float,
) -> tuple[int, ExitCause, str]:
    """Run ``srun`` and judge how the run ended (:func:`sia_slurm.job.runs.run_end`)."""
    argv = torchrun_argv(allocation, assignment, f"{address}:{port}", command, python)
    logger.info(
        "[round=%d job=%s] %s:%dx%d batch %d = %d x %d x %d, restart %d: %s",
        assignment.round_index,
        sia_id,
        assignment.gpu_type,
        assignment.nodes,
        assignment.gpus,
        assignment.batch_size,
        assignment.gpus,
        assignment.local_bsz,
        assignment.accum_steps + 1,
        allocation.restart_count,
        " ".join(argv),
    )
    child = _Child(argv, worker_environment(environ, job))
    run = (allocation.job_id, allocation.restart_count)
    said_stopped = False

    def say_stopped() -> None:
        """The stop line, once: at the SIGTERM's record or when srun exits."""
        nonlocal said_stopped
        if not said_stopped:
            said_stopped = True
            logger.info("[job=%s] %s; exit %d", sia_id, STOPPED_LINE, EXIT_STOPPED)

    def record_if_stopped() -> None:
        """A run that acknowledged a stop is recorded as stopped as soon as Slurm's SIGTERM
        (the controller's requeue) arrives, not only once srun has exited: Slurm SIGKILLs this
        batch script KillWait after that SIGTERM, and a step slow to end (seen on 26.05 at load
        15: srun "Waiting up to 12 seconds for job step to finish", KillWait 10 s) left the run
        without its record. Written again, the same, when srun exits. The log line goes out
        now too, once: the SIGKILL would take it with it (loaded run 30, 22.05)."""
        if stopped_on_request(paths, sia_id, assignment.round_index, *run):
            record_exit(paths, sia_id, allocation, ExitCause.STOPPED, EXIT_STOPPED, STOPPED)
            say_stopped()

    status = child.wait(on_terminate=record_if_stopped)
    if stopped_on_request(paths, sia_id, assignment.round_index, *run):
        say_stopped()
        return EXIT_STOPPED, ExitCause.STOPPED, STOPPED
    successor = superseded_by(paths, sia_id, *run, job.hostnames)
    if successor is not None:
        message = (
            f"left behind: the assignment of round {successor.round_index} is for Slurm job "
            f"{successor.slurm_job_id} run {successor.slurm_restart_count} on "
            f"{','.join(successor.node_list) or '?'}"
        )
        logger.warning("[job=%s] %s; its workers stopped", sia_id, message)
        await_successor(paths, successor, lambda: bool(child.terminated), wait_s)
        logger.warning("[job=%s] exit %d", sia_id, EXIT_SUPERSEDED)
        return EXIT_SUPERSEDED, ExitCause.SUPERSEDED, message
    if child.terminated:
        return 128 + child.terminated, ExitCause.TERMINATED, f"signal {child.terminated}"
    job_dir = paths.job_dir(sia_id)
    evidence = read_evidence(job_dir, *run)
    if status != EXIT_OK or evidence.training is not None:
        ended = slurm_ended(SubprocessRunner(timeout_s=15), *run, allocation.node_list)
        evidence = replace(evidence, slurm_ended=ended)
    verdict = run_end(status, evidence)
    logger.info("[job=%s] srun exited with status %d; %s: %s (evidence %s)", sia_id, status,
                verdict[1].value, verdict[2], dumps(evidence))  # fmt: skip
    return verdict


def _seconds(environ: Mapping[str, str], field_name: str, default: float) -> float:
    name = env_name(field_name)
    raw = environ.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise LaunchError(f"{name}: expected seconds, got {raw!r}") from None
    if not value > 0:
        raise LaunchError(f"{name}: expected seconds > 0, got {raw!r}")
    return value


def _profile_steps(environ: Mapping[str, str]) -> int:
    """The user's ``SIA_PROFILE_STEPS`` (measured steps per batch of a profiling sweep)."""
    name = env_name("profile_steps")
    raw = environ.get(name)
    if raw is None:
        return DEFAULT_PROFILE_STEPS
    try:
        value = int(raw)
    except ValueError:
        raise LaunchError(f"{name}: expected an integer, got {raw!r}") from None
    if not 1 <= value <= MAX_PROFILE_STEPS:
        raise LaunchError(f"{name}: expected 1..{MAX_PROFILE_STEPS} measured steps, got {raw!r}")
    return value


def _profile_min_s(environ: Mapping[str, str]) -> float:
    """The user's ``SIA_PROFILE_MIN_S`` (seconds each batch of a sweep is timed over, 0..60)."""
    name = env_name("profile_min_s")
    raw = environ.get(name)
    if raw is None:
        return DEFAULT_PROFILE_MIN_S
    try:
        value = float(raw)
    except ValueError:
        raise LaunchError(f"{name}: expected seconds, got {raw!r}") from None
    if not (math.isfinite(value) and 0 <= value <= 60):
        raise LaunchError(f"{name}: expected 0..60 seconds, got {raw!r}")
    return value


def _profile_batch_limits(spec: JobSpec) -> tuple[int, int]:
    """M0 and the largest batch from the job's profile when the spec leaves them at 0."""
    root = default_profiles_dir()
    directory = Path(spec.profile) if spec.profile else root / spec.app
    try:
        profile = load_app_profile(directory, load_gpu_types(root / GPU_TYPES_FILE))
    except (ProfileError, OSError) as exc:
        raise LaunchError(f"spec.json: profile: {exc}") from None
    return (
        spec.init_batch_size or profile.init_batch_size,
        spec.max_batch_size or profile.max_batch_size,
    )


@click.command(context_settings=CONTEXT_SETTINGS)
@click.version_option(__version__, prog_name="sia-launch")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Controller config (default: $SIA_SLURM_CONFIG, then /etc/sia-slurm/sia.yaml).",
)
@click.option("--sia-id", required=True, help="The sia job id (sia-sbatch writes it).")
def cli(config_path: Path | None, sia_id: str) -> None:
    """Run one start of a sia-slurm managed job (the batch script that sia-sbatch writes).

    Checks Slurm's allocation against the controller's assignment, then runs the job's
    training command under torchrun on every node. Exit status: 0 done, 2 bad config or
    protocol file, 3 no assignment for this run after SIA_MISMATCH_WAIT_S (the controller
    normally requeues such a run first), 75 stopped on the controller's request
    (checkpointed; to be requeued), 76 left behind (the job runs in another Slurm run),
    77 aborted (srun exited 0 under a killed trainer: a node failure), else srun's status.
    """
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s sia-launch %(levelname)s %(message)s"
    )
    try:
        settings = load_job_settings(resolve_config_path(config_path))
        status = launch(settings, sia_id, dict(os.environ))
    except ConfigError as exc:
        click.echo(f"sia-launch: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except (LaunchError, ProtocolError) as exc:
        click.echo(f"sia-launch: {exc}", err=True)
        sys.exit(getattr(exc, "status", EXIT_USAGE))
    sys.exit(status)


def main() -> None:
    cli(prog_name="sia-launch")


if __name__ == "__main__":
    main()
