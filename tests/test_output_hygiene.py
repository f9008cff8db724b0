"""Output hygiene (issue 35 item 5): a user's string reaches no sink with a control character.

A job's app, its messages and Slurm's texts are the users'; here they hold a screen clear, an
OSC 8 hyperlink, a BEL, a CSI in its C1 form, a bidi override and a carriage return plus
newline that would forge a log line. ``status``, ``explain``, ``report``, the log formatters,
the dashboard's files and the Prometheus textfile must each show them escaped. The state is
built directly (store rows, snapshots, records), not through users' JSON files, whose reader
refuses control characters before any sink sees them.
"""

from __future__ import annotations

import dataclasses
import io
import json
import logging
import sys
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from sia_slurm.cli.main import cli
from sia_slurm.cluster import ClusterSnapshot, JobPhase
from sia_slurm.config import load_config
from sia_slurm.protocol import JobSpec
from sia_slurm.report import GpuTypeTotal, JobRow, ReportData, RoundPoint, Segment, render_site
from sia_slurm.service.logs import JsonFormatter, TextFormatter, configure_text_logging, log_event
from sia_slurm.service.prometheus import Metric, render
from sia_slurm.slurm.observe.jobfiles import LOST_SUBMISSION
from sia_slurm.state import Store
from sia_slurm.text import printable, printable_json
from tests.service.fakes import FakeCluster, write_config
from tests.service.test_prometheus import parse

APP = "cifar\x1b[2J\x1b]8;;http://evil\x07click\x1b]8;;\x07\u202e"
MESSAGE = "out of memory\r\nFAKE LOG LINE [round=9 job=x] done\x9b31m"
NOTE = "keeps\x1b[1A its GPUs\u2028again"
BIDI = {*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029}


def assert_clean(text: str) -> None:
    """No control character (Unicode category Cc) or bidi override in ``text``, but the
    newlines the tool itself writes between lines."""
    for number, line in enumerate(text.split("\n"), 1):
        bad = [c for c in line if unicodedata.category(c) == "Cc" or ord(c) in BIDI]
        assert not bad, f"line {number}: raw {bad!r} in {line!r}"


# ----------------------------------------------------------------------------------------------
# printable


@pytest.mark.heavy
def test_printable_escapes_every_control_character_and_bidi_override() -> None:
    for code in range(0x110000):
        char = chr(code)
        if 0xD800 <= code <= 0xDFFF:
            continue
        shown = printable(f"a{char}b")
        if unicodedata.category(char) == "Cc" or code in BIDI:
            assert shown != f"a{char}b" and shown.isprintable(), hex(code)
        else:
            assert shown == f"a{char}b", hex(code)


def test_printable_escapes_read_like_python_literals() -> None:
    assert printable("\x1b[2J") == "\\x1b[2J"
    assert printable("a\r\nb\tc\x7f\x9b\x00") == "a\\r\\nb\\tc\\x7f\\x9b\\x00"
    assert printable("\u202eevil\u2066") == "\\u202eevil\\u2066"
    assert printable("C:\\temp \\x1b") == "C:\\temp \\x1b"  # a backslash is left as it is
    assert printable("plain text, ünïcödé ok") == "plain text, ünïcödé ok"
    assert printable(printable(MESSAGE)) == printable(MESSAGE)
    assert len(printable(MESSAGE + NOTE).splitlines()) == 1


def test_printable_on_several_lines_keeps_newlines_and_tabs_only() -> None:
    assert printable("a\n\tb\r\x1bc", one_line=False) == "a\n\tb\\r\\x1bc"


def test_printable_json_escapes_strings_and_keys_only() -> None:
    doc = {"app": APP, APP: [1, 2.5, None, True, (MESSAGE,)], "n": {"k": NOTE}}
    shown = printable_json(doc)
    assert shown == {
        "app": printable(APP),
        printable(APP): [1, 2.5, None, True, [printable(MESSAGE)]],
        "n": {"k": printable(NOTE)},
    }


