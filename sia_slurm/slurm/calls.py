"""``SlurmCalls``: the actuator's thin layer over the command runner.

Three ways to run a Slurm command, each with the failure handling its callers need (must
succeed, may fail for jobs that already ended, batched over jobs with the failing ones found
one by one), and the one cluster setting actuation reads (``cred_expire``). The argv lists
themselves are built in :mod:`sia_slurm.slurm.commands`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from sia_slurm.slurm import commands
from sia_slurm.slurm.runner import CommandError, CommandRunner
from sia_slurm.slurm.settings import SlurmSettings, parse_settings

logger = logging.getLogger(__name__)

# Slurm 24.11 and 26.05 without accounting storage refuse an `scontrol update` that changes
# Partition= now and then: exit 1, "Resource temporarily unavailable for job J". slurmctld's
# _update_job (src/slurmctld/job_mgr.c, also on Slurm's master) asks _retrieve_new_assoc for
# the job's association in the new partition; without slurmdbd there is none, NULL comes back
# with errno untouched, and the update fails with whatever errno the RPC thread last set
# (often EAGAIN, more often under load). 22.05 never refused one here. The same update sent
# again takes once errno happens to be 0: measured on 24.11.5, 40 updates as root took 1-4
# tries; on 26.05.5 beside a busy test session 45 updates (root, SlurmUser, the job's owner)
# took 1 to over 10. The stale errno can be EINTR too ("Interrupted system call", seen on
# 24.11.5 under load). Sites with slurmdbd find the association and are not affected.
STALE_ERRNO_MESSAGES = ("Resource temporarily unavailable", "Interrupted system call")
# Sent again after 0.1 s, doubling up to 1 s: about 27 s in all over 30 tries. A fixed 0.1 s
# (3 s in all) was not enough at load average 15 on 26.05 (all 30 refused, in the test suite
# beside three other sessions): the errno left over is EAGAIN as long as the RPC threads are
# busy, so the tries must outlast a busy spell, not come faster.
UPDATE_TRIES = 30
UPDATE_PAUSE_S = 0.1
UPDATE_MAX_PAUSE_S = 1.0


class SlurmCalls:
    """Runs Slurm commands through ``runner``."""

    def __init__(self, runner: CommandRunner, pause: Callable[[float], None] = time.sleep) -> None:
        self.runner = runner
        self._pause = pause  # between tries of an update refused with EAGAIN
        self._settings: SlurmSettings | None = None

    def run(self, argv: list[str]) -> str:
        """Run a command that must succeed (:class:`CommandError` otherwise); its stdout. An
        ``scontrol update`` refused with a stale errno is sent again after
        :data:`UPDATE_PAUSE_S`, doubling up to :data:`UPDATE_MAX_PAUSE_S`, up to
        :data:`UPDATE_TRIES` times (see :data:`STALE_ERRNO_MESSAGES`)."""
        for attempt in range(1, UPDATE_TRIES + 1):
            try:
                return self.runner.run(argv).stdout
            except CommandError as exc:
                if attempt == UPDATE_TRIES or not refused_for_now(argv, exc.stderr):
                    raise
                logger.info("%s: refused (%s), try %d", " ".join(argv), exc.stderr, attempt)
                self._pause(update_pause_s(attempt))
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


def refused_for_now(argv: Sequence[str], stderr: str) -> bool:
    """Whether Slurm refused an ``scontrol update`` with a stale errno
    (:data:`STALE_ERRNO_MESSAGES`), which the same update sent again may not meet."""
    return list(argv[:2]) == ["scontrol", "update"] and is_stale_errno(stderr)


def update_pause_s(attempt: int) -> float:
    """The pause after the ``attempt``-th (from 1) refusal of an update with a stale errno:
    :data:`UPDATE_PAUSE_S`, doubling up to :data:`UPDATE_MAX_PAUSE_S`. Tests that send
    updates of their own (as another user) wait by the same schedule, so they outlast the
    same busy spells as the controller."""
    return min(UPDATE_PAUSE_S * 2 ** (attempt - 1), UPDATE_MAX_PAUSE_S)


def is_stale_errno(text: str) -> bool:
    """Whether ``text`` (a command's stderr, or a message that quotes it) holds one of
    :data:`STALE_ERRNO_MESSAGES`."""
    return any(message in text for message in STALE_ERRNO_MESSAGES)
