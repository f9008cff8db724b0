"""``SlurmCalls``: the actuator's thin layer over the command runner.

Three ways to run a Slurm command, each with the failure handling its callers need (must
succeed, may fail for jobs that already ended, batched over jobs with the failing ones found
one by one), and the one cluster setting actuation reads (``cred_expire``). The argv lists
themselves are built in :mod:`sia_slurm.slurm.commands`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from sia_slurm.slurm import commands
from sia_slurm.slurm.runner import CommandError, CommandRunner
from sia_slurm.slurm.settings import SlurmSettings, parse_settings

logger = logging.getLogger(__name__)

# Slurm 24.11 and 26.05 without accounting storage refuse an `scontrol update` that sets
# Partition= now and then: exit 1, "Resource temporarily unavailable for job J" (slurmctld's
# _update_job looks up the job's association, finds none, and returns whatever errno its RPC
# thread holds; tests/fixtures/slurm-24.11/README.md). The same update sent again takes:
# measured on 24.11.5, 40 Partition= updates took 1 to 4 tries each (35% refused per try).
# 22.05 never refused one. Sites with slurmdbd have an association and should not see it.
UPDATE_EAGAIN = "Resource temporarily unavailable"
UPDATE_TRIES = 8


class SlurmCalls:
    """Runs Slurm commands through ``runner``."""

    def __init__(self, runner: CommandRunner) -> None:
        self.runner = runner
        self._settings: SlurmSettings | None = None

    def run(self, argv: list[str]) -> str:
        """Run a command that must succeed (:class:`CommandError` otherwise); its stdout. An
        ``scontrol update`` refused with EAGAIN is sent again at once, up to
        :data:`UPDATE_TRIES` times (see :data:`UPDATE_EAGAIN`)."""
        for attempt in range(1, UPDATE_TRIES + 1):
            try:
                return self.runner.run(argv).stdout
            except CommandError as exc:
                if attempt == UPDATE_TRIES or not _refused_for_now(argv, exc):
                    raise
                logger.info("%s: refused (%s), try %d", " ".join(argv), UPDATE_EAGAIN, attempt)
        raise AssertionError("unreachable")

    def run_quiet(self, argv: list[str]) -> None:
        """Run a command whose failure for some jobs is expected (they already ended). Never
        raises: ``scancel`` retries for about 95 s on a job that began completing after it was
        seen running ("Job can not be altered now"), and the runner's timeout ends that."""
        try:
            result = self.runner.run(argv, check=False)
        except CommandError as exc:
            logger.warning("%s", exc)
            return
        if result.returncode != 0:
            logger.info("%s: exit %d: %s", " ".join(argv), result.returncode, result.stderr.strip())

    def batched(
        self, build: Callable[[Sequence[str]], list[str]], job_ids: list[str]
    ) -> dict[str, str]:
        """Run ``build(job_ids)`` once; if it fails, job by job to find which. Returns the
        failures by job id."""
        if not job_ids:
            return {}
        try:
            self.runner.run(build(job_ids))
            return {}
        except CommandError as exc:
            if len(job_ids) == 1:
                return {job_ids[0]: str(exc)}
        failures = {}
        for job_id in job_ids:
            try:
                self.runner.run(build([job_id]))
            except CommandError as exc:
                failures[job_id] = str(exc)
        return failures

    def cred_expire(self) -> int:
        """Slurm's cred_expire (asked once per process: it changes only with slurm.conf)."""
        return self.settings().cred_expire_s

    def settings(self) -> SlurmSettings:
        """``scontrol show config``, read once per process (Slurm's defaults if it fails)."""
        if self._settings is None:
            result = self.runner.run(list(commands.SHOW_CONFIG), check=False)
            self._settings = parse_settings(result.stdout if result.returncode == 0 else "")
        return self._settings


def _refused_for_now(argv: Sequence[str], exc: CommandError) -> bool:
    """Whether Slurm refused an ``scontrol update`` with EAGAIN (:data:`UPDATE_EAGAIN`)."""
    return list(argv[:2]) == ["scontrol", "update"] and UPDATE_EAGAIN in exc.stderr