# ----------------------------------------------------------------------------------------------
# The CLI: status, explain, report


def invoke(backend: object | None, *args: str) -> Result:
    obj = {} if backend is None else {"backend_factory": backend}
    return CliRunner().invoke(cli, list(args), obj=obj, catch_exceptions=False)


@pytest.fixture
def text_logging() -> Iterator[None]:
    """The escaped plain-text log handler ``sia-slurm`` installs (``main()``) for every command
    but ``controller run``; CliRunner calls ``cli`` and would skip it."""
    handler = configure_text_logging()
    yield
    logging.getLogger("sia_slurm").removeHandler(handler)
    handler.close()


@pytest.fixture
def hostile(tmp_path: Path, text_logging: None) -> tuple[Path, FakeCluster]:
    """Two rounds of a normal cluster, then job train-a's stored app, message and last
    decision note replaced by hostile text (as if a user had written them)."""
    config = write_config(tmp_path)
    cluster = FakeCluster(None)
    cluster.submit(JobSpec("train-a", "cifar10", submit_time=0.0), work=1e7)
    cluster.submit(JobSpec("train-b", "ncf", submit_time=0.0), work=1e7)
    for _ in range(2):
        result = invoke(lambda _c: cluster, "controller", "run", "--once", "--config", str(config))
        assert result.exit_code == 0, result.output
        cluster.advance(60.0)
    with Store.open(load_config(config).db_path) as store:
        (spec,) = store.conn.execute("SELECT spec FROM jobs WHERE sia_id = 'train-a'").fetchone()
        store.conn.execute(
            "UPDATE jobs SET spec = ?, message = ? WHERE sia_id = 'train-a'",
            (json.dumps({**json.loads(spec), "app": APP}), MESSAGE),
        )
        store.conn.execute("UPDATE decisions SET note = ? WHERE sia_id = 'train-a'", (NOTE,))
        store.conn.commit()
    return config, cluster


class Waiting:
    """A backend whose snapshot says train-a is starting, with a hostile Slurm message, and
    holds a hostile lost submission."""

    def __init__(self, cluster: FakeCluster) -> None:
        self.cluster = cluster

    def snapshot(self) -> ClusterSnapshot:
        base = self.cluster.snapshot()
        jobs = tuple(
            dataclasses.replace(j, phase=JobPhase.STARTING, message=MESSAGE)
            if j.sia_id == "train-a"
            else j
            for j in base.jobs
        )
        return dataclasses.replace(base, jobs=jobs, rejected=(f"{LOST_SUBMISSION} {MESSAGE}",))


def waiting(cluster: FakeCluster) -> Callable[[object], Waiting]:
    return lambda _config: Waiting(cluster)


def test_status_text_shows_user_strings_escaped(hostile: tuple[Path, FakeCluster]) -> None:
    config, cluster = hostile
    result = invoke(waiting(cluster), "status", "--config", str(config))
    assert result.exit_code == 0, result.output
    assert_clean(result.output)
    row = next(line for line in result.output.splitlines() if line.startswith("train-a "))
    assert row.split()[3] == printable(APP)  # after the job, its user and account
    assert f"train-a starting: {printable(MESSAGE)}" in result.output.splitlines()
    assert f"{LOST_SUBMISSION} {printable(MESSAGE)}" in result.output.splitlines()
    assert not any(line.startswith("FAKE LOG LINE") for line in result.output.splitlines())
    offline = invoke(None, "status", "--config", str(config), "--offline")
    assert offline.exit_code == 0, offline.output
    assert_clean(offline.output)
    assert printable(APP) in offline.output


def test_status_json_keeps_values_exact_and_escaped_by_json(
    hostile: tuple[Path, FakeCluster],
) -> None:
    config, cluster = hostile
    result = invoke(waiting(cluster), "status", "--config", str(config), "--json")
    assert result.exit_code == 0, result.output
    assert_clean(result.output)
    data = json.loads(result.output)
    job = next(j for j in data["jobs"] if j["sia_id"] == "train-a")
    assert (job["app"], job["message"]) == (APP, MESSAGE)
    assert data["lost_submissions"] == [f"{LOST_SUBMISSION} {MESSAGE}"]


