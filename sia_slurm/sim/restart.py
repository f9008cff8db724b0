"""What a restart costs each app: the delay the simulator charges, and the one policies assume.

Every time a job's allocation changes it checkpoints, is requeued and restarts, losing this much
time (reference section 6). The artifact's policy was told a smaller cost than the simulator
charged for two apps (cifar10 30 s vs 50 s, yolov3 45 s vs 80 s); both numbers are kept so the
simulator can reproduce the paper and a policy can be given either. Apps not in the table cost
:data:`DEFAULT_RESTART` (30 s, known to the policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True)
class RestartDelay:
    """Seconds lost per restart: ``true_s`` charged by the simulator, ``assumed_s`` by policies."""

    true_s: float
    assumed_s: float

    def __post_init__(self) -> None:
        for name in ("true_s", "assumed_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ValueError(f"{name}: expected a number of seconds >= 0, got {value!r}")


DEFAULT_RESTART = RestartDelay(true_s=30.0, assumed_s=30.0)

RESTART_DELAYS = MappingProxyType(
    {
        "cifar10": RestartDelay(true_s=50.0, assumed_s=30.0),
        "deepspeech2": RestartDelay(true_s=25.0, assumed_s=25.0),
        "bert": RestartDelay(true_s=120.0, assumed_s=120.0),
        "yolov3": RestartDelay(true_s=80.0, assumed_s=45.0),
        "imagenet": RestartDelay(true_s=250.0, assumed_s=250.0),
    }
)


def restart_delay(app: str) -> RestartDelay:
    """The restart delay of ``app``, or :data:`DEFAULT_RESTART` for apps not in the table."""
    return RESTART_DELAYS.get(app, DEFAULT_RESTART)
