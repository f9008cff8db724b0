"""What the running Slurm is configured with, as far as the controller cares
(``scontrol show config``): its release, how long it keeps finished jobs, the credential
lifetime.

``sia-slurm config check --live`` prints the release and warns about settings that would hurt:
a release the project has not verified, and a ``MinJobAge`` shorter than a few rounds (a run
that failed while the controller was not looking could no longer be requeued:
``docs/protocol.md``, "When a run fails").
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sia_slurm.slurm.commands import DEFAULT_CRED_EXPIRE_S, parse_cred_expire

# Releases whose behaviour the project verified on real daemons (docs/slurm-actuation.md).
VERIFIED_RELEASES = ("22.05", "24.11", "26.05")
# Slurm's own default MinJobAge (seconds), when the config does not show one.
DEFAULT_MIN_JOB_AGE_S = 300
# A finished job must stay known for at least this many rounds.
MIN_JOB_AGE_ROUNDS = 3


@dataclass(frozen=True)
class SlurmSettings:
    """The parts of ``scontrol show config`` the controller depends on."""

    version: str = ""  # e.g. "22.05.8"; empty when the output names none
    min_job_age_s: int = DEFAULT_MIN_JOB_AGE_S
    cred_expire_s: int = DEFAULT_CRED_EXPIRE_S

    @property
    def release(self) -> str:
        """``major.minor`` of :attr:`version` (``"22.05"``), empty when unknown."""
        match = re.match(r"^(\d+\.\d+)", self.version)
        return match[1] if match else ""

    def warnings(self, round_seconds: float) -> list[str]:
        """What an administrator should change or know, one sentence each."""
        said = []
        if self.release not in VERIFIED_RELEASES:
            verified = ", ".join(VERIFIED_RELEASES)
            said.append(
                f"Slurm {self.version or '(version not shown)'} is not a release sia-slurm has "
                f"verified ({verified}); see docs/slurm-actuation.md"
            )
        if self.min_job_age_s < MIN_JOB_AGE_ROUNDS * round_seconds:
            said.append(
                f"MinJobAge={self.min_job_age_s} s is shorter than {MIN_JOB_AGE_ROUNDS} rounds "
                f"({MIN_JOB_AGE_ROUNDS * round_seconds:g} s): a run that fails while the "
                "controller is not looking may be forgotten by Slurm before it can be requeued"
            )
        return said


def parse_settings(config_text: str) -> SlurmSettings:
    """:class:`SlurmSettings` from ``scontrol show config`` (missing keys: Slurm's defaults)."""
    version = re.search(r"^SLURM_VERSION\s*=\s*(\S+)", config_text, re.MULTILINE)
    age = re.search(r"^MinJobAge\s*=\s*(\d+)", config_text, re.MULTILINE)
    return SlurmSettings(
        version=version[1] if version else "",
        min_job_age_s=int(age[1]) if age else DEFAULT_MIN_JOB_AGE_S,
        cred_expire_s=parse_cred_expire(config_text),
    )
