"""sia-sbatch: every bad argument is one clear line and exit 2; a good one becomes the exact
sbatch command line, a spec and a batch script; a failed submission leaves nothing behind."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

import sia_slurm.job.sbatch
from sia_slurm.core import JobKind
from sia_slurm.job.sbatch import (
    SubmitOptions,
    UsageError,
    check_sbatch_options,
    run,
    submit,
)
from sia_slurm.job.settings import load_job_settings
from sia_slurm.protocol import JobSpec, StatePaths, read_document
from sia_slurm.slurm.runner import CommandError, CommandResult

REPO = Path(__file__).resolve().parents[2]


class FakeRunner:
    def __init__(self, stdout: str = "123\n", fail: bool = False):
        self.calls: list[list[str]] = []
        self.stdout = stdout
        self.fail = fail

    def run(self, argv: Sequence[str], *, check: bool = True) -> CommandResult:
        self.calls.append(list(argv))
        if self.fail:
            raise CommandError(argv, 1, "sbatch: error: Batch job submission failed")
        return CommandResult(tuple(argv), 0, self.stdout, "")


def options(**overrides: object) -> SubmitOptions:
    values: dict[str, object] = {
        "app": "cifar10",
        "profile_dir": None,
        "kind": JobKind.ADAPTIVE,
        "min_gpus": 1,
        "max_gpus": None,
        "num_gpus": None,
        "gpu_type": None,
        "batch_size": None,
        "max_batch_size": None,
        "restart_cost": None,
        "checkpoint_dir": None,
        "command": ("python", "train.py", "--lr", "0.1"),
    }
    values.update(overrides)
    return SubmitOptions(**values)  # type: ignore[arg-type]


def cli_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as caught:
        run(argv)
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return err


def test_submission_writes_spec_and_script_and_runs_the_exact_sbatch(
    config_path: Path, tiny_profile: Path
) -> None:
    settings = load_job_settings(config_path)
    runner = FakeRunner()
    sia_id, stdout = submit(
        settings,
        config_path,
        options(app=None, profile_dir=tiny_profile, num_gpus=8, max_gpus=8, restart_cost=40.0),
        ["-t", "10", "--job-name=mine", "--export=ALL,X=1"],
        runner,
    )
    assert stdout == "123\n"
    paths = StatePaths(settings.state_dir)
    script = paths.job_dir(sia_id) / "batch.sh"
    assert runner.calls == [
        [
            "sbatch",
            "--parsable",
            "-t",
            "10",
            "--job-name=mine",
            "--export=ALL,X=1",
            "--partition=a100",
            "--nodes=2",
            "--ntasks=2",
            "--gpus-per-node=4",
            "--requeue",
            "--open-mode=append",
            "--hold",
            f"--comment=sia-slurm:{sia_id}",
            str(script),
        ]
    ]
    spec = read_document(JobSpec, paths.spec(sia_id))
    assert (spec.app, spec.profile, spec.kind) == ("tiny", str(tiny_profile), JobKind.ADAPTIVE)
    assert (spec.init_batch_size, spec.max_batch_size) == (16, 256)  # the profile's
    assert (spec.requested_gpus, spec.max_gpus, spec.restart_cost) == (8, 8, 40.0)
    assert spec.command == ("python", "train.py", "--lr", "0.1")
    assert spec.owner_uid == os.getuid()
    assert spec.checkpoint_dir == str(paths.job_dir(sia_id) / "checkpoints")
    text = script.read_text()
    assert text.startswith("#!/bin/bash\n")
    # the checkout that holds sia_slurm/ (and the launcher alias), for every python the job runs
    assert f"\nexport PYTHONPATH={shlex.quote(str(REPO))}${{PYTHONPATH:+:$PYTHONPATH}}\n" in text
    assert (
        f"exec {sys.executable} -m sia_slurm.job.launch --config {config_path} --sia-id {sia_id}"
        in text
    )
    assert os.access(script, os.X_OK)
    # The job's directory and files are the user's, with modes set exactly (not by umask).
    mode = stat.S_IMODE
    assert mode(script.stat().st_mode) == 0o755
    assert mode(paths.spec(sia_id).stat().st_mode) == 0o644
    assert paths.job_dir(sia_id).stat().st_uid == os.geteuid()
    assert mode(paths.job_dir(sia_id).stat().st_mode) == 0o755
    files = sorted(p.name for p in paths.job_dir(sia_id).iterdir())
    assert files == ["batch.sh", "profile.json", "spec.json"]  # --profile DIR: its copy
    assert not paths.control(sia_id).exists()  # the controller's, not sia-sbatch's


def test_files_are_written_with_their_modes_whatever_the_umask(config_path: Path) -> None:
    settings = load_job_settings(config_path)
    old = os.umask(0o077)
    try:
        sia_id, _ = submit(settings, config_path, options(), [], FakeRunner())
    finally:
        os.umask(old)
    paths = StatePaths(settings.state_dir)
    assert stat.S_IMODE(paths.job_dir(sia_id).stat().st_mode) == 0o755  # the controller reads it
    assert stat.S_IMODE((paths.job_dir(sia_id) / "batch.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE(paths.spec(sia_id).stat().st_mode) == 0o644


def test_an_existing_job_directory_is_never_reused(
    config_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The id is new, so its directory must be too: one that exists (another user's, made
    in the shared jobs/ first) is refused and left as it is; nothing is submitted."""
    settings = load_job_settings(config_path)
    taken = StatePaths(settings.state_dir).job_dir("s1-abcd")
    taken.mkdir()
    (taken / "spec.json").write_text("theirs")
    monkeypatch.setattr(sia_slurm.job.sbatch, "new_sia_id", lambda: "s1-abcd")
    runner = FakeRunner()
    with pytest.raises(UsageError, match=f"cannot create {taken}: File exists"):
        submit(settings, config_path, options(), [], runner)
    assert runner.calls == []
    assert (taken / "spec.json").read_text() == "theirs"


