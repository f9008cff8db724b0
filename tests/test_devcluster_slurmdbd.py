"""The dev cluster's accounting spec (issue 20): parsing, its errors, the sacctmgr commands and
the slurm.conf/slurmdbd.conf lines (pure; the live test is tests/slurm/test_accounting_live.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from sia_slurm_dev.accounts_spec import (
    DEFAULT_ACCOUNTS,
    AccountingSpec,
    AccountingSpecError,
    sacctmgr_commands,
)
from sia_slurm_dev.chroot import RootPrograms
from sia_slurm_dev.slurmdbd import (
    AccountingLayout,
    find_accounting_programs,
    find_client_library,
    render_slurmdbd_conf,
    slurm_conf_lines,
)

SPEC = """\
accounts:
  physics: {fairshare: 2}
  biology: {fairshare: 1, gpus: 4}
users:
  alice: {accounts: [physics, biology], gpus_per_job: 8}
qos:
  short: {gpus_per_user: 6, gpus_per_job: 4}
"""


def test_spec_becomes_sacctmgr_commands() -> None:
    spec = AccountingSpec.parse(SPEC).with_users(["root", "alice"])
    assert sacctmgr_commands(spec, "siadev") == [
        ["add", "qos", "short", "MaxTRESPerUser=gres/gpu=6", "MaxTRESPerJob=gres/gpu=4"],
        ["add", "account", "physics", "Cluster=siadev", "Fairshare=2"],
        ["add", "account", "biology", "Cluster=siadev", "Fairshare=1", "GrpTRES=gres/gpu=4"],
        [
            "add", "user", "alice", "Account=physics,biology", "DefaultAccount=physics",
            "Cluster=siadev", "Fairshare=1", "QOS=normal,short", "MaxTRESPerJob=gres/gpu=8",
        ],
        [
            "add", "user", "root", "Account=physics", "DefaultAccount=physics",
            "Cluster=siadev", "Fairshare=1", "QOS=normal,short",
        ],
    ]  # fmt: skip


def test_typed_limits_become_typed_tres() -> None:
    spec = AccountingSpec.parse(
        "accounts: {a: {gpus: {a100: 2}}}\nqos: {big: {gpus: 8, gpus_per_job: {a100: 2, t4: 1}}}"
    )
    assert sacctmgr_commands(spec, "siadev")[:2] == [
        ["add", "qos", "big", "GrpTRES=gres/gpu=8", "MaxTRESPerJob=gres/gpu:a100=2,gres/gpu:t4=1"],
        ["add", "account", "a", "Cluster=siadev", "Fairshare=1", "GrpTRES=gres/gpu:a100=2"],
    ]
    spec.check_gpu_types(["a100", "t4"])
    with pytest.raises(AccountingSpecError, match=r"qos\.big: MaxTRESPerJob on GPU type 't4'"):
        spec.check_gpu_types(["a100", "rtx"])
    layout = AccountingLayout(Path("/srv/dev"), 17000, nodes=6)
    lines = slurm_conf_lines(layout, Path("/s"), ("a100", "t4"))
    assert "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:t4" in lines


def test_default_spec_parses() -> None:
    spec = AccountingSpec.parse(DEFAULT_ACCOUNTS)
    assert [a.name for a in spec.accounts] == ["physics", "biology"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("accounts: {}", "accounts: expected at least one account"),
        ("accounts: {a: {gpus: -1}}", "accounts.a.gpus: expected an integer >= 0, got -1"),
        ("accounts: {a: {gpu: 4}}", "accounts.a: unknown key 'gpu'"),
        ("accounts: {a: {gpus: {a100: x}}}", "accounts.a.gpus.a100: expected an integer >= 0"),
        ("accounts: {a: {}}\nusers: {u: {accounts: [b]}}", "users.u.accounts: expected a list"),
        ("accounts: {'a b': {}}", "accounts.a b: expected a name"),
        ("acounts: {}", "unknown key 'acounts'"),
        ("accounts: [a]", "accounts: expected a mapping"),
    ],
)
def test_bad_spec_names_file_and_field(text: str, says: str) -> None:
    with pytest.raises(AccountingSpecError) as caught:
        AccountingSpec.parse(text, "accounts.yaml")
    assert str(caught.value).startswith("accounts.yaml: ") and says in str(caught.value)


def test_conf_lines_name_ports_after_the_slurmd_ports() -> None:
    layout = AccountingLayout(Path("/srv/dev"), 17000, nodes=6)
    assert (layout.mariadb_port, layout.slurmdbd_port) == (17007, 17008)
    lines = slurm_conf_lines(layout, Path("/srv/dev/munge/munge.socket"))
    assert "AccountingStorageType=accounting_storage/slurmdbd" in lines
    assert "AccountingStoragePort=17008" in lines
    assert "AccountingStoreFlags=job_comment" in lines
    assert "AccountingStoragePass=/srv/dev/munge/munge.socket" in lines
    assert "AccountingStorageEnforce=associations,limits,qos" in lines
    conf = render_slurmdbd_conf(layout, "siasvc", Path("/srv/dev/munge/s"), "pw")
    assert "StoragePort=17007\n" in conf and "SlurmUser=siasvc\n" in conf
    assert "StorageHost=127.0.0.1\n" in conf and "StoragePass=pw\n" in conf


def test_a_roots_slurmdbd_and_sacctmgr_run_inside_it_with_the_hosts_client_library(
    tmp_path: Path,
) -> None:
    """MariaDB is the host's; slurmdbd and sacctmgr the root's release, slurmdbd with the
    host's libmariadb.so.3 (the root's Connector/C 3.4 fails slurmdbd's queries)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libmariadb.so.3.0").write_text("")
    (lib / "libmariadb.so.3").symlink_to("libmariadb.so.3.0")
    assert find_client_library([str(tmp_path / "none"), str(lib)]) == lib / "libmariadb.so.3.0"
    assert find_client_library([str(tmp_path / "none")]) is None
    programs = find_accounting_programs(RootPrograms("24.11", Path("/c/root")))
    assert programs.slurmdbd == ["chroot", "/c/root", "/usr/sbin/slurmdbd"]
    assert programs.sacctmgr == ["chroot", "/c/root", "/usr/bin/sacctmgr"]
    assert Path(programs.mariadbd).name == "mariadbd" and programs.client_library is not None
    host = find_accounting_programs(RootPrograms("system", Path("/")))
    assert Path(host.slurmdbd[0]).name == "slurmdbd" and host.client_library is None