def test_explain_shows_user_strings_escaped(hostile: tuple[Path, FakeCluster]) -> None:
    config, cluster = hostile
    for backend, extra in ((waiting(cluster), ()), (None, ("--offline",))):
        result = invoke(backend, "explain", "train-a", "--config", str(config), *extra)
        assert result.exit_code == 0, result.output
        assert_clean(result.output)
        lines = result.output.splitlines()
        assert any(line.startswith(f"job train-a: app {printable(APP)}, ") for line in lines)
        assert f"Slurm: {printable(MESSAGE)}" in lines
        assert any(line.endswith(f"({printable(NOTE)})") for line in lines), result.output
    unknown = invoke(None, "explain", "nope\x1b[2J", "--config", str(config), "--offline")
    assert unknown.exit_code == 1 and "nope\\x1b[2J: no managed job" in unknown.output
    assert_clean(unknown.output)


def test_report_table_and_site_from_the_database(
    hostile: tuple[Path, FakeCluster], tmp_path: Path
) -> None:
    config, _cluster = hostile
    db = load_config(config).db_path
    out = tmp_path / "site"
    result = invoke(None, "report", "--db", str(db), "--table", "--out", str(out))
    assert result.exit_code == 0, result.output
    assert_clean(result.output)
    row = next(line for line in result.output.splitlines() if line.startswith("train-a "))
    assert row.split()[1] == printable(APP)
    for name in ("data.js", "report.json"):
        assert_clean((out / name).read_text())
    shown = json.loads((out / "report.json").read_text())
    assert next(j for j in shown["jobs"] if j["id"] == "train-a")["app"] == printable(APP)


# ----------------------------------------------------------------------------------------------
# The dashboard, built directly


def test_dashboard_escapes_strings_and_cannot_break_out_of_a_script(tmp_path: Path) -> None:
    breakout = "</script><script>alert(1)</script><!--&amp;"
    data = ReportData(
        title=f"run {breakout}",
        subtitle=MESSAGE,
        gpu_types=(GpuTypeTotal("a100", 8),),
        rounds=(RoundPoint(0, 0.0, {"a100": 2}),),
        jobs=(
            JobRow(
                id="job-1",
                app=APP + breakout,
                state="running",
                submit_time=0.0,
                gpu_type="a100",
                gpus=2,
                segments=(Segment(0.0, 60.0, "a100", 2),),
            ),
        ),
        summary=((f"note {NOTE}", MESSAGE),),
    )
    render_site(data, tmp_path)
    script = (tmp_path / "data.js").read_text()
    assert_clean(script)
    assert "<" not in script and ">" not in script and "&" not in script
    assert script.startswith("window.SIA_REPORT = {") and script.endswith(";\n")
    payload = json.loads(script.removeprefix("window.SIA_REPORT = ").removesuffix(";\n"))
    app = payload["jobs"][0]["app"]  # what the page shows (as text, never as HTML)
    assert app == printable(APP + breakout) and app.startswith("cifar\\x1b[2J\\x1b]8;;")
    assert_clean(app)
    assert payload["summary"] == [{"label": f"note {printable(NOTE)}", "value": printable(MESSAGE)}]
    assert json.loads((tmp_path / "report.json").read_text()) == payload


# ----------------------------------------------------------------------------------------------
# The logs


def record(message: str, **event: object) -> logging.LogRecord:
    rec = logging.LogRecord(
        "sia_slurm.slurm.backend", logging.WARNING, __file__, 1, message, (), None
    )
    rec.sia_event = event  # what log_event attaches
    return rec


