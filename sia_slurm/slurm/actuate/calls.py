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
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from sia_slurm.slurm import commands
from sia_slurm.slurm.runner import CommandError, CommandResult, CommandRunner
from sia_slurm.slurm.slurm_conf import SlurmSettings, parse_settings

logger = logging.getLogger(__name__)

Outcome = TypeVar("Outcome")

# Slurm 24.11 and 26.05 without accounting storage refuse an `scontrol update` that changes
# Partition= now and then: exit 1, "Resource temporarily unavailable for job J". slurmctld's
# _update_job (src/slurmctld/job_mgr.c, also on Slurm's master) asks _retrieve_new_assoc for
# the job's association in the new partition; without slurmdbd there is none, NULL comes back
# with errno untouched, and the update fails with whatever errno the thread that runs the RPC
# last set. 22.05 never refused one here. Seen with strace on 26.05.5 (2026-11-27): slurmctld's
# connection manager hands each RPC to one of its worker threads, and every worker's errno is
# EAGAIN after it has sent a reply (a non-blocking recvfrom peek) or read munged's answer while
# checking a credential; the update is taken only when the worker that runs it cleared errno on
# the way. The stale errno can be EINTR too ("Interrupted system call", seen on 24.11.5 under
# load). Sites with slurmdbd find the association and are not affected.
STALE_ERRNO_MESSAGES = ("Resource temporarily unavailable", "Interrupted system call")
# Which worker runs an update, and so whether it is taken, is luck, and worse luck under load:
# on 26.05.5 with both cores busy one update sent again every 0.1 s took 10 tries on average
# and up to 35 (40 updates), so 30 tries failed about one update in 25. Identical updates sent
# at once land on different workers: three at once took 1.6 tries on average, 7 at most (25
# updates, with more busy processes than that; two: 2.4; four: 1.6). So after a refusal the
# update goes out as UPDATE_COPIES copies at once; they are idempotent (absolute values, and
# once one copy has moved the job, the others name the partition it is in, which Slurm takes
# without asking for an association). Between tries: 0.1 s, doubling to 1 s (about 27 s over
# 30 tries).
UPDATE_TRIES = 30
UPDATE_PAUSE_S = 0.1
UPDATE_MAX_PAUSE_S = 1.0
UPDATE_COPIES = 3


class SlurmCalls:
    """Runs Slurm commands through ``runner``."""

    def __init__(self, runner: CommandRunner, pause: Callable[[float], None] = time.sleep) -> None:
        self.runner = runner
        self._pause = pause  # between tries of an update refused with a stale errno
        self._settings: SlurmSettings | None = None

    def run(self, argv: list[str]) -> str:
        """Run a command that must succeed (:class:`CommandError` otherwise); its stdout. An
        ``scontrol update`` refused with a stale errno is sent again as
        :func:`send_until_taken` says (see :data:`STALE_ERRNO_MESSAGES`)."""

        def send() -> CommandResult | CommandError:
            try:
                return self.runner.run(argv)
            except CommandError as exc:
                return exc

        def refused(outcome: CommandResult | CommandError) -> bool:
            return isinstance(outcome, CommandError) and refused_for_now(argv, outcome.stderr)

        def pause(attempt: int) -> None:
            logger.info("%s: refused for now, try %d", " ".join(argv), attempt)
            self._pause(update_pause_s(attempt))

        outcome = send_until_taken(send, refused, pause, taken=_succeeded)
        if isinstance(outcome, CommandError):
            raise outcome
        return outcome.stdout

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


def send_until_taken(
    send: Callable[[], Outcome],
    refused: Callable[[Outcome], bool],
    pause: Callable[[int], None],
    taken: Callable[[Outcome], bool],
) -> Outcome:
    """Send an update once; while every outcome is ``refused`` for now, ``pause(attempt)``
    and send :data:`UPDATE_COPIES` copies at once, up to :data:`UPDATE_TRIES` tries. Returns
    an outcome that is not refused (a ``taken`` one first: a copy that succeeded wins over one
    that failed otherwise), or the last refusal. The controller and the tests that send updates
    as other users share it, so both outlast the same refusals."""
    outcome = send()
    for attempt in range(1, UPDATE_TRIES):
        if not refused(outcome):
            return outcome
        pause(attempt)
        with ThreadPoolExecutor(max_workers=UPDATE_COPIES) as pool:
            outcomes = list(pool.map(lambda _: send(), range(UPDATE_COPIES)))
        answered = [o for o in outcomes if not refused(o)]
        outcome = next((o for o in answered if taken(o)), answered[0] if answered else outcomes[-1])
    return outcome


def _succeeded(outcome: CommandResult | CommandError) -> bool:
    return isinstance(outcome, CommandResult)


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
