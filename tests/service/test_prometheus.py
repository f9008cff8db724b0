"""The Prometheus textfile: valid exposition format, the promised series, atomic replacement."""

from __future__ import annotations

import re
from pathlib import Path

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot
from sia_slurm.config import SiaConfig
from sia_slurm.controller import Controller, EstimatorFactory
from sia_slurm.controller.idle_waits import as_decided
from sia_slurm.core import JobKind, NodeView
from sia_slurm.policy.registry import make_policy
from sia_slurm.protocol import JobSpec
from sia_slurm.protocol.profile import load_profiles
from sia_slurm.service import open_controller, run_round
from sia_slurm.service.prometheus import Metric, RoundMetrics, metrics_of, render, write_textfile
from sia_slurm.state import Store
from tests.service.fakes import FakeCluster

LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
NUMBER = r"[-+]?(\d+(\.\d*)?([eE][-+]?\d+)?|Inf|NaN)"
NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
SAMPLE = re.compile(
    rf"^(?P<name>{NAME})(\{{(?P<labels>{LABEL}(,{LABEL})*)\}})? (?P<value>{NUMBER})$"
)


def parse(text: str) -> dict[str, list[tuple[str, float]]]:
    """Check the 0.0.4 text format strictly; return samples per metric name."""
    assert text.endswith("\n")
    declared: dict[str, str] = {}
    samples: dict[str, list[tuple[str, float]]] = {}
    helped = set()
    for line in text.splitlines():
        if line.startswith("# HELP "):
            name = line.split()[2]
            assert name not in helped, f"HELP twice for {name}"
            helped.add(name)
        elif line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert kind in ("gauge", "counter") and name not in declared and name in helped
            declared[name] = kind
        else:
            match = SAMPLE.match(line)
            assert match, f"not a valid sample line: {line!r}"
            name = match["name"]
            assert name in declared, f"sample of {name} before its TYPE line"
            samples.setdefault(name, []).append((match["labels"] or "", float(match["value"])))
    return samples


def test_round_writes_the_promised_series(
    config: SiaConfig, store: Store, cluster: FakeCluster
) -> None:
    for i in range(3):
        cluster.submit(JobSpec(f"j{i}", "cifar10"))
    controller, _ = open_controller(config, store)
    for _ in range(2):
        run_round(config, cluster, store, controller, False)
        cluster.advance(60.0)
    path = config.state_dir / "metrics" / "sia.prom"
    samples = parse(path.read_text())
    assert samples["sia_round_index"] == [("", 1.0)]
    assert samples["sia_round_seconds"][0][1] > 0
    assert dict(samples["sia_jobs"])['phase="running"'] == 3
    assert 'gpu_type="a100",state="total"' in dict(samples["sia_gpus"])
    assert ('stage="policy"' not in dict(samples["sia_round_stage_seconds"])) and (
        'stage="decide_policy"' in dict(samples["sia_round_stage_seconds"])
    )
    assert samples["sia_solve_seconds"][0][0] == 'status="optimal"'
    totals = dict(samples["sia_actions_total"])
    assert totals['kind="start",result="done"'] == 3
    assert samples["sia_actions_pending"] == [("", 0.0)]
    assert samples["sia_placement_misses"] == [
        ('outcome="unplaced"', 0.0),
        ('outcome="fallback"', 0.0),
    ]
    assert dict(samples["sia_jobs_waiting_beside_free_gpus"])['cause="not_allocated"'] == 0.0
    assert not [p for p in path.parent.iterdir() if p.name != "sia.prom"], "temporary files left"


def test_labels_and_help_are_escaped(tmp_path: Path) -> None:
    metric = Metric("sia_test", "help with \\ and\nnewline", "gauge").add(1.5, job='a"b\\c\nd')
    text = render([metric])
    assert "# HELP sia_test help with \\\\ and\\nnewline" in text
    assert 'sia_test{job="a\\"b\\\\c\\nd"} 1.5' in text
    parse(text)
    path = write_textfile(tmp_path / "metrics", [metric])
    assert path.read_text() == text and oct(path.stat().st_mode & 0o777) == "0o644"


def test_placement_misses_are_counted_by_outcome() -> None:
    """Issue 38's measure, live: allocations placement left unplaced, and those placed at one
    of the policy's fallbacks, in the last round."""
    m = RoundMetrics(
        round_index=3, round_time=0.0, dry_run=False, timings={}, solve_seconds=0.1,
        solve_status="optimal", jobs_by_phase={}, gpus={}, actions_this_round={},
        actions_total={}, pending_actions=0, rejected=0, unplaced=2, placed_at_fallback=1,
    )  # fmt: skip
    samples = parse(render(metrics_of(m)))
    assert samples["sia_placement_misses"] == [
        ('outcome="unplaced"', 2.0),
        ('outcome="fallback"', 1.0),
    ]


def test_jobs_waiting_beside_free_gpus_are_counted_as_the_round_decided() -> None:
    """Issue 38's wait, live: FIFO (no backfill) on two 4-GPU nodes runs a 6-GPU job; a
    4-GPU job behind it does not fit in the 2 GPUs left, and the 1-GPU job behind that waits
    beside them (the policy gave it nothing: ``not_allocated``)."""
    nodes = (NodeView("a-1", "a100", 4, 4), NodeView("a-2", "a100", 4, 4))
    jobs = tuple(
        JobSnapshot(
            JobSpec(name, "cifar10", kind=JobKind.RIGID, requested_gpus=gpus, submit_time=t),
            JobPhase.PENDING,
        )
        for name, gpus, t in (("big", 6, 0.0), ("four", 4, 1.0), ("one", 1, 2.0))
    )
    snapshot = ClusterSnapshot(10.0, nodes, jobs)
    factory = EstimatorFactory(load_profiles(), {"a100": "dgx"})
    outcome = Controller(make_policy("fifo"), factory).round(snapshot)
    assert set(outcome.placement.assignments) == {"big"}
    waits = as_decided(snapshot, outcome)
    assert waits.by_cause() == {"not_allocated": 1} and set(waits.waits) == {"one"}
    m = RoundMetrics(
        round_index=0, round_time=0.0, dry_run=False, timings={}, solve_seconds=0.0,
        solve_status="optimal", jobs_by_phase={}, gpus={}, actions_this_round={},
        actions_total={}, pending_actions=0, rejected=0, waiting_beside_free=waits.by_cause(),
    )  # fmt: skip
    samples = dict(parse(render(metrics_of(m)))["sia_jobs_waiting_beside_free_gpus"])
    assert samples['cause="not_allocated"'] == 1.0 and samples['cause="unplaced"'] == 0.0