def test_json_log_line_is_one_valid_line_with_escaped_strings() -> None:
    line = JsonFormatter().format(
        record(f"[round=3 job=train-a] {APP}: {MESSAGE}", note=NOTE, goodput=float("nan"), n=2)
    )
    assert "\n" not in line
    assert_clean(line)
    payload = json.loads(line)
    assert payload["message"] == f"[round=3 job=train-a] {printable(APP)}: {printable(MESSAGE)}"
    assert (payload["note"], payload["goodput"], payload["n"]) == (printable(NOTE), "nan", 2)
    assert payload["note"] == "keeps\\x1b[1A its GPUs\\u2028again"  # as `jq -r` prints it
    assert_clean(payload["message"])


def test_json_log_exception_keeps_its_lines_but_escapes_the_rest() -> None:
    try:
        raise ValueError(APP)
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, MESSAGE, (), sys.exc_info())
    payload = json.loads(JsonFormatter().format(rec))
    assert payload["exception"].startswith("Traceback") and "\n" in payload["exception"]
    assert printable(APP) in payload["exception"]
    assert_clean(payload["exception"])


def test_text_log_record_is_one_escaped_line() -> None:
    try:
        raise ValueError(MESSAGE)
    except ValueError:
        rec = logging.LogRecord("x", logging.ERROR, __file__, 1, "%s", (APP,), sys.exc_info())
    line = TextFormatter().format(rec)
    assert "\n" not in line and line.startswith(printable(APP) + " | Traceback")
    assert_clean(line)


def test_cli_text_logging_escapes_what_a_backend_warns(text_logging: None) -> None:
    stderr = io.StringIO()
    real, sys.stderr = sys.stderr, stderr  # the handler writes to stderr as it is at the time
    try:
        logging.getLogger("sia_slurm.slurm.backend").warning("job %s: %s", APP, MESSAGE)
        logging.getLogger("sia_slurm.slurm.backend").info("not shown: below WARNING")
    finally:
        sys.stderr = real
    assert stderr.getvalue() == f"job {printable(APP)}: {printable(MESSAGE)}\n"
    assert "\\r\\nFAKE LOG LINE" in stderr.getvalue()


def test_log_event_through_the_json_handler(tmp_path: Path) -> None:
    from sia_slurm.service.logs import configure_logging

    log = tmp_path / "controller.log"
    root = logging.getLogger("sia_slurm")
    level, propagate = root.level, root.propagate
    handler = configure_logging(log)
    try:
        log_event(logging.ERROR, f"[round=1 job=train-a] failed: {MESSAGE}", result_message=MESSAGE)
    finally:
        root.removeHandler(handler)
        handler.close()
        root.setLevel(level)
        root.propagate = propagate
    text = log.read_text()
    assert len(text.splitlines()) == 1
    assert_clean(text)
    assert json.loads(text)["result_message"] == printable(MESSAGE)
    assert_clean(json.loads(text)["message"])


# ----------------------------------------------------------------------------------------------
# Prometheus


def test_prometheus_label_values_are_escaped_and_names_checked() -> None:
    metric = Metric("sia_gpus", "GPUs\x1b[2J per type.", "gauge").add(
        4, gpu_type=APP, state=MESSAGE
    )
    text = render([metric])
    assert_clean(text)
    assert len(text.splitlines()) == 3  # HELP, TYPE, one sample: no forged line
    ((labels, value),) = parse(text)["sia_gpus"]
    assert value == 4.0
    # The format's own newline escape; the CR and ESC made visible, their backslash escaped
    # (the collector accepts no escape but \\, \" and \n).
    assert 'gpu_type="cifar\\\\x1b[2J\\\\x1b]8;;' in labels
    assert 'state="out of memory\\\\r\\nFAKE LOG LINE' in labels
    assert "# HELP sia_gpus GPUs\\\\x1b[2J per type." in text
    with pytest.raises(ValueError, match="not a valid Prometheus metric name"):
        render([Metric("sia_gpus\nfake 1", "help", "gauge")])
    with pytest.raises(ValueError, match="not a valid Prometheus label"):
        render([Metric("sia_gpus", "help", "gauge").add(1, **{"state\n": "x"})])
