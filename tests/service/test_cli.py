"""The commands through click's CliRunner, with the fake cluster passed in the context object."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sia_slurm.cli.main import cli
from sia_slurm.cluster import JobPhase
from sia_slurm.config import load_config
from sia_slurm.protocol import JobSpec
from sia_slurm.service import ServiceError, service_backend
from sia_slurm.state import Journal, Store
from tests.service.fakes import FakeCluster, write_config


def invoke(cluster: FakeCluster | None, *args: str) -> Result:
    obj = {} if cluster is None else {"backend_factory": lambda _config: cluster}
    return CliRunner().invoke(cli, list(args), obj=obj, catch_exceptions=False)


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, FakeCluster]:
    config = write_config(tmp_path)
    cluster = FakeCluster(tmp_path / "cluster.json")
    cluster.submit(JobSpec("train-a", "cifar10", submit_time=0.0), work=1e7)
    cluster.submit(JobSpec("train-b", "ncf", submit_time=0.0), work=1e7)
    return config, cluster


def rounds(config: Path, cluster: FakeCluster, count: int, *extra: str) -> None:
    for _ in range(count):
        result = invoke(cluster, "controller", "run", "--once", "--config", str(config), *extra)
        assert result.exit_code == 0, result.output
        cluster.advance(60.0)


def test_run_once_runs_a_round(setup: tuple[Path, FakeCluster]) -> None:
    config, cluster = setup
    rounds(config, cluster, 2)
    with Store.open(load_config(config).db_path) as store:
        assert store.last_round().round_index == 1  # type: ignore[union-attr]
        assert {e.state for e in Journal(store).entries()} == {"done"}
    assert all(job.launches >= 1 for job in cluster.jobs.values())


def test_run_once_dry_run_flag_changes_nothing(setup: tuple[Path, FakeCluster]) -> None:
    config, cluster = setup
    rounds(config, cluster, 1, "--dry-run")
    assert all(job.phase == "pending" and job.launches == 0 for job in cluster.jobs.values())


def test_dry_run_from_config(tmp_path: Path) -> None:
    config = write_config(tmp_path, dry_run=True)
    cluster = FakeCluster(tmp_path / "cluster.json")
    cluster.submit(JobSpec("j", "cifar10"))
    rounds(config, cluster, 1)
    assert cluster.jobs["j"].launches == 0 and cluster.apply_calls == 0


def test_status_shows_gpu_types_and_jobs(setup: tuple[Path, FakeCluster]) -> None:
    config, cluster = setup
    rounds(config, cluster, 3)
    result = invoke(cluster, "status", "--config", str(config))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert any(line.split()[:3] == ["a100", "8", "8"] for line in lines), result.output
    job = cluster.jobs["train-a"]
    row = next(line for line in lines if line.startswith("train-a"))
    assert row.split()[1:7] == [
        "-",
        "-",
        "cifar10",
        job.phase,
        str(job.config),
        str(job.config.gpus),
    ]  # type: ignore[union-attr]
    data = json.loads(invoke(cluster, "status", "--config", str(config), "--json").output)
    assert data["live"] and {j["sia_id"] for j in data["jobs"]} == {"train-a", "train-b"}
    allocated = sum(c["allocated"] for c in data["gpu_types"].values())
    assert allocated == sum(j.config.gpus for j in cluster.jobs.values() if j.config)
    # No accounting in the fake cluster, no shares: in the config: said so (issue 20).
    assert "shares: equal shares per user (Slurm has no accounting" in result.output
    assert data["shares"].startswith("shares: equal shares per user")
    offline = invoke(None, "status", "--config", str(config), "--offline").output
    assert "shares: equal shares per user; with Slurm accounting" in offline


def test_status_shows_and_filters_by_user_and_account(tmp_path: Path) -> None:
    """Whose each job is, as Slurm says (store schema 3), live and offline; --user and
    --account keep only theirs (the dashboard's filter bar, for a shell)."""
    config = write_config(tmp_path)
    cluster = FakeCluster(tmp_path / "cluster.json")
    cluster.submit(JobSpec("a-1", "cifar10", submit_time=0.0), 1e7, "alice", "physics")
    cluster.submit(JobSpec("b-1", "ncf", submit_time=0.0), 1e7, "bob", "biology")
    cluster.submit(JobSpec("a-2", "ncf", submit_time=0.0), 1e7, "alice", "biology")
    rounds(config, cluster, 2)
    for offline in ([], ["--offline"]):
        backend = None if offline else cluster
        text = invoke(backend, "status", "--config", str(config), *offline).output
        rows = {line.split()[0]: line.split()[1:3] for line in text.splitlines() if "-" in line[:4]}
        assert rows == {
            "a-1": ["alice", "physics"],
            "b-1": ["bob", "biology"],
            "a-2": ["alice", "biology"],
        }, text
        assert "JOB  USER   ACCOUNT" in text
        for args, expected in (
            (["--user", "alice"], {"a-1", "a-2"}),
            (["--account", "biology"], {"b-1", "a-2"}),
            (["--user", "alice", "--account", "biology"], {"a-2"}),
            (["--user", "carol"], set()),
        ):
            data = json.loads(
                invoke(backend, "status", "--config", str(config), "--json", *offline, *args).output
            )
            assert {j["sia_id"] for j in data["jobs"]} == expected, args
            assert all(j["user"] and j["account"] for j in data["jobs"])


def test_status_and_explain_do_not_repeat_the_backends_warnings(
    setup: tuple[Path, FakeCluster],
) -> None:
    config, cluster = setup
    rounds(config, cluster, 2)

    class Noisy:
        def __init__(self, _config: object) -> None:
            pass

        def snapshot(self):  # type: ignore[no-untyped-def]
            logging.getLogger("sia_slurm.slurm.backend").warning("spool/x.json: no managed job")
            return cluster.snapshot()

    for args in (["status"], ["explain", "train-a"]):
        result = CliRunner().invoke(
            cli, [*args, "--config", str(config)], obj={"backend_factory": Noisy}
        )
        assert result.exit_code == 0, result.output
        assert "no managed job" not in result.output
    assert logging.getLogger("sia_slurm.slurm").level == logging.NOTSET  # restored


def test_status_falls_back_to_the_database(setup: tuple[Path, FakeCluster]) -> None:
    config, cluster = setup
    rounds(config, cluster, 2)

    def broken(_config: object) -> FakeCluster:
        raise ServiceError("slurmctld is down")

    result = CliRunner().invoke(
        cli, ["status", "--config", str(config)], obj={"backend_factory": broken}
    )
    assert result.exit_code == 0, result.output
    assert "no live snapshot (ServiceError: slurmctld is down)" in result.output
    assert "train-a" in result.output and "train-b" in result.output
    offline = invoke(None, "status", "--config", str(config), "--offline")
    assert offline.exit_code == 0 and "train-a" in offline.output


def test_status_before_any_round_says_so(tmp_path: Path) -> None:
    result = invoke(None, "status", "--config", str(write_config(tmp_path)), "--offline")
    assert result.exit_code == 1
    assert "sia.db: no state database (has the controller run yet?)" in result.output


def test_explain_shows_the_goodput_row(setup: tuple[Path, FakeCluster]) -> None:
    config, cluster = setup
    rounds(config, cluster, 3)
    result = invoke(cluster, "explain", "train-a", "--config", str(config))
    assert result.exit_code == 0, result.output
    out = result.output
    assert "restart factor r = " in out and "goodput row" in out and "best per GPU type" in out
    current = str(cluster.jobs["train-a"].config)
    assert any(line.startswith(f"*{current}") for line in out.splitlines()), out
    assert "last decision (round 2)" in out
    offline = invoke(None, "explain", "train-a", "--config", str(config), "--offline")
    assert offline.exit_code == 0 and "goodput row" in offline.output


def test_explain_unknown_job(setup: tuple[Path, FakeCluster]) -> None:
    config, cluster = setup
    rounds(config, cluster, 1)
    result = invoke(cluster, "explain", "nope", "--config", str(config))
    assert result.exit_code == 1
    assert "nope: no managed job" in result.output and "train-a" in result.output


def test_bad_config_names_file_line_and_key(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("state_dir: s\nround_seconds: -5\npartitions: {a100: {gpu_type: a100}}\n")
    for command in (["controller", "run", "--once"], ["status"], ["explain", "x"]):
        result = invoke(None, *command, "--config", str(bad))
        assert result.exit_code == 1
        assert f"{bad}:2: round_seconds: expected a positive number" in result.output
        assert "partitions.a100.gpus_per_node: missing" in result.output


def test_missing_config_file(tmp_path: Path) -> None:
    result = invoke(None, "controller", "run", "--once", "--config", str(tmp_path / "none.yaml"))
    assert result.exit_code == 1 and "none.yaml: file not found" in result.output


def test_backend_comes_from_the_config(tmp_path: Path) -> None:
    from sia_slurm.slurm.backend import SlurmBackend

    path = write_config(tmp_path)
    assert isinstance(service_backend(load_config(path)), SlurmBackend)
    # pyslurm cannot be used here (no binding, no Slurm configured): a clear error, exit 1.
    path.write_text(path.read_text() + "slurm: {backend: pyslurm, bin_dir: /nonexistent}\n")
    with pytest.raises(ServiceError, match=r"sia.yaml: slurm.backend: pyslurm: "):
        service_backend(load_config(path))
    result = invoke(None, "controller", "run", "--once", "--config", str(path))
    assert result.exit_code == 1 and "slurm.backend: pyslurm: " in result.output


def test_unwritable_log_file_is_a_clear_error(
    setup: tuple[Path, FakeCluster], tmp_path: Path
) -> None:
    config, cluster = setup
    (tmp_path / "plain").write_text("a file, not a directory")
    result = invoke(cluster, "controller", "run", "--once", "--config", str(config),
                    "--log-file", str(tmp_path / "plain" / "controller.log"))  # fmt: skip
    assert result.exit_code == 1 and "--log-file: cannot open it" in result.output


def test_status_says_why_a_job_waits(setup: tuple[Path, FakeCluster]) -> None:
    """A released job Slurm has not started yet shows Slurm's reason (issue 18 item 4)."""
    config, cluster = setup
    rounds(config, cluster, 2)
    said = "released with its assignment; Slurm starting it (reason Resources)"

    class Waiting:
        def __init__(self, _config: object) -> None:
            pass

        def snapshot(self):  # type: ignore[no-untyped-def]
            snapshot = cluster.snapshot()
            jobs = tuple(
                dataclasses.replace(j, phase=JobPhase.STARTING, message=said)
                if j.sia_id == "train-a"
                else j
                for j in snapshot.jobs
            )
            return dataclasses.replace(snapshot, jobs=jobs)

    result = CliRunner().invoke(
        cli, ["status", "--config", str(config)], obj={"backend_factory": Waiting}
    )
    assert result.exit_code == 0, result.output
    assert f"train-a starting: {said}" in result.output.splitlines()


def test_status_without_a_slurm_conf_says_how_to_point_at_one(
    setup: tuple[Path, FakeCluster],
) -> None:
    config, cluster = setup
    rounds(config, cluster, 1)

    def unconfigured(_config: object) -> FakeCluster:
        raise ServiceError("scontrol: error: Could not establish a configuration source")

    result = CliRunner().invoke(
        cli, ["status", "--config", str(config)], obj={"backend_factory": unconfigured}
    )
    assert result.exit_code == 0, result.output
    assert "set SLURM_CONF to the cluster's slurm.conf" in result.output


def test_status_and_explain_show_a_quarantined_job_and_why(
    setup: tuple[Path, FakeCluster],
) -> None:
    """A job the round could not model sits it out; status (text, --json, --offline) and
    explain say so with the stage and the reason, and the other jobs run."""
    config, cluster = setup
    cluster.submit(JobSpec("train-c", "nosuchmodel", submit_time=0.0), work=1e7)
    rounds(config, cluster, 1)
    said = "fit: job train-c: a model without a profile is profiled, which needs its initial"
    text = invoke(cluster, "status", "--config", str(config)).output
    (line,) = [line for line in text.splitlines() if line.startswith("train-c quarantined")]
    assert line.startswith(f"train-c quarantined (last round): {said}")
    data = json.loads(invoke(None, "status", "--config", str(config), "--json", "--offline").output)
    assert data["quarantined"]["train-c"].startswith(said)
    explained = invoke(None, "explain", "train-c", "--config", str(config), "--offline").output
    assert "quarantined" in explained and said in explained
    assert all(cluster.jobs[j].launches == 1 for j in ("train-a", "train-b"))


def test_explain_names_why_a_job_the_backend_never_read_is_quarantined(
    setup: tuple[Path, FakeCluster],
) -> None:
    """A job whose spec.json the controller cannot read has no row of its own; explain still
    answers for its id, with the stage and the reason."""
    config, cluster = setup

    class Unreadable:
        def snapshot(self) -> object:
            snap = cluster.snapshot()
            return dataclasses.replace(snap, quarantined={"ghost": "spec.json: app: bad"})

        def __getattr__(self, name: str) -> object:
            return getattr(cluster, name)

    obj = {"backend_factory": lambda _config: Unreadable()}
    result = CliRunner().invoke(
        cli, ["controller", "run", "--once", "--config", str(config)], obj=obj,
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    explained = invoke(None, "explain", "ghost", "--config", str(config), "--offline")
    assert explained.exit_code == 0, explained.output
    assert explained.output == "job ghost: quarantined in round 0: read: spec.json: app: bad\n"
