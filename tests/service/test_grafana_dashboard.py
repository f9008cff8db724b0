"""etc/grafana/sia-slurm.json asks only for what the Prometheus textfile holds: every metric its
queries name is one the controller writes, with the labels and label values it writes."""

from __future__ import annotations

import json
import re
from pathlib import Path

from sia_slurm.service.prometheus import RoundMetrics, metrics_of
from sia_slurm.state.journal import FAILED

DASHBOARD = Path(__file__).resolve().parents[2] / "etc" / "grafana" / "sia-slurm.json"
SCRAPE_LABELS = {"instance", "job"}  # added by Prometheus, not by the file


def _written() -> dict[str, dict[str, set[str]]]:
    """metric -> label -> the values one round with everything in it writes."""
    round_ = RoundMetrics(
        round_index=3,
        round_time=1.0,
        dry_run=False,
        timings={"snapshot_s": 0.1, "policy_s": 0.2, "apply_s": 0.3, "round_s": 0.7},
        solve_seconds=0.1,
        solve_status="optimal",
        jobs_by_phase={"running": 1},
        gpus={"a100": {"total": 8, "usable": 8, "allocated": 4, "in_use": 4}},
        actions_this_round={("start", "done"): 1},
        actions_total={("start", "done"): 3, ("move", FAILED): 1},
        pending_actions=0,
        rejected=0,
    )
    written: dict[str, dict[str, set[str]]] = {}
    for metric in metrics_of(round_):
        labels = written.setdefault(metric.name, {})
        for sample in metric.samples:
            for key, value in sample.labels.items():
                labels.setdefault(key, set()).add(value)
    return written


def _queries() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (target["expr"], target.get("legendFormat", ""))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


def test_every_query_names_metrics_labels_and_values_the_file_has() -> None:
    written = _written()
    queries = _queries()
    assert len(queries) >= 10
    for expr, legend in queries:
        names = set(re.findall(r"\bsia_[a-z_]+\b", expr))
        assert names, expr
        assert names <= set(written), (expr, names - set(written))
        labels = set().union(*(written[name] for name in names)) | SCRAPE_LABELS
        used = set(re.findall(r"(\w+)\s*=~?\s*\"", expr))
        for group in re.findall(r"by \(([^)]*)\)", expr):
            used |= {label.strip() for label in group.split(",")}
        used |= set(re.findall(r"\{\{(\w+)\}\}", legend))
        assert used <= labels, (expr, used - labels)
        for label, value in re.findall(r"(\w+)=\"([^\"$]+)\"", expr):
            values = set().union(*(written[name].get(label, set()) for name in names))
            assert value in values, (expr, label, value)


def test_the_panels_have_unique_ids_and_do_not_overlap() -> None:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    assert len({panel["id"] for panel in panels}) == len(panels)
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        grid = panel["gridPos"]
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not mine & cells, panel["title"]
        assert grid["x"] + grid["w"] <= 24
        cells |= mine
