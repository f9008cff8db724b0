"""``sia-sbatch``: submit a training job that the sia-slurm controller manages.

``sia-sbatch [sbatch options] [sia options] -- COMMAND...`` gives the job a sia id, records
what it asks for in ``jobs/<sia_id>/spec.json`` under the controller's state directory,
writes ``jobs/<sia_id>/batch.sh`` (which ``exec``s ``sia-launch``), and submits that with

    --partition=<a partition of a GPU type the job can run on> --nodes=N --ntasks=N
    --gpus-per-node=K  --requeue --open-mode=append --hold --comment=<marker>:<sia_id>

plus the user's own sbatch options, in the order given. GPUs are untyped: the partition
chooses the type, and the controller retargets the job (partition, node count, GPUs per node)
before it releases it. Options that would fight the controller (partition, nodes, tasks, GPUs,
hold, requeue, comment, array, wrap, nodelist) are refused. If ``sbatch`` fails nothing is
left behind. Every usage error exits with status 2 and one line that names the option.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click

import sia_slurm
from sia_slurm import __version__
from sia_slurm.clicommon import CONTEXT_SETTINGS, single_threaded_blas
from sia_slurm.job.settings import (
    ConfigError,
    JobSiteSettings,
    load_job_settings,
    resolve_config_path,
)
from sia_slurm.protocol import (
    MAX_FAILURES,
    JobKind,
    JobSpec,
    ProtocolError,
    StatePaths,
    check_sia_id,
    write_document,
)
from sia_slurm.protocol.profile import (
    GPU_TYPES_FILE,
    AppProfile,
    ProfileError,
    default_profiles_dir,
    load_app_profile,
    load_gpu_types,
    load_profiles,
)
from sia_slurm.protocol.profile_json import profile_to_json
from sia_slurm.safefiles import (
    MAX_FILE_BYTES,
    chmod_dir,
    out_of_bounds,
    write_bytes_atomic,
    write_text_atomic,
)
from sia_slurm.slurm.runner import CommandError, CommandRunner, SubprocessRunner

# As every sia-slurm program: OPENBLAS_NUM_THREADS=1 unless set (sbatch passes it on to the job).
single_threaded_blas()

EXIT_USAGE = 2
EXIT_SUBMIT = 1
BATCH_SCRIPT = "batch.sh"

# sbatch options set by sia-sbatch itself (long name, short letter or "").
_CONTROLLED = (
    ("--partition", "-p"),
    ("--nodes", "-N"),
    ("--ntasks", "-n"),
    ("--ntasks-per-node", ""),
    ("--gpus", "-G"),
    ("--gpus-per-node", ""),
    ("--gpus-per-task", ""),
    ("--gpus-per-socket", ""),
    ("--gres", ""),
    ("--comment", ""),
    ("--hold", "-H"),
    ("--requeue", ""),
    ("--no-requeue", ""),
    ("--open-mode", ""),
    ("--array", "-a"),
    ("--wrap", ""),
    ("--nodelist", "-w"),
)
# sbatch 22.05 options that take no value (or only an optional one, given with '=').
_LONG_FLAGS = frozenset(
    [
        "--contiguous",
        "--exclusive",
        "--get-user-env",
        "--ignore-pbs",
        "--nice",
        "--no-kill",
        "--overcommit",
        "--oversubscribe",
        "--propagate",
        "--quiet",
        "--reboot",
        "--spread-job",
        "--test-only",
        "--usage",
        "--use-min-nodes",
        "--verbose",
        "--version",
        "--wait",
    ]
)
_SHORT_FLAGS = frozenset("kOsQvVW")
_SHAPE_OPTIONS = ("--partition", "--nodes", "--ntasks", "--gpus", "--gpus-per-node")
_GPU_HINT = (
    "the controller chooses GPU type, nodes and GPUs: use --min-gpus, --max-gpus, --num-gpus "
    "or --gpu-type"
)


class UsageError(ValueError):
    """A bad command line, profile or config: reported in one line, exit status 2."""


@dataclass(frozen=True)
class SubmitOptions:
    """The sia options of one submission, as given on the command line."""

    app: str | None
    profile_dir: Path | None
    kind: JobKind
    min_gpus: int
    max_gpus: int | None
    num_gpus: int | None
    gpu_type: str | None
    batch_size: int | None
    max_batch_size: int | None
    restart_cost: float | None
    checkpoint_dir: Path | None
    command: tuple[str, ...]
    max_failures: int = 0


@dataclass(frozen=True)
class Placement:
    """Where the job is submitted: any partition it can run on, and a valid shape there."""

    partition: str
    gpu_type: str
    nodes: int
    gpus_per_node: int


# ------------------------------------------------------------------------------------------------
# Pure steps


def split_command(argv: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """``(options, command)`` split at the first ``--``."""
    if "--" not in argv:
        return list(argv), ()
    cut = list(argv).index("--")
    return list(argv[:cut]), tuple(argv[cut + 1 :])


def check_sbatch_options(args: Sequence[str]) -> None:
    """Refuse options sia-sbatch controls and stray words (a command given without ``--``)."""
    expect_value = False
    for token in args:
        if expect_value:
            expect_value = False
            continue
        if not token.startswith("-") or token == "-":
            raise UsageError(
                f"unexpected argument {token!r}: give the training command after '--', "
                "e.g. sia-sbatch --app cifar10 -- python train.py"
            )
        for long, short in _CONTROLLED:
            if token == long or token.startswith(long + "=") or (short and token[:2] == short):
                hint = _GPU_HINT if long in _SHAPE_OPTIONS else "remove it"
                raise UsageError(f"{token}: sia-sbatch sets {long} itself; {hint}")
        if token.startswith("--"):
            expect_value = "=" not in token and token not in _LONG_FLAGS
        else:
            expect_value = len(token) == 2 and token[1] not in _SHORT_FLAGS


def load_job_profile(options: SubmitOptions) -> tuple[str, AppProfile | None, str | None]:
    """``(app name, profile, spec.profile)`` from ``--app`` and/or ``--profile``; the profile
    is ``None`` for a model the scheduler profiles itself (no ``--profile``, and ``--app``
    absent or naming no shipped profile: docs/profiling.md)."""
    if options.profile_dir is not None:
        root = default_profiles_dir()
        directory = options.profile_dir.absolute()
        if not directory.is_dir():
            raise UsageError(f"--profile {options.profile_dir}: not a directory")
        try:
            profile = load_app_profile(directory, load_gpu_types(root / GPU_TYPES_FILE))
        except ProfileError as exc:
            raise UsageError(f"--profile {options.profile_dir}: {exc}") from None
        return options.app or directory.name, profile, str(directory)
    if not options.app:
        return "", None, None
    try:
        return options.app, load_profiles().app(options.app), None
    except ProfileError:
        return options.app, None, None  # a model of its own: profiled on arrival


def check_profiling(options: SubmitOptions) -> None:
    """What a job the scheduler profiles needs: its M0 (nothing else says what batch its
    learning rate is tuned for) and, profiled for itself alone (no ``--app``), to fit one GPU
    (it is measured on one of each type). An ``--app`` may have a profile measured already
    (the controller keeps them, per account); if not, its job too is profiled on one GPU."""
    if options.batch_size is None:
        known = ", ".join(sorted(load_profiles().apps))
        named = (
            f"--app {options.app}: no shipped profile (known apps: {known}); "
            if options.app
            else ""
        )
        raise UsageError(
            f"{named}--batch-size: required for a model without a profile, which the "
            "scheduler profiles first (docs/profiling.md)"
        )
    if options.min_gpus > 1 and not options.app:
        raise UsageError(
            f"--min-gpus {options.min_gpus}: a model without a profile is profiled on one GPU "
            "of each type; give a profile (--profile DIR) for a job that needs more"
        )


def profile_document(options: SubmitOptions, profile: AppProfile) -> bytes:
    """A ``--profile`` directory as the job's ``profile.json``: the one bounded document the
    controller reads (through the user-file door) instead of the directory itself."""
    text = json.dumps(profile_to_json(profile), indent=1, sort_keys=True) + "\n"
    data = text.encode("utf-8")
    problem = out_of_bounds(json.loads(text))
    if len(data) > MAX_FILE_BYTES or problem:
        points = sum(len(points) for points in profile.seed.values())
        raise UsageError(
            f"--profile {options.profile_dir}: too large for the controller to read "
            f"({len(data)} bytes as profile.json, at most {MAX_FILE_BYTES}; {points} seed "
            f"points){': ' + problem if problem else ''}; keep fewer seed.csv rows"
        )
    return data


def resolve_batch(options: SubmitOptions, profile: AppProfile | None) -> tuple[int, int]:
    """``(M0, max_batch_size)``: the options, defaulting to the profile's (without one, the
    largest batch defaults to M0: no batch is assumed safe for the learning rate)."""
    if profile is None:
        assert options.batch_size is not None  # check_profiling
        init = options.batch_size
        largest = options.max_batch_size or init
    else:
        init = options.batch_size or profile.init_batch_size
        largest = options.max_batch_size or profile.max_batch_size
    if init > largest:
        source = "" if options.max_batch_size or profile is None else f" (profile {profile.name}'s)"
        raise UsageError(f"--batch-size {init} exceeds --max-batch-size {largest}{source}")
    return init, largest


def check_gpu_counts(options: SubmitOptions) -> int:
    """The GPU count to request first (``--num-gpus``, else ``--min-gpus``)."""
    if options.max_gpus is not None and options.min_gpus > options.max_gpus:
        raise UsageError(
            f"--min-gpus {options.min_gpus} is greater than --max-gpus {options.max_gpus}"
        )
    gpus = options.num_gpus or options.min_gpus
    if gpus < options.min_gpus or (options.max_gpus is not None and gpus > options.max_gpus):
        top = options.max_gpus if options.max_gpus is not None else "any"
        raise UsageError(f"--num-gpus {gpus} is outside --min-gpus {options.min_gpus}..{top}")
    return gpus


def type_problems(
    settings: JobSiteSettings,
    profile: AppProfile | None,
    options: SubmitOptions,
    gpus: int,
    init_batch: int,
    max_batch: int,
) -> dict[str, str | None]:
    """For each configured GPU type: ``None`` if the job can run on it, else why not."""
    fixed = options.kind in (JobKind.STRONG_SCALING, JobKind.RIGID, JobKind.PINNED)
    largest = init_batch if fixed else max_batch
    problems: dict[str, str | None] = {}
    for partition in settings.partitions.values():
        key = settings.profile_key(partition.gpu_type)
        per_node = partition.gpus_per_node
        if profile is None:  # profiled first, on one GPU of each type
            problems[partition.gpu_type] = (
                f"{gpus} GPUs do not fill whole nodes of {per_node}"
                if gpus > per_node and gpus % per_node
                else None
            )
            continue
        limit = profile.max_local_bsz.get(key)
        if limit is None:
            problem: str | None = f"profile {profile.name} has no max_local_bsz for {key}"
        elif limit < profile.min_local_bsz:
            problem = f"max_local_bsz {limit} < min_local_bsz {profile.min_local_bsz}"
        elif largest < gpus * profile.min_local_bsz:
            problem = (
                f"batch {largest} gives {gpus} GPUs less than min_local_bsz "
                f"{profile.min_local_bsz} each"
            )
        elif gpus > per_node and gpus % per_node:
            problem = f"{gpus} GPUs do not fill whole nodes of {per_node}"
        else:
            problem = None
        problems[partition.gpu_type] = problem
    return problems


def choose_placement(
    settings: JobSiteSettings, problems: dict[str, str | None], gpu_type: str | None, gpus: int
) -> Placement:
    """The partition to submit to (the requested type, else the first valid one)."""
    if gpu_type is not None:
        if gpu_type not in problems:
            known = ", ".join(problems)
            raise UsageError(f"--gpu-type {gpu_type}: not a GPU type of the config ({known})")
        if problems[gpu_type] is not None:
            raise UsageError(
                f"--gpu-type {gpu_type}: the job cannot run there: {problems[gpu_type]}"
            )
    valid = [name for name, problem in problems.items() if problem is None]
    if not valid:
        reasons = "; ".join(f"{name}: {problem}" for name, problem in problems.items())
        raise UsageError(f"the batch sizes fit no GPU type ({reasons})")
    chosen = gpu_type or valid[0]
    partition = settings.partition_of(chosen)
    per_node = min(gpus, partition.gpus_per_node)
    return Placement(partition.name, chosen, gpus // per_node, per_node)


def new_sia_id() -> str:
    """``s<unix milliseconds>-<4 hex digits>``: unique enough, sortable by submission."""
    return check_sia_id(f"s{time.time_ns() // 1_000_000}-{secrets.token_hex(2)}")


def batch_script(config_path: Path, sia_id: str, app: str) -> str:
    """The batch script: make this checkout importable, then become ``sia-launch``."""
    root = Path(sia_slurm.__file__).resolve().parents[1]
    q = shlex.quote
    return (
        "#!/bin/bash\n"
        f"# Written by sia-sbatch for sia job {sia_id} ({app}); the sia-slurm controller\n"
        "# manages this job and may resubmit this script under a new Slurm job id.\n"
        f"export PYTHONPATH={q(str(root))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"exec {q(sys.executable)} -m sia_slurm.job.launch --config {q(str(config_path))} "
        f"--sia-id {q(sia_id)}\n"
    )


def sbatch_argv(
    user_args: Sequence[str],
    placement: Placement,
    marker: str,
    sia_id: str,
    app: str,
    script: Path,
) -> list[str]:
    named = any(arg.startswith(("--job-name", "-J")) for arg in user_args)
    return [
        "sbatch",
        "--parsable",
        *([] if named else [f"--job-name=sia-{app or 'job'}"]),
        *user_args,
        f"--partition={placement.partition}",
        f"--nodes={placement.nodes}",
        f"--ntasks={placement.nodes}",
        f"--gpus-per-node={placement.gpus_per_node}",
        "--requeue",
        "--open-mode=append",
        "--hold",
        f"--comment={marker}:{sia_id}",
        str(script),
    ]


# ------------------------------------------------------------------------------------------------
# The submission


def submit(
    settings: JobSiteSettings,
    config_path: Path,
    options: SubmitOptions,
    user_args: Sequence[str],
    runner: CommandRunner,
) -> tuple[str, str]:
    """Write the spec and the batch script, run sbatch; ``(sia id, sbatch's stdout)``."""
    if not options.command:
        raise UsageError("missing training command: give it after '--', e.g. -- python train.py")
    check_sbatch_options(user_args)
    gpus = check_gpu_counts(options)
    if options.kind is JobKind.PINNED and options.gpu_type is None:
        raise UsageError("--kind pinned needs --gpu-type (the type it is pinned to)")
    app, profile, profile_field = load_job_profile(options)
    if profile is None:
        check_profiling(options)
    profile_bytes = (
        profile_document(options, profile)
        if profile is not None and profile_field is not None
        else b""
    )
    init_batch, max_batch = resolve_batch(options, profile)
    problems = type_problems(settings, profile, options, gpus, init_batch, max_batch)
    placement = choose_placement(settings, problems, options.gpu_type, gpus)
    sia_id = new_sia_id()
    paths = StatePaths(settings.state_dir)
    checkpoint_dir = options.checkpoint_dir or paths.job_dir(sia_id) / "checkpoints"
    try:
        spec = JobSpec(
            sia_id=sia_id,
            app=app,
            kind=options.kind,
            init_batch_size=init_batch,
            max_batch_size=max_batch,
            min_gpus=options.min_gpus,
            max_gpus=options.max_gpus,
            requested_gpus=gpus,
            requested_gpu_type=options.gpu_type,
            restart_cost=options.restart_cost,
            submit_time=time.time(),
            checkpoint_dir=str(Path(checkpoint_dir).absolute()),
            command=options.command,
            profile=profile_field,
            owner_uid=os.getuid(),
            max_failures=options.max_failures,
        )
    except ProtocolError as exc:
        raise UsageError(str(exc)) from None
    job_dir = paths.job_dir(sia_id)
    if not paths.jobs_dir.is_dir():
        raise UsageError(
            f"{paths.jobs_dir} (state_dir from {config_path}) does not exist: the site's "
            "administrator creates the state tree with `sia-slurm setup`"
        )
    try:
        # Not parents=True: jobs/ is the site's (sticky, made by `sia-slurm setup`), and a
        # directory that already exists (somebody else's) is never reused.
        job_dir.mkdir(mode=0o700)
        chmod_dir(job_dir, 0o755)  # the controller's account reads it, whatever the umask
    except OSError as exc:
        raise UsageError(f"cannot create {job_dir}: {exc.strerror or exc}") from None
    try:
        write_document(paths.spec(sia_id), spec)
        if profile_field is not None:  # the controller reads the copy, never the directory
            write_bytes_atomic(paths.profile(sia_id), profile_bytes)
        script = job_dir / BATCH_SCRIPT
        write_text_atomic(script, batch_script(config_path.absolute(), sia_id, app), mode=0o755)
    except OSError as exc:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise UsageError(f"cannot write into {job_dir}: {exc.strerror or exc}") from None
    argv = sbatch_argv(user_args, placement, settings.managed_marker, sia_id, app, script)
    try:
        result = runner.run(argv)
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    return sia_id, result.stdout


@click.command(
    context_settings={
        **CONTEXT_SETTINGS,
        "ignore_unknown_options": True,
        "allow_extra_args": True,
    }
)
@click.version_option(__version__, prog_name="sia-sbatch")
@click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Controller config (default: $SIA_SLURM_CONFIG, then /etc/sia-slurm/sia.yaml).",
)
@click.option("--app", help="The model's profile in profiles/ (e.g. cifar10).")
@click.option(
    "--profile",
    "profile_dir",
    type=click.Path(path_type=Path),
    help="A profile directory of your own (app.yaml, seed.csv, max_local_bsz.csv).",
)
@click.option(
    "--kind",
    type=click.Choice([k.value for k in JobKind]),
    default=JobKind.ADAPTIVE.value,
    show_default=True,
    help="What the scheduler may change: adaptive (type, GPUs, batch), strong-scaling (type, "
    "GPUs), rigid (type), pinned (nothing).",
)
@click.option("--min-gpus", type=click.IntRange(min=1), default=1, show_default=True)
@click.option("--max-gpus", type=click.IntRange(min=1), help="Default: as the batch allows.")
@click.option(
    "--num-gpus",
    type=click.IntRange(min=1),
    help="GPUs to start with; the count rigid and pinned jobs keep. Default: --min-gpus.",
)
@click.option("--gpu-type", help="GPU type to start on; the type a pinned job keeps.")
@click.option(
    "--batch-size", type=click.IntRange(min=1), help="Initial global batch M0 (profile's)."
)
@click.option(
    "--max-batch-size", type=click.IntRange(min=1), help="Largest global batch (profile's)."
)
@click.option(
    "--restart-cost",
    type=click.FloatRange(min=0),
    help="Seconds a restart costs this job (default: the policy's).",
)
@click.option(
    "--checkpoint-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Where checkpoints go (default: <state_dir>/jobs/<sia_id>/checkpoints).",
)
@click.option(
    "--max-failures",
    type=click.IntRange(min=0, max=MAX_FAILURES),
    default=0,
    show_default=True,
    help="Runs in which the training command may fail (exit non-zero) and the job still be "
    "brought back from its checkpoint. Runs that Slurm ends (a failed node, a refused launch) "
    "are always brought back and do not count.",
)
@click.option("--parsable", is_flag=True, help="Print only the job id, as sbatch --parsable.")
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None, parsable: bool, **values: object) -> None:
    """Submit a training job managed by the sia-slurm controller.

    \b
    sia-sbatch [SBATCH OPTIONS] [SIA OPTIONS] -- COMMAND [ARGS]...
    e.g.  sia-sbatch --app cifar10 --max-gpus 8 -t 2:00:00 -- python train.py

    Other options are passed to sbatch unchanged, except those the controller owns
    (partition, nodes, tasks, GPUs, hold, requeue, comment, array, wrap, nodelist).
    """
    command: tuple[str, ...] = tuple(ctx.obj or ())
    try:
        path = resolve_config_path(config_path)
        settings = load_job_settings(path)
        options = SubmitOptions(
            app=values["app"],  # type: ignore[arg-type]
            profile_dir=values["profile_dir"],  # type: ignore[arg-type]
            kind=JobKind(values["kind"]),
            min_gpus=values["min_gpus"],  # type: ignore[arg-type]
            max_gpus=values["max_gpus"],  # type: ignore[arg-type]
            num_gpus=values["num_gpus"],  # type: ignore[arg-type]
            gpu_type=values["gpu_type"],  # type: ignore[arg-type]
            batch_size=values["batch_size"],  # type: ignore[arg-type]
            max_batch_size=values["max_batch_size"],  # type: ignore[arg-type]
            restart_cost=values["restart_cost"],  # type: ignore[arg-type]
            checkpoint_dir=values["checkpoint_dir"],  # type: ignore[arg-type]
            command=command,
            max_failures=values["max_failures"],  # type: ignore[arg-type]
        )
        sia_id, stdout = submit(settings, path, options, ctx.args, SubprocessRunner())
    except ConfigError as exc:
        click.echo(f"sia-sbatch: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except UsageError as exc:
        click.echo(f"sia-sbatch: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except CommandError as exc:
        click.echo(f"sia-sbatch: submission failed, nothing was submitted: {exc}", err=True)
        sys.exit(EXIT_SUBMIT)
    job_id = stdout.strip().split(";")[0]
    click.echo(job_id if parsable else f"Submitted batch job {job_id}")
    click.echo(f"sia-sbatch: sia job {sia_id}", err=True)


def run(argv: Sequence[str]) -> None:
    """Parse ``argv`` (without the program name): the command after ``--`` never reaches
    click, so none of its words can be mistaken for an option."""
    options, command = split_command(argv)
    cli.main(args=options, obj=command, prog_name="sia-sbatch")


def main() -> None:
    run(sys.argv[1:])


if __name__ == "__main__":
    main()
