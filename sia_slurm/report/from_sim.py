"""The dashboard from a simulation output directory (``sia-slurm simulate --out DIR``).

What comes from where (formats: ``docs/simulator.md``):

* ``summary.json``: the cluster file (GPU types and totals), the round length, each workload's
  file, its JCTs per job and why it stopped early (if it did);
* the workload CSV named there: every job's app and submission time (the first ``jobs_limit``
  rows when the simulation was limited);
* ``rounds-NAME.jsonl``: per round the GPUs held per type, the active jobs, the policy's time,
  and the actions. Each ``start``/``move`` opens a timeline segment on its configuration and
  closes the previous one; a ``stop`` closes it; a job listed in ``finished`` closes it at its
  exact completion (submission + JCT). Restarts are the grants after a job's first, the
  simulator's own definition. The predicted goodput is the last one the round log carries
  (``goodput``, logged by newer simulators; older logs leave it empty). The simulator has no
  measured goodput, so that column stays empty.

Simulated time starts at 0 (the workload's origin), so times are shown as they are.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sia_slurm.report.report_data import GpuTypeTotal, JobRow, ReportData, RoundPoint, Segment
from sia_slurm.report.sources import ReportSourceError, parse_config, summary_pairs
from sia_slurm.sim.clusterfile import ClusterError, load_cluster
from sia_slurm.sim.workload import WorkloadError, load_workload

HOUR = 3600.0


@dataclass
class _JobTrack:
    """What the round log says about one job so far."""

    grants: int = 0
    batch: int = 0
    gpu_type: str = ""
    gpus: int = 0
    goodput: float | None = None
    open: tuple[float, str, int] | None = None  # start, GPU type, GPUs
    segments: list[Segment] = field(default_factory=list)

    def close(self, end: float) -> None:
        if self.open is not None and end > self.open[0]:
            self.segments.append(Segment(self.open[0], end, self.open[1], self.open[2]))
        self.open = None


def report_from_sim(out_dir: Path, *, workload: str | None = None) -> ReportData:
    """Read one workload of the simulation in ``out_dir`` into a :class:`ReportData`.

    ``workload`` is the label of ``rounds-LABEL.jsonl``; it may be left out when the output
    holds one workload only.
    """
    summary_path = Path(out_dir) / "summary.json"
    summary = _read_summary(summary_path)
    label = _pick_workload(summary, summary_path, workload)
    entry = summary["workloads"][label]
    where = f"{summary_path}: workloads.{label}"
    jobs = _workload_jobs(entry, summary.get("jobs_limit"), Path(out_dir), where)
    jct_h = _mapping(_mapping(entry.get("metrics"), f"{where}.metrics").get("jct_h"), where)
    finish = {name: jobs[name][1] + float(h) * HOUR for name, h in jct_h.items() if name in jobs}
    totals = _gpu_totals(summary, summary_path)
    round_s = float(summary.get("round_s", 60.0))
    tracks = {name: _JobTrack() for name in jobs}
    points: list[RoundPoint] = []
    log_path = Path(out_dir) / f"rounds-{label}.jsonl"
    last_time = 0.0
    for number, line in _round_lines(log_path):
        point = _replay_round(line, tracks, finish, totals, f"{log_path}:{number}")
        points.append(point)
        last_time = point.time + round_s
    rows = []
    for name, (app, submit) in jobs.items():
        track = tracks[name]
        end = finish.get(name)
        track.close(end if end is not None else last_time)
        rows.append(
            JobRow(
                id=name,
                app=app,
                state="done" if end is not None else "unfinished",
                submit_time=submit,
                gpu_type=track.gpu_type,
                gpus=track.gpus,
                batch_size=track.batch,
                goodput_predicted=track.goodput,
                restarts=max(track.grants - 1, 0),
                finish_time=end,
                jct_s=None if end is None else end - submit,
                segments=tuple(track.segments),
            )
        )
    stopped = str(entry.get("stopped") or "")
    extra = {"policy": str(summary.get("policy", "?")), "round": f"{round_s:g} s"}
    if stopped:
        extra["stopped early"] = stopped
    return ReportData(
        title=f"sia-slurm simulation: {label} ({summary.get('policy', '?')})",
        subtitle=f"cluster {summary.get('cluster', '?')}, workload {entry.get('file', label)}, "
        f"output {out_dir}",
        gpu_types=tuple(GpuTypeTotal(name, total) for name, total in totals.items()),
        rounds=tuple(points),
        jobs=tuple(rows),
        summary=summary_pairs(rows, points, extra),
    )


# ----------------------------------------------------------------------------------------------
# Inputs


def _read_summary(path: Path) -> dict[str, Any]:
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ReportSourceError(
            f"{path}: not found (is this a `sia-slurm simulate --out` directory?)"
        ) from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ReportSourceError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(summary, dict):
        raise ReportSourceError(f"{path}: expected a JSON object")
    _mapping(summary.get("workloads"), f"{path}: workloads")
    return summary


def _pick_workload(summary: dict[str, Any], path: Path, wanted: str | None) -> str:
    labels = sorted(summary["workloads"])
    if not labels:
        raise ReportSourceError(f"{path}: workloads: empty")
    if wanted is None:
        if len(labels) > 1:
            raise ReportSourceError(
                f"{path}: holds {len(labels)} workloads; pick one with --workload "
                f"({', '.join(labels)})"
            )
        return labels[0]
    if wanted not in labels:
        raise ReportSourceError(
            f"{path}: workloads: no workload {wanted!r} (it has {', '.join(labels)})"
        )
    return wanted


def _workload_jobs(
    entry: Any, jobs_limit: Any, out_dir: Path, where: str
) -> dict[str, tuple[str, float]]:
    """Job name -> (app, submission time) from the workload file the summary names."""
    file = _mapping(entry, where).get("file")
    if not isinstance(file, str) or not file:
        raise ReportSourceError(f"{where}.file: expected the workload file's path, got {file!r}")
    path = Path(file)
    if not path.is_absolute() and not path.exists() and (out_dir / path).exists():
        path = out_dir / path  # written relative to a cwd we do not know: try the output's
    try:
        loaded = load_workload(path)
    except (WorkloadError, OSError) as exc:
        raise ReportSourceError(
            f"{where}.file: {exc} (a relative path is looked up from the current directory, "
            f"then from {out_dir})"
        ) from None
    rows = loaded.jobs[:jobs_limit] if isinstance(jobs_limit, int) else loaded.jobs
    return {job.name: (job.application, job.submit_time) for job in rows}


def _gpu_totals(summary: dict[str, Any], path: Path) -> dict[str, int]:
    file = summary.get("cluster_file")
    if not isinstance(file, str) or not file:
        raise ReportSourceError(f"{path}: cluster_file: expected the cluster file's path")
    try:
        cluster = load_cluster(file)
    except ClusterError as exc:
        raise ReportSourceError(f"{path}: cluster_file: {exc}") from None
    return {t.name: t.gpus for t in cluster.gpu_types}


def _round_lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ReportSourceError(f"{path}: cannot read the round log: {exc.strerror}") from None
    with handle:
        for number, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            try:
                line = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ReportSourceError(f"{path}:{number}: not valid JSON: {exc}") from None
            if not isinstance(line, dict):
                raise ReportSourceError(f"{path}:{number}: expected a JSON object")
            yield number, line


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        raise ReportSourceError(f"{where}: expected a JSON object, got {value!r}")
    return value


def _number(line: Mapping[str, Any], key: str, where: str) -> float:
    value = line.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ReportSourceError(f"{where}: {key}: expected a number, got {value!r}")
    return float(value)


# ----------------------------------------------------------------------------------------------
# Replaying the round log


def _replay_round(
    line: Mapping[str, Any],
    tracks: dict[str, _JobTrack],
    finish: Mapping[str, float],
    totals: Mapping[str, int],
    where: str,
) -> RoundPoint:
    time = _number(line, "time", where)
    actions = line.get("actions", [])
    if not isinstance(actions, list):
        raise ReportSourceError(f"{where}: actions: expected a list, got {actions!r}")
    for action in actions:
        _apply_action(_mapping(action, f"{where}: actions[]"), tracks, time, where)
    for name, goodput in _mapping(line.get("goodput", {}), f"{where}: goodput").items():
        if name in tracks:
            tracks[name].goodput = float(goodput)
    running = sum(1 for t in tracks.values() if t.open is not None)  # after the actions
    finished = line.get("finished", [])
    for name in finished if isinstance(finished, list) else []:
        if name in tracks:
            tracks[name].close(finish.get(name, time))
    held = {t: int(n) for t, n in _mapping(line.get("gpus", {}), f"{where}: gpus").items()}
    timings = _mapping(line.get("timings_ms", {}), f"{where}: timings_ms")
    contention = int(_number(line, "contention", where))
    return RoundPoint(
        index=int(_number(line, "round", where)),
        time=time,
        allocated={t: held.get(t, 0) for t in totals},
        usable=dict(totals),
        solve_ms=float(timings["policy"]) if "policy" in timings else None,
        running=min(running, contention),
        pending=max(contention - running, 0),
    )


def _apply_action(
    action: Mapping[str, Any], tracks: dict[str, _JobTrack], time: float, where: str
) -> None:
    kind, name = action.get("action"), action.get("job")
    track = tracks.get(str(name))
    if track is None:
        raise ReportSourceError(f"{where}: actions: job {name!r} is not in the workload")
    if kind == "stop":
        track.close(time)
        return
    if kind not in ("start", "move", "rebatch"):
        raise ReportSourceError(
            f"{where}: actions: action: expected start, move, stop or rebatch, got {kind!r}"
        )
    track.batch = int(_number(action, "batch", where))
    if kind == "rebatch":
        return
    config = parse_config(str(action.get("config", "")))
    if config is None:
        raise ReportSourceError(f"{where}: actions: config: a {kind} needs a configuration")
    track.close(time)
    track.grants += 1
    track.gpu_type, track.gpus = config[0], config[2]
    track.open = (time, config[0], config[2])
