"""The environment ``sia-launch`` gives the training script: names defined once, read once.

``sia-launch`` builds a :class:`JobEnvironment` from the assignment, the spec and Slurm's
variables and exports it with :meth:`JobEnvironment.to_env`; every training process reads it
back with :meth:`JobEnvironment.from_env`. Keeping both directions in one class means a variable
cannot be renamed on one side only. ``docs/protocol.md`` lists the variables for people.

Four knobs may also be set by the user in the job's environment (``sbatch --export``) and
are only defaulted by the launcher: ``SIA_METRICS_INTERVAL_S``, ``SIA_LINGER_S``,
``SIA_POLL_INTERVAL_S`` and ``SIA_PROFILE_STEPS``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from itertools import pairwise
from pathlib import Path

PREFIX = "SIA_"
DEFAULT_METRICS_INTERVAL_S = 30.0
DEFAULT_LINGER_S = 600.0
DEFAULT_POLL_INTERVAL_S = 1.0
DEFAULT_PROFILE_STEPS = 3
DEFAULT_PROFILE_MIN_S = 0.25
MAX_PROFILE_STEPS = 100


class JobEnvironmentError(ValueError):
    """A ``SIA_*`` variable is missing or malformed (the message names the variable)."""


@dataclass(frozen=True)
class JobEnvironment:
    """What a training process needs to know about its job, its assignment and the protocol.

    ``launch_round`` is the ``round_index`` of the assignment this run started with: a stop
    request applies to this run only if its round is later (``docs/protocol.md``, "Stop").
    ``batch_size``/``local_bsz``/``accum_steps`` are the assignment's batch at launch; a
    running job may adopt a new batch later (rebatch) without a new environment.
    ``slurm_job_id``, ``restarts`` and ``node_list`` (the run's hostnames, comma-separated)
    name the Slurm run the process trains in (:meth:`hostnames`).
    ``profile_sweep`` (the assignment's, comma-separated) makes the run a profiling run
    (``docs/profiling.md``): :attr:`sweep` is its increasing per-GPU batches, each trained
    for one warm-up and ``profile_steps`` measured steps, and at least ``profile_min_s``
    seconds of them (more steps where steps are short: a few milliseconds each are noise).
    """

    sia_id: str
    state_dir: Path
    checkpoint_dir: Path
    app: str
    gpu_type: str
    profile_gpu_type: str
    nodes: int
    gpus: int
    batch_size: int
    local_bsz: int
    accum_steps: int
    init_batch_size: int
    max_batch_size: int
    launch_round: int
    restarts: int = 0
    slurm_job_id: str = ""
    node_list: str = ""
    profile: str = ""
    metrics_interval_s: float = DEFAULT_METRICS_INTERVAL_S
    linger_s: float = DEFAULT_LINGER_S
    poll_interval_s: float = DEFAULT_POLL_INTERVAL_S
    profile_sweep: str = ""
    profile_steps: int = DEFAULT_PROFILE_STEPS
    profile_min_s: float = DEFAULT_PROFILE_MIN_S

    def __post_init__(self) -> None:
        for name in ("nodes", "gpus", "local_bsz", "init_batch_size", "max_batch_size"):
            if getattr(self, name) < 1:
                raise JobEnvironmentError(
                    f"{env_name(name)}: expected >= 1, got {getattr(self, name)}"
                )
        for name in ("accum_steps", "launch_round", "restarts"):
            if getattr(self, name) < 0:
                raise JobEnvironmentError(
                    f"{env_name(name)}: expected >= 0, got {getattr(self, name)}"
                )
        if self.batch_size != self.gpus * self.local_bsz * (self.accum_steps + 1):
            raise JobEnvironmentError(
                f"{env_name('batch_size')}: {self.batch_size} != gpus*local_bsz*(accum_steps+1) = "
                f"{self.gpus * self.local_bsz * (self.accum_steps + 1)}"
            )
        for name in ("metrics_interval_s", "linger_s", "poll_interval_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise JobEnvironmentError(f"{env_name(name)}: expected seconds > 0, got {value}")
        if not 1 <= self.profile_steps <= MAX_PROFILE_STEPS:
            raise JobEnvironmentError(
                f"{env_name('profile_steps')}: expected 1..{MAX_PROFILE_STEPS} measured steps, "
                f"got {self.profile_steps}"
            )
        if not (math.isfinite(self.profile_min_s) and 0 <= self.profile_min_s <= 60):
            raise JobEnvironmentError(
                f"{env_name('profile_min_s')}: expected 0..60 seconds, got {self.profile_min_s}"
            )
        parse_sweep(self.profile_sweep)  # fails here, naming the variable, not mid-training

    @property
    def sweep(self) -> tuple[int, ...]:
        """The profiling sweep's per-GPU batches, increasing (empty: not a profiling run)."""
        return parse_sweep(self.profile_sweep)

    @property
    def hostnames(self) -> tuple[str, ...]:
        """The run's nodes, one name each (empty for a standalone run)."""
        return tuple(name for name in self.node_list.split(",") if name)

    def to_env(self) -> dict[str, str]:
        """The ``SIA_*`` variables for the training processes."""
        return {env_name(f.name): str(getattr(self, f.name)) for f in fields(self)}

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> JobEnvironment:
        """Read the variables ``sia-launch`` exported; a clear error names a bad one."""
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for spec in fields(cls):
            name = env_name(spec.name)
            raw = environ.get(name)
            if raw is None:
                if spec.default is not MISSING:
                    continue
                raise JobEnvironmentError(
                    f"{name}: not set; run the training command under sia-launch (a job "
                    "submitted with sia-sbatch), or use JobEnvironment.standalone() for a "
                    "local run"
                )
            values[spec.name] = _convert(name, raw, str(spec.type))
        return cls(**values)  # type: ignore[arg-type]

    @classmethod
    def standalone(cls, work_dir: Path, batch_size: int, sia_id: str = "local") -> JobEnvironment:
        """An environment for running a training script by hand (one process, no controller)."""
        return cls(
            sia_id=sia_id,
            state_dir=work_dir / "state",
            checkpoint_dir=work_dir / "checkpoints",
            app="local",
            gpu_type="local",
            profile_gpu_type="local",
            nodes=1,
            gpus=1,
            batch_size=batch_size,
            local_bsz=batch_size,
            accum_steps=0,
            init_batch_size=batch_size,
            max_batch_size=batch_size,
            launch_round=0,
        )


def env_name(field_name: str) -> str:
    """``local_bsz`` -> ``SIA_LOCAL_BSZ``."""
    return PREFIX + field_name.upper()


def parse_sweep(text: str) -> tuple[int, ...]:
    """``"2,4,8"`` -> ``(2, 4, 8)``: integers >= 1, strictly increasing (``""``: none)."""
    name = env_name("profile_sweep")
    if not text.strip():
        return ()
    try:
        batches = tuple(int(item) for item in text.split(","))
    except ValueError:
        raise JobEnvironmentError(
            f"{name}: expected comma-separated integers, got {text!r:.80}"
        ) from None
    if min(batches) < 1 or any(a >= b for a, b in pairwise(batches)):
        raise JobEnvironmentError(
            f"{name}: expected increasing per-GPU batches >= 1, got {text!r:.80}"
        )
    return batches


def _convert(name: str, raw: str, type_name: str) -> object:
    try:
        if type_name == "int":
            return int(raw)
        if type_name == "float":
            return float(raw)
    except ValueError:
        kind = "an integer" if type_name == "int" else "a number"
        raise JobEnvironmentError(f"{name}: expected {kind}, got {raw!r}") from None
    if type_name == "Path":
        return Path(raw)
    return raw