def test_unnamed_jobs_get_the_app_name_and_pinned_jobs_their_type(
    config_path: Path,
) -> None:
    runner = FakeRunner()
    submit(
        load_job_settings(config_path),
        config_path,
        options(kind=JobKind.PINNED, gpu_type="t4", num_gpus=2),
        [],
        runner,
    )
    argv = runner.calls[0]
    assert "--job-name=sia-cifar10" in argv and "--partition=t4" in argv
    assert "--nodes=1" in argv and "--gpus-per-node=2" in argv


def test_failed_sbatch_leaves_nothing_behind(config_path: Path) -> None:
    settings = load_job_settings(config_path)
    with pytest.raises(CommandError):
        submit(settings, config_path, options(), [], FakeRunner(fail=True))
    assert list((settings.state_dir / "jobs").iterdir()) == []


def test_sbatch_failure_is_reported_with_exit_1(
    config_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An sbatch that refuses the job (a stand-in program first on PATH)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text("#!/bin/sh\necho 'sbatch: error: invalid partition specified' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SystemExit) as caught:
        run(["--config", str(config_path), "--app", "cifar10", "--", "python", "t.py"])
    assert caught.value.code == 1
    err = capsys.readouterr().err
    assert "submission failed, nothing was submitted" in err
    assert "invalid partition specified" in err
    assert list((config_path.parent / "state" / "jobs").iterdir()) == []


def test_max_failures_goes_into_the_spec(
    config_path: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "sbatch"
    fake.write_text("#!/bin/sh\necho 123\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv = ["--config", str(config_path), "--app", "cifar10", "--parsable"]
    with pytest.raises(SystemExit) as caught:
        run([*argv, "--max-failures", "2", "--", "python", "t.py"])
    assert caught.value.code == 0
    assert capsys.readouterr().out.strip() == "123"
    (job_dir,) = (config_path.parent / "state" / "jobs").iterdir()
    assert read_document(JobSpec, job_dir / "spec.json").max_failures == 2
    err = cli_error([*argv, "--max-failures", "101", "--", "python", "t.py"], capsys)
    assert "--max-failures" in err and "0<=x<=100" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--app", "nosuch"], "--app nosuch: no shipped profile (known apps: bert, cifar10"),
        (["--batch-size", "32", "--min-gpus", "2"], "--min-gpus 2: a model without a profile"),
        (
            ["--batch-size", "32", "--min-gpus", "2", "--app", "mynet", "--num-gpus", "6"],
            "6 GPUs do not fill whole nodes of 4",
        ),  # an --app may have a kept profile: allowed
        (
            ["--app", "cifar10", "--min-gpus", "4", "--max-gpus", "2"],
            "--min-gpus 4 is greater than --max-gpus 2",
        ),
        (
            ["--app", "cifar10", "--num-gpus", "16", "--max-gpus", "8"],
            "--num-gpus 16 is outside --min-gpus 1..8",
        ),
        (
            ["--app", "cifar10", "--batch-size", "8192"],
            "--batch-size 8192 exceeds --max-batch-size 4096 (profile cifar10's)",
        ),
        (
            ["--app", "cifar10", "--max-batch-size", "48", "--batch-size", "32", "--min-gpus", "2"],
            "the batch sizes fit no GPU type (a100: batch 48 gives 2 GPUs less than min_local_bsz",
        ),
        (
            ["--app", "cifar10", "--gpu-type", "h100"],
            "--gpu-type h100: not a GPU type of the config (a100, rtx, t4)",
        ),
        (["--app", "cifar10", "--kind", "pinned"], "--kind pinned needs --gpu-type"),
        (["--app", "cifar10", "--num-gpus", "6"], "6 GPUs do not fill whole nodes of 4"),
        ([], "--batch-size: required for a model without a profile, which the scheduler"),
        (["--app", "cifar10", "-p", "t4"], "-p: sia-sbatch sets --partition itself"),
        (["--app", "cifar10", "--gpus-per-node=2"], "sets --gpus-per-node itself; the controller"),
        (["--app", "cifar10", "--hold"], "--hold: sia-sbatch sets --hold itself; remove it"),
        (["--app", "cifar10", "-t", "5", "train.py"], "unexpected argument 'train.py'"),
    ],
)
def test_usage_errors_exit_2_with_one_clear_line(
    config_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    err = cli_error(["--config", str(config_path), *args, "--", "python", "t.py"], capsys)
    assert message in err, err
    assert not (config_path.parent / "state" / "jobs").exists() or not list(
        (config_path.parent / "state" / "jobs").iterdir()
    )


def test_unknown_app_lists_the_known_ones(
    config_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = cli_error(["--config", str(config_path), "--app", "resnet", "--", "t.py"], capsys)
    assert "known apps: bert, cifar10" in err


@pytest.mark.parametrize("app", [None, "mynet"])
def test_a_model_without_a_profile_is_submitted_for_profiling(
    config_path: Path, app: str | None
) -> None:
    """Neither --app of a shipped profile nor --profile: the scheduler profiles it
    (docs/profiling.md); its largest batch defaults to M0, it may start on any type."""
    settings = load_job_settings(config_path)
    runner = FakeRunner()
    sia_id, _ = submit(settings, config_path, options(app=app, batch_size=32), [], runner)
    paths = StatePaths(settings.state_dir)
    spec = read_document(JobSpec, paths.spec(sia_id))
    assert (spec.app, spec.profile) == (app or "", None)
    assert (spec.init_batch_size, spec.max_batch_size) == (32, 32)
    assert not paths.profile(sia_id).exists()
    assert f"--job-name=sia-{app or 'job'}" in runner.calls[0]


def test_missing_command_and_missing_profile_dir(
    config_path: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert "missing training command" in cli_error(
        ["--config", str(config_path), "--app", "cifar10"], capsys
    )
    assert "--profile /nonexistent/p: not a directory" in cli_error(
        ["--config", str(config_path), "--profile", "/nonexistent/p", "--", "t.py"], capsys
    )
    broken = tmp_path / "broken"
    broken.mkdir()
    assert f"--profile {broken}: {broken}/app.yaml: file not found" in cli_error(
        ["--config", str(config_path), "--profile", str(broken), "--", "t.py"], capsys
    )


def test_a_state_dir_without_its_tree_and_a_bad_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """sia-sbatch makes only the job's own directory: jobs/ is the site's (`sia-slurm
    setup`), never made by a user with her own owner and mode."""
    state = tmp_path / "state"
    config = tmp_path / "sia.yaml"
    config.write_text(
        f"state_dir: {state}\npartitions:\n  t4: {{gpu_type: t4, gpus_per_node: 4}}\n"
    )
    for _ in range(2):  # no state dir at all; then one without jobs/
        err = cli_error(["--config", str(config), "--app", "cifar10", "--", "t.py"], capsys)
        assert (
            f"sia-sbatch: {state / 'jobs'} (state_dir from {config}) does not exist: the site's "
            "administrator creates the state tree with `sia-slurm setup`"
        ) in err
        assert not (state / "jobs").exists()
        state.mkdir(exist_ok=True)
    config.write_text("state_dir: /tmp\npartitions: 3\n")
    err = cli_error(["--config", str(config), "--app", "cifar10", "--", "t.py"], capsys)
    assert f"{config}:2: partitions: expected a non-empty mapping" in err


def test_sbatch_option_scan_knows_which_options_take_values() -> None:
    check_sbatch_options(["-t", "5", "-J", "x", "--mem", "4G", "--exclusive", "-v"])
    check_sbatch_options(["--wait", "--signal=B:USR2@60", "-o", "out.txt", "--nice"])
    with pytest.raises(UsageError, match="unexpected argument 'x'"):
        check_sbatch_options(["--exclusive", "x"])
    with pytest.raises(UsageError, match="-N2: sia-sbatch sets --nodes"):
        check_sbatch_options(["-N2"])


def test_a_profile_directory_is_copied_into_the_job_as_one_document(
    config_path: Path, tiny_profile: Path
) -> None:
    """The controller never reads the user's directory (issue 35): sia-sbatch, as the user,
    writes it into the job's directory as profile.json, which the controller reads through
    the user-file door."""
    from sia_slurm.protocol.profile import (
        GPU_TYPES_FILE,
        default_profiles_dir,
        load_app_profile,
        load_gpu_types,
    )
    from sia_slurm.protocol.profile_json import profile_from_json
    from sia_slurm.safefiles import read_json

    settings = load_job_settings(config_path)
    sia_id, _ = submit(
        settings, config_path, options(app=None, profile_dir=tiny_profile), [], FakeRunner()
    )
    paths = StatePaths(settings.state_dir)
    types = load_gpu_types(default_profiles_dir() / GPU_TYPES_FILE)
    copied = profile_from_json(read_json(paths.profile(sia_id)), "profile.json", types)
    assert copied == load_app_profile(tiny_profile, types)
    assert stat.S_IMODE(paths.profile(sia_id).stat().st_mode) == 0o644
    assert read_document(JobSpec, paths.spec(sia_id)).profile == str(tiny_profile)
