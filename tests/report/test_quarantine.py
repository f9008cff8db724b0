"""Quarantined jobs on the dashboard (issue 35, item 2): a job the last recorded round
quarantined shows state ``quarantined`` and the controller's reason, in the report data, in the
rendered ``data.js`` (escaped) and on the page in headless Chromium; a job quarantined only in
an earlier round shows its phase again.

The database is written as the service writes it (``record_jobs`` then ``record_round`` per
round), from the real controller and Sia policy; the cluster is these snapshots, and a policy
wrapper that raises for chosen jobs (the ``allocate`` stage) or the snapshot's ``quarantined``
(the ``read`` stage: the backend could not read the job) makes the quarantines.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # so `tests.*` helpers import however pytest was started
    sys.path.insert(0, str(REPO))

from sia_slurm.cluster import ClusterSnapshot, JobPhase, JobSnapshot, Start  # noqa: E402
from sia_slurm.controller import Controller, EstimatorFactory  # noqa: E402
from sia_slurm.controller.quarantine import QUARANTINED  # noqa: E402
from sia_slurm.policy.base import Allocation, NodeView, Policy, PolicyInput  # noqa: E402
from sia_slurm.policy.registry import make_policy  # noqa: E402
from sia_slurm.protocol import JobSpec  # noqa: E402
from sia_slurm.protocol.profile import load_profiles  # noqa: E402
from sia_slurm.report import JobRow, ReportData, render_site, report_from_db  # noqa: E402
from sia_slurm.service.summary import record_round  # noqa: E402
from sia_slurm.state import Store  # noqa: E402
from tests.report.test_site import run_chromium  # noqa: E402

T0 = 1_700_000_000.0
NODES = (
    NodeView("a100-1", "a100", 4, 4),
    NodeView("a100-2", "a100", 4, 4),
    NodeView("t4-1", "t4", 4, 4),
    NodeView("t4-2", "t4", 4, 4),
)
# What a user's file can make a reason say: a tag that would end a <script>, ESC, a bidi
# override. None of it may reach the page raw.
WHY = "ZeroDivisionError: float division by zero"  # what FailingOn raises
HOSTILE = "spec.json: app: </script><b>x</b> \x1b[2J \u202etxt.exe"


class FailingOn:
    """Sia, raising whenever one of ``failing`` is among the jobs it is asked to allocate
    (what a value in one job's data that breaks the solver does)."""

    def __init__(self) -> None:
        self.inner: Policy = make_policy("sia")
        self.failing: set[str] = set()

    def solve(self, policy_input: PolicyInput) -> Allocation:
        if any(job.job_id in self.failing for job in policy_input.jobs):
            raise ZeroDivisionError(WHY.partition(": ")[2])
        return self.inner.solve(policy_input)


def applied(jobs: dict[str, JobSnapshot], actions: tuple[object, ...]) -> None:
    """What a cluster does with the round's starts: the job runs in that configuration."""
    for action in actions:
        if isinstance(action, Start):
            jobs[action.sia_id] = replace(
                jobs[action.sia_id],
                phase=JobPhase.RUNNING,
                config=action.config,
                placement=action.placement,
                batch=action.batch,
            )


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three rounds, a minute apart.

    Round 0: ``earlier`` is quarantined (allocate) and ``ghost-early`` cannot be read; ``held``
    and ``steady`` start. Rounds 1 and 2 (the last): ``earlier`` is decided again; ``held``,
    running, is quarantined (allocate) and keeps its GPUs; in round 2 ``ghost`` cannot be read
    (it never gets a ``jobs`` row).
    """
    path = tmp_path_factory.mktemp("quarantine") / "sia.db"
    policy = FailingOn()
    controller = Controller(policy, EstimatorFactory(load_profiles(), {"a100": "dgx"}))  # type: ignore[arg-type]
    jobs = {
        sia_id: JobSnapshot(JobSpec(sia_id, app, submit_time=T0), JobPhase.PENDING)
        for sia_id, app in (("steady", "cifar10"), ("held", "bert"), ("earlier", "ncf"))
    }
    rounds = (
        ({"earlier"}, {"ghost-early": "spec.json: cannot read: is a symbolic link"}),
        ({"held"}, {}),
        ({"held"}, {"ghost": HOSTILE}),
    )
    with Store.open(path) as store:
        for index, (failing, unread) in enumerate(rounds):
            policy.failing = failing
            snapshot = ClusterSnapshot(
                T0 + 60.0 * index, NODES, tuple(jobs.values()), quarantined=unread
            )
            outcome = controller.round(snapshot)
            assert set(outcome.quarantined) == failing | set(unread)
            with store.transaction():
                store.record_jobs(snapshot)
                record_round(store, outcome, snapshot, dry_run=False, wall_time=0.0, timings={})
            applied(jobs, outcome.actions)
    assert jobs["held"].phase is JobPhase.RUNNING, "held should have started in round 0"
    return path


def by_id(data: ReportData) -> dict[str, JobRow]:
    return {job.id: job for job in data.jobs}


def test_last_rounds_quarantine_shows_state_and_reason(db: Path) -> None:
    jobs = by_id(report_from_db(db))
    held = jobs["held"]
    assert held.state == QUARANTINED
    assert held.note.startswith("allocate: ") and held.note.endswith(WHY), held.note
    # It sat two rounds out holding its GPUs: the table and the timeline still show them (one
    # segment to the last round, no gap), and the batch and goodput of the round that started it.
    assert held.gpus > 0 and held.gpu_type in ("a100", "t4")
    assert [(s.start, s.end, s.gpus) for s in held.segments] == [(0.0, 120.0, held.gpus)]
    assert held.batch_size > 0 and held.goodput_predicted
    # Never read, so no jobs row: still a job of the cluster that is not being scheduled.
    ghost = jobs["ghost"]
    assert (ghost.app, ghost.state, ghost.note) == ("?", QUARANTINED, f"read: {HOSTILE}")
    assert ghost.submit_time == 120.0 and ghost.gpus == 0 and ghost.segments == ()
    assert list(jobs)[-1] == "ghost"  # after the jobs the database has rows of


def test_an_earlier_quarantine_does_not_count(db: Path) -> None:
    data = report_from_db(db)
    jobs = by_id(data)
    assert "ghost-early" not in jobs  # unread in round 0 only, never recorded
    assert jobs["earlier"].state in ("pending", "running") and jobs["earlier"].note == ""
    assert jobs["steady"].state == "running" and jobs["steady"].note == ""
    assert ("quarantined", "2") in data.summary


def test_reason_reaches_data_js_escaped(db: Path, tmp_path: Path) -> None:
    data = report_from_db(db)
    index = render_site(data, tmp_path / "site")
    script = (index.parent / "data.js").read_text()
    assert f'"note":"{by_id(data)["held"].note}"' in script
    for raw in ("</script>", "<b>", "\x1b", "\u202e"):
        assert raw not in script, raw
    assert "\\\\x1b[2J" in script and "\\\\u202etxt.exe" in script  # printable's escapes
    payload = json.loads(script.removeprefix("window.SIA_REPORT = ").removesuffix(";\n"))
    notes = {job["id"]: job["note"] for job in payload["jobs"]}
    assert notes["held"].startswith("allocate: ") and notes["held"].endswith(WHY)
    assert notes["ghost"] == "read: spec.json: app: </script><b>x</b> \\x1b[2J \\u202etxt.exe"
    assert notes["steady"] == "" and notes["earlier"] == ""


@pytest.mark.heavy
def test_reason_is_visible_on_the_page(db: Path, tmp_path: Path) -> None:
    data = report_from_db(db)
    index = render_site(data, tmp_path / "site")
    result = run_chromium("--dump-dom", index.as_uri())
    assert result.returncode == 0, result.stderr[-2000:]
    dom = result.stdout
    assert 'data-rendered="yes"' in dom
    assert dom.count('class="job-row"') == 4
    assert dom.count('data-state="quarantined"') == 2
    assert ">note</th>" in dom
    assert f'<td class="note">{by_id(data)["held"].note}</td>' in dom
    # As text, never as markup: the tag shows as its characters, ESC and the override escaped.
    shown = "read: spec.json: app: &lt;/script&gt;&lt;b&gt;x&lt;/b&gt; \\x1b[2J \\u202etxt.exe"
    assert f'<td class="note">{shown}</td>' in dom
    assert "<b>x</b>" not in dom
    assert '<td class="note"></td>' in dom  # the others have an empty note
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert console == [], console
