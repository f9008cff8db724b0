"""Workload CSVs: the shipped ones load; every bad case fails with its exact message."""

from __future__ import annotations

from pathlib import Path

import pytest

from sia_slurm.sim.workload import WorkloadError, WorkloadJob, load_workload, load_workloads

from .conftest import WORKLOADS_DIR

HEADER = "name,time,application,num_replicas,batch_size\n"
VALID_APPS = "bert, cifar10, deepspeech2, gpt_pmp, imagenet, ncf, yolov3"


def test_shipped_workloads_load() -> None:
    philly = load_workloads(WORKLOADS_DIR / "philly")
    saturn = load_workloads(WORKLOADS_DIR / "saturn")
    assert len(philly) == 8 and len(saturn) == 10
    assert all(len(w) == 160 for w in (*philly, *saturn))
    assert [w.name for w in philly] == [f"workload-{i}" for i in range(1, 9)]
    assert [w.name for w in saturn][:3] == ["workload-1", "workload-10", "workload-2"]  # sorted
    phoebe = load_workloads(WORKLOADS_DIR / "phoebe.csv")
    assert len(phoebe) == 1 and len(phoebe[0]) == 30
    assert phoebe[0].jobs[0] == WorkloadJob("deepspeech2-0", 9.661784, "deepspeech2", 4, 320)


def test_category_column_is_optional(tmp_path: Path) -> None:
    path = tmp_path / "w.csv"
    path.write_text("name,time,application,num_replicas,batch_size,category\na,0,ncf,2,256,xl\n")
    assert load_workload(path).jobs == (WorkloadJob("a", 0.0, "ncf", 2, 256, "xl"),)


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "w.csv"
    path.write_text(text)
    with pytest.raises(WorkloadError) as err:
        load_workload(path)
    return str(err.value).replace(str(path), "w.csv")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            HEADER + "a,0,resnet,2,64\n",
            f"w.csv:2: application: expected one of {VALID_APPS}, got 'resnet'",
        ),
        (
            "name,time,application,batch_size\na,0,ncf,64\n",
            "w.csv:1: header: expected columns name,time,application,num_replicas,batch_size, "
            "missing num_replicas (found name,time,application,batch_size)",
        ),
        (
            HEADER + "a,10,ncf,2,64\nb,5,ncf,2,64\n",
            "w.csv:3: time: expected jobs in order of submission time, got 5 after 10 (line 2)",
        ),
        (HEADER + "a,-1,ncf,2,64\n", "w.csv:2: time: expected a number of seconds >= 0, got '-1'"),
        (HEADER + "a,0,ncf,0,64\n", "w.csv:2: num_replicas: expected a positive integer, got '0'"),
        (HEADER + "a,0,ncf,2,-8\n", "w.csv:2: batch_size: expected a positive integer, got '-8'"),
        (
            HEADER + "a,0,ncf,2.5,8\n",
            "w.csv:2: num_replicas: expected a positive integer, got '2.5'",
        ),
        (
            HEADER + "a,0,ncf,2,64\nb,1,ncf,2,64\na,2,ncf,2,64\n",
            "w.csv:4: name: expected a unique job name, got 'a' again (first on line 2)",
        ),
        (HEADER, "w.csv: expected at least one job, got none"),
        (
            "",
            "w.csv: expected a header line (name,time,application,num_replicas,batch_size), "
            "got an empty file",
        ),
        (
            HEADER + "a,0,ncf,2\n",
            "w.csv:2: row: expected 5 fields "
            "(name,time,application,num_replicas,batch_size), got 4: 'a,0,ncf,2'",
        ),
    ],
)
def test_bad_workloads_fail_with_exact_messages(tmp_path: Path, text: str, message: str) -> None:
    assert _error(tmp_path, text) == message


def test_missing_file_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(WorkloadError, match=r"nope\.csv: file not found"):
        load_workloads(tmp_path / "nope.csv")
    with pytest.raises(WorkloadError) as err:
        load_workloads(tmp_path)
    assert (
        str(err.value) == f"{tmp_path}: expected workload files (*.csv) in the folder, found none"
    )
