"""Restart delays: what the simulator charges and what the policy assumes."""

from __future__ import annotations

import pytest

from sia_slurm.sim.restart import RestartDelay, restart_delay


@pytest.mark.parametrize(
    ("app", "true_s", "assumed_s"),
    [
        ("cifar10", 50, 30),
        ("deepspeech2", 25, 25),
        ("bert", 120, 120),
        ("yolov3", 80, 45),
        ("imagenet", 250, 250),
        ("ncf", 30, 30),
        ("gpt_pmp", 30, 30),
    ],
)
def test_restart_delays(app: str, true_s: float, assumed_s: float) -> None:
    assert restart_delay(app) == RestartDelay(true_s=true_s, assumed_s=assumed_s)


def test_negative_delay_is_rejected() -> None:
    with pytest.raises(ValueError, match="true_s: expected a number of seconds >= 0, got -1"):
        RestartDelay(true_s=-1, assumed_s=0)
