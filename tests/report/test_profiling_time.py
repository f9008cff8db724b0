"""How long a job profiled its model (issue 34) reaches the job table and the dashboard: the
database is written as the service writes it, from real rounds of the controller with a
profiler; the job is profiled on two types a minute apart, then scheduled from its profile."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from sia_slurm.cli.report_cmd import format_table  # noqa: E402
from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot, Move, Start  # noqa: E402
from sia_slurm.controller import Controller, EstimatorFactory  # noqa: E402
from sia_slurm.controller.profiling import MemoryProfileBook, Profiler  # noqa: E402
from sia_slurm.policy.registry import make_policy  # noqa: E402
from sia_slurm.protocol import JobSpec  # noqa: E402
from sia_slurm.protocol.profile import load_profiles  # noqa: E402
from sia_slurm.report import report_from_db  # noqa: E402
from sia_slurm.service.summary import record_round  # noqa: E402
from sia_slurm.state import Store  # noqa: E402
from tests.controller.test_profiling import NODES, measured  # noqa: E402

T0 = 1_700_000_000.0


def test_the_job_table_shows_how_long_a_job_profiled(tmp_path: Path) -> None:
    factory = EstimatorFactory(load_profiles(), {"a100": "dgx"})
    controller = Controller(
        make_policy("sia"), factory, profiler=Profiler(MemoryProfileBook(), factory)
    )
    spec = JobSpec("new", "mynet", init_batch_size=32, max_batch_size=256, submit_time=T0)
    known = JobSnapshot(JobSpec("known", "cifar10", submit_time=T0), JobPhase.PENDING)
    job = JobSnapshot(spec, JobPhase.PENDING)
    measured_types: list[str] = []
    path = tmp_path / "sia.db"
    with Store.open(path) as store:
        for index in range(4):
            snapshot = ClusterSnapshot(T0 + 60.0 * index, NODES, (job, known))
            outcome = controller.round(snapshot)
            with store.transaction():
                store.record_jobs(snapshot)
                record_round(store, outcome, snapshot, dry_run=False, wall_time=0.0, timings={})
            for action in outcome.actions:
                if isinstance(action, Start | Move) and action.sia_id == "new":
                    gpu_type = action.config.gpu_type
                    measured_types.append({"a100": "dgx"}.get(gpu_type, gpu_type))
                    job = replace(
                        job, phase=JobPhase.RUNNING, config=action.config,
                        placement=action.placement, batch=action.batch,
                        profiled_document=measured(list(measured_types)),
                    )  # fmt: skip
    rows = {row.id: row for row in report_from_db(path).jobs}
    assert rows["new"].profiling_s == 120.0  # rounds 0 and 1 profiled; round 2 did not
    assert rows["known"].profiling_s is None
    table = format_table(report_from_db(path))
    assert table.splitlines()[0].split()[:5] == ["job", "app", "state", "JCT", "profiling"]
    (line,) = [line for line in table.splitlines() if line.startswith("new ")]
    assert "2.0 min" in line
