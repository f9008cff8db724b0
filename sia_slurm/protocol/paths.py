"""Where the protocol's files live under ``state_dir``, and their names (no I/O).

The controller and the job side agree on every path through :class:`StatePaths`; a file name
that carries a Slurm run (an ack, an exit, a refusal) is built and validated here, so a name
from one run never answers another. Every component a user's input reaches (the sia id) is
checked to be one safe file name before it is joined to a path.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sia_slurm.safefiles import ProtocolError

SIA_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


@dataclass(frozen=True)
class StatePaths:
    """Where each protocol file of ``state_dir`` lives (no I/O)."""

    state_dir: Path

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def control_dir(self) -> Path:
        return self.state_dir / "control"

    def job_dir(self, sia_id: str) -> Path:
        """The job's own directory (its user's): spec, acks, metrics, checkpoints."""
        return self.jobs_dir / check_sia_id(sia_id)

    def control(self, sia_id: str) -> Path:
        """The controller's directory for the job: what it decided and remembers."""
        return self.control_dir / check_sia_id(sia_id)

    def spec(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / SPEC_FILE

    def assignment(self, sia_id: str) -> Path:
        return self.control(sia_id) / "assignment.json"

    def stop_request(self, sia_id: str) -> Path:
        return self.control(sia_id) / "stop.json"

    def slurm_record(self, sia_id: str) -> Path:
        return self.control(sia_id) / "slurm.json"

    def batch_copy(self, sia_id: str) -> Path:
        """The controller's private copy of the job's batch script (for a resubmission)."""
        return self.control(sia_id) / "batch-script"

    def ack(self, sia_id: str, round_index: int, slurm_job_id: str, restart_count: int) -> Path:
        return self.job_dir(sia_id) / ack_name(round_index, slurm_job_id, restart_count)

    def metrics(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / METRICS_FILE

    def profile(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / PROFILE_FILE

    def profiled(self, sia_id: str) -> Path:
        return self.job_dir(sia_id) / PROFILED_FILE


SPEC_FILE = "spec.json"
METRICS_FILE = "metrics.json"
PROFILE_FILE = "profile.json"  # a job's own profile (sia_slurm/protocol/profile_json.py)
# What a profiling run measured (the same document format, one entry per GPU type measured so
# far), written by the job's rank 0: docs/profiling.md
PROFILED_FILE = "profiled.json"


def ack_name(round_index: int, slurm_job_id: str, restart_count: int) -> str:
    """The acknowledgement of the stop of ``round_index`` by one Slurm run (job id and
    restart count): ``ack-<round>.<job id>.<restart>``. An ack names the run that wrote it, so
    one left by another run (or from before a reset of the controller's round count) never
    answers a stop of this run."""
    if not slurm_job_id.isdigit() or restart_count < 0 or round_index < 0:
        raise ProtocolError(
            f"ack of round {round_index} by Slurm run {slurm_job_id!r}.{restart_count}: "
            "not a round, job id and count"
        )
    return f"ack-{round_index}.{slurm_job_id}.{restart_count}"


def exit_name(slurm_job_id: str, restart_count: int, kind: str = "exit") -> str:
    """One Slurm run's :class:`RunExit` file: ``exit-<job id>.<restart>.json`` (or ``kind``)."""
    if not slurm_job_id.isdigit() or restart_count < 0:
        raise ProtocolError(f"Slurm run {slurm_job_id!r}.{restart_count}: not a job id and count")
    return f"{kind}-{slurm_job_id}.{restart_count}.json"


def refusal_name(slurm_job_id: str, restart_count: int) -> str:
    """The file name of one Slurm run's :class:`RunRefusal`: ``refusal-<job>.<restart>.json``."""
    return exit_name(slurm_job_id, restart_count, "refusal")


def check_sia_id(sia_id: str) -> str:
    """``sia_id`` if it is a safe file name (letters, digits, ``_.-``; at most 64), else raise."""
    if not isinstance(sia_id, str) or not SIA_ID.fullmatch(sia_id):
        raise ProtocolError(
            f"sia job id: expected 1-64 letters, digits, '_', '.' or '-' (not starting with "
            f"a punctuation mark), got {sia_id!r}"
        )
    return sia_id
