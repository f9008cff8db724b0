"""benchmarks/emulation_check.py: the profile lookup its step-time check compares against."""

from __future__ import annotations

import pytest

from benchmarks.emulation_check import StepCheck, profile_step_time
from sia_slurm.protocol.profile import (
    GPU_TYPES_FILE,
    default_profiles_dir,
    load_app_profile,
    load_gpu_types,
)


def ncf():
    root = default_profiles_dir()
    return load_app_profile(root / "ncf", load_gpu_types(root / GPU_TYPES_FILE))


def test_profile_step_time_is_the_seed_point_or_linear_between_and_none_outside():
    profile = ncf()
    points = sorted((obs.local_bsz, obs.step_time) for obs in profile.seed["rtx"] if obs.gpus == 1)
    (x0, y0), (x1, y1) = points[-2], points[-1]  # 23211 and 32768 on rtx
    assert profile_step_time(profile, "rtx", x1) == pytest.approx(y1)
    middle = (x0 + x1) // 2
    expected = y0 + (y1 - y0) * (middle - x0) / (x1 - x0)
    assert profile_step_time(profile, "rtx", middle) == pytest.approx(expected)
    assert profile_step_time(profile, "rtx", x1 + 1) is None
    assert profile_step_time(profile, "rtx", points[0][0] - 1) is None
    assert profile_step_time(profile, "no-such-type", x1) is None


def test_step_check_error_is_relative_to_the_profile():
    check = StepCheck("j", "ncf", "rtx", 32768, measured_s=0.486, profile_s=0.0203)
    assert check.error == pytest.approx(0.486 / 0.0203 - 1)
