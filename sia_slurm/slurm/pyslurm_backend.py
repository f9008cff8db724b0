"""The optional pyslurm backend (``slurm.backend: pyslurm``).

It reads the job queue through the pyslurm binding (one RPC, no ``squeue`` process and no JSON
to parse: the hot path of a round on a large cluster) and otherwise behaves exactly as the
command-line backend: nodes and reservations through ``scontrol``, and every action through the
same verified ``scontrol``/``scancel``/``sbatch`` sequences.

pyslurm is built against one Slurm release (pyslurm X.Y.* needs Slurm X.Y), and none builds
against Slurm 22.05, the release the dev cluster runs; so this module is imported only when the
config asks for it, and a missing or mismatched binding is an error that names the fix
(``slurm.backend: cli``). The conversion from pyslurm's ``Job`` to :class:`SlurmJob` follows
pyslurm's documented ``Job`` attributes (pyslurm 23.2 on) and goes through the same parser as
``squeue --json``.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

from sia_slurm.clock import Clock
from sia_slurm.config import SiaConfig
from sia_slurm.slurm.backend import SlurmBackend
from sia_slurm.slurm.observe.jobs_view import JobsView, build_view
from sia_slurm.slurm.observe.jsonparse import SlurmParseError, parse_job
from sia_slurm.slurm.runner import CommandRunner

_VERSION = re.compile(r"(\d+)\.(\d+)")
Importer = Callable[[str], ModuleType]


class PyslurmUnavailableError(RuntimeError):
    """The pyslurm binding cannot be used here; the message says why and what to do."""


def load_pyslurm(slurm_version: str, importer: Importer = importlib.import_module) -> ModuleType:
    """Import pyslurm and check it was built for this Slurm's major.minor release."""
    fix = "set `slurm.backend: cli` in the config (the command-line backend works everywhere)"
    try:
        module = importer("pyslurm")
    except ImportError as exc:
        raise PyslurmUnavailableError(
            f"slurm.backend is pyslurm, but the pyslurm module cannot be imported ({exc}); "
            f"install a pyslurm built for Slurm {slurm_version}, or {fix}"
        ) from None
    built_for = str(getattr(module, "__version__", ""))
    have, want = _VERSION.search(built_for), _VERSION.search(slurm_version)
    if have is None or want is None or _release(have) != _release(want):
        raise PyslurmUnavailableError(
            f"slurm.backend is pyslurm, but pyslurm {built_for or '(unknown version)'} does not "
            f"match Slurm {slurm_version} (pyslurm X.Y works only with Slurm X.Y); {fix}"
        )
    return module


def _release(match: re.Match[str]) -> tuple[int, int]:
    return int(match[1]), int(match[2])


def slurm_version(runner: CommandRunner) -> str:
    """Slurm's release from ``scontrol --version`` (``slurm 22.05.8`` -> ``22.05.8``)."""
    text = runner.run(["scontrol", "--version"]).stdout.strip()
    return text.split()[-1] if text else ""


class PyslurmBackend(SlurmBackend):
    """:class:`SlurmBackend` whose job queue comes from pyslurm instead of ``squeue``."""

    def __init__(
        self,
        config: SiaConfig,
        runner: CommandRunner,
        clock: Clock | None = None,
        importer: Importer = importlib.import_module,
    ) -> None:
        self.pyslurm = load_pyslurm(slurm_version(runner), importer)
        super().__init__(config, runner, clock)

    def observe_jobs(self) -> JobsView:
        jobs, problems = [], []
        for job in self.pyslurm.Jobs.load().values():
            try:
                jobs.append(parse_job(job_record(job)))
            except (SlurmParseError, KeyError, TypeError, ValueError) as exc:
                problems.append(f"pyslurm job {getattr(job, 'id', '?')}: skipped: {exc}")
        return build_view(self, tuple(jobs), problems)


def job_record(job: Any) -> dict[str, Any]:
    """A pyslurm ``Job`` as the ``squeue --json`` job object :func:`parse_job` reads."""
    layout = job.get_resource_layout_per_node() if job.allocated_nodes else {}
    return {
        "job_id": job.id,
        "name": job.name or "",
        "job_state": job.state,
        "state_reason": job.state_reason or "",
        "comment": job.comment or "",
        "partition": job.partition or "",
        "nodes": job.allocated_nodes or "",
        "node_count": job.num_nodes,
        "tasks": job.ntasks,
        "required_nodes": job.required_nodes or "",
        "restart_cnt": job.requeue_count,
        "priority": job.priority,
        "submit_time": job.submit_time,
        "start_time": job.start_time,
        "eligible_time": job.eligible_time,
        "end_time": job.end_time,
        "user_id": job.user_id,
        "group_id": job.group_id,
        "current_working_directory": job.working_directory or "",
        "standard_output": job.standard_output or "",
        "standard_error": job.standard_error or "",
        "standard_input": job.standard_input or "",
        "time_limit": job.time_limit,
        "account": job.account or "",
        "qos": job.qos or "",
        "tres_per_node": f"gres:gpu:{_gpus(job.gres_per_node)}" if job.gres_per_node else "",
        "gres_detail": [f"gpu:{_gpus(node.get('gres'))}" for node in layout.values()],
    }


def _gpus(gres: Mapping[str, Any] | None) -> int:
    """GPUs in a pyslurm GRES dict (``{"gpu": 4}`` or ``{"gpu:a100": 4}``)."""
    total = 0
    for name, count in (gres or {}).items():
        if str(name).split(":")[0] == "gpu":
            total += int(count if not isinstance(count, Mapping) else count.get("count", 0))
    return total
