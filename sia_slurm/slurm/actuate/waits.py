"""Waiting inside a stop: for the jobs' acknowledgements of a stop request, and for requeued
jobs to give their GPUs back (COMPLETING -> PENDING).

Split from :mod:`sia_slurm.slurm.actuate.actuator`, which orders the steps; here is only how
long and on what the actuator waits, on the controller's clock (a fake one in the backend's tests).
Slurm is asked at most every :data:`SLURM_POLL_S` while acknowledgements are awaited and every
:data:`COMPLETING_POLL_S` while jobs complete, and only about the jobs waited on
(``squeue --json --jobs=...``, :func:`query_jobs`): a whole ``squeue`` of a 10,000-job cluster
takes about 0.7 s of CPU, which a poll every 0.5 s would spend over and over. The whole view
(``observe``) is asked for only when jobs became PENDING and the actuator goes on with them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sia_slurm.clock import Clock
from sia_slurm.cluster import Move, Stop
from sia_slurm.protocol import ProtocolError, StatePaths, StopRequest, ack_name, read_document
from sia_slurm.slurm import commands
from sia_slurm.slurm.observe.jobs_view import JobsView
from sia_slurm.slurm.observe.jsonparse import SlurmJob, parse_squeue_json
from sia_slurm.slurm.runner import CommandError, CommandRunner
from sia_slurm.userfiles import JobDirectory

logger = logging.getLogger(__name__)

ACK_POLL_S = 0.25  # how often the ack files are looked for
SLURM_POLL_S = 5.0  # how often squeue is asked, while waiting for acks, whether jobs ended
COMPLETING_TIMEOUT_S = 90.0  # KillWait (30 s default) plus epilog, with margin
COMPLETING_POLL_S = 0.5


def query_jobs(
    runner: CommandRunner, job_ids: list[str], observe: Callable[[], JobsView]
) -> dict[str, SlurmJob]:
    """Slurm's record of ``job_ids`` (those it still knows), asked about them alone. 22.05
    prints every job whatever ``--jobs`` says with ``--json``: the answer is filtered here.
    Slurm refuses the whole query when one id is unknown (purged): then the whole view."""
    try:
        stdout = runner.run(commands.squeue_json_of(job_ids)).stdout
        jobs = parse_squeue_json(stdout).jobs
    except CommandError as exc:
        logger.info("squeue of jobs %s: %s; asking for every job", ",".join(job_ids), exc)
        jobs = observe().jobs
    wanted = set(job_ids)
    return {job.job_id: job for job in jobs if job.job_id in wanted}


class Waits:
    """The actuator's waits; ``observe`` is one whole ``squeue`` (the backend's), ``runner``
    asks about the waited-on jobs alone."""

    def __init__(
        self,
        checkpoint_timeout_s: float,
        clock: Clock,
        paths: StatePaths,
        observe: Callable[[], JobsView],
        runner: CommandRunner,
    ) -> None:
        self.checkpoint_timeout_s = checkpoint_timeout_s
        self.clock = clock
        self.paths = paths
        self.observe = observe
        self.runner = runner

    def query(self, job_ids: list[str]) -> dict[str, SlurmJob]:
        return query_jobs(self.runner, job_ids, self.observe)

    def acks(
        self, running: dict[str, tuple[Stop | Move, SlurmJob]]
    ) -> tuple[dict[str, str], dict[str, SlurmJob]]:
        """Wait for every job's ack together; say per job how its checkpoint went. Also
        returns the jobs that ended by themselves instead of acknowledging (by sia id): they
        must not be requeued, neither one that completed its training (it would run a second
        time) nor one whose own code failed (its ``--max-failures`` decide, not a move)."""
        timeout = self.checkpoint_timeout_s
        start = self.clock.now()
        deadline = start + timeout
        last_check = start
        waiting = dict(running)
        outcome: dict[str, str] = {}
        ended_alone: dict[str, SlurmJob] = {}
        while True:
            for sia_id, (action, job) in list(waiting.items()):
                if self.acked(sia_id, job, action.round_index):
                    outcome[sia_id] = f"acknowledged after {self.clock.now() - start:.1f} s"
                    del waiting[sia_id]
            now = self.clock.now()
            if not waiting:
                return outcome, ended_alone
            if now >= deadline:
                for sia_id in waiting:
                    outcome[sia_id] = f"timed out: no acknowledgement within {timeout:g} s"
                    logger.warning("job %s: %s", sia_id, outcome[sia_id])
                return outcome, ended_alone
            if now - last_check >= SLURM_POLL_S:
                last_check = now
                known = self.query([job.job_id for _, job in waiting.values()])
                for sia_id, (_, job) in list(waiting.items()):
                    ended = known.get(job.job_id)
                    if ended is None:
                        continue
                    if ended.state == "PENDING" or ended.finished:
                        outcome[sia_id] = f"job ended ({ended.state}) without an ack"
                        if self.ended_unasked(sia_id, ended):
                            ended_alone[sia_id] = ended
                        del waiting[sia_id]
            self.clock.sleep(min(ACK_POLL_S, max(deadline - now, 0.0)))

    def ended_unasked(self, sia_id: str, job: SlurmJob) -> bool:
        """Whether ``job`` ended by itself, without acknowledging the pending stop request (or
        with none pending): completed, or failed by its own code or by Slurm. Requeueing it
        would bypass what decides such a run (:func:`managed.failed_run`: the retry budgets)."""
        if not job.finished:
            return False
        path = self.paths.stop_request(sia_id)
        try:
            request = read_document(StopRequest, path) if path.exists() else None
        except ProtocolError:
            request = None
        return request is None or not self.acked(sia_id, job, request.round_index)

    def acked(self, sia_id: str, job: SlurmJob, round_index: int) -> bool:
        """Whether ``job``'s run acknowledged the stop of ``round_index``: a regular file
        ``ack-<round>.<job id>.<restart>`` of its user in the job directory (anything else
        there, an ack of another run included, does not count)."""
        try:
            with JobDirectory(self.paths.jobs_dir, sia_id, job.user_id) as directory:
                return directory.has_own_file(ack_name(round_index, job.job_id, job.restart_count))
        except ProtocolError:
            return False

    def until_pending(
        self,
        job_ids: list[str],
        view: JobsView | None = None,
        on_pending: Callable[[list[str], JobsView], None] | None = None,
    ) -> dict[str, str]:
        """Wait until requeued jobs are PENDING (their GPUs free), calling ``on_pending`` with
        the ones that just became so and the view that shows it, so each can go on at once.
        Returns, with their state, the ones that ended instead (a completing job that was not
        requeued after all) and the ones still not PENDING after :data:`COMPLETING_TIMEOUT_S`.
        ``view``, if given, is Slurm as it is now (saves the first ``squeue``)."""
        waiting = list(job_ids)
        left: dict[str, str] = {}
        deadline = self.clock.now() + COMPLETING_TIMEOUT_S
        while waiting:
            if view is not None:
                jobs = {job.job_id: job for job in view.jobs}
            else:
                jobs = self.query(waiting)
            # 24.11 and 26.05 show a requeued job PENDING with the COMPLETING flag while its
            # GPUs are still being taken back (22.05: COMPLETING, then PENDING).
            pending = [
                i
                for i in waiting
                if i not in jobs or (jobs[i].state == "PENDING" and not jobs[i].completing)
            ]
            left.update({i: jobs[i].state for i in waiting if i in jobs and jobs[i].finished})
            waiting = [i for i in waiting if i not in pending and i not in left]
            if pending and on_pending is not None:
                on_pending(pending, view if view is not None else self.observe())
            if not waiting:
                break
            if self.clock.now() >= deadline:
                return {**left, **{i: jobs[i].state for i in waiting}}
            self.clock.sleep(COMPLETING_POLL_S)
            view = None
        return left
