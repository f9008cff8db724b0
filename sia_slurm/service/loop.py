"""Driving rounds: the systemd loop and the cron ``--once``, both under the controller lock.

* ``run`` (systemd ``Type=simple``): a round at start, then one at every multiple of
  ``round_seconds`` of the wall clock (aligned, so rounds do not drift and restarts keep the
  rhythm). SIGTERM or SIGINT lets the current round finish, then the loop exits 0. A failed
  round is logged and the next one runs on time (the style rule: one failed call is logged and
  retried next round, never fatal). A profiling job's new measurement brings the next round
  forward (:mod:`.early`), within bounds a user cannot push.
* ``--once`` (cron or a systemd timer): one round in a fresh process, its memory loaded from
  and saved to the state database.

Both take the lock first (:mod:`.lock`), then open the database, then build the backend.
"""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

from sia_slurm.clock import WALL_CLOCK, Clock
from sia_slurm.config import SiaConfig
from sia_slurm.controller import Controller
from sia_slurm.protocol import StatePaths
from sia_slurm.service.build import BackendFactory, ServiceError, open_controller, service_backend
from sia_slurm.service.early import POLL_S, MeasurementWatch
from sia_slurm.service.journaled_round import RoundReport, run_round
from sia_slurm.service.lock import ControllerLock
from sia_slurm.state import Store
from sia_slurm.state.tree import prepare as prepare_tree

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServiceOptions:
    """How to run: one round or a loop, dry run or not, and the parts tests may swap."""

    once: bool = False
    dry_run: bool = False
    backend_factory: BackendFactory = service_backend
    profiles_dir: Path | None = None
    max_rounds: int | None = None  # the loop stops after this many rounds (tests, benchmarks)


def next_round_time(now: float, period: float) -> float:
    """The next multiple of ``period`` strictly after ``now``."""
    return (math.floor(now / period) + 1) * period


def install_stop_handlers(stop: threading.Event) -> Callable[[], None]:
    """SIGTERM/SIGINT set ``stop`` (the round in progress finishes); returns an undo."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        logger.info(
            "received %s: finishing the current round, then exiting", signal.Signals(signum).name
        )
        stop.set()

    previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGTERM, signal.SIGINT)}

    def restore() -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)

    return restore


def run_service(
    config: SiaConfig, options: ServiceOptions, stop: threading.Event | None = None
) -> list[RoundReport]:
    """Take the lock, open the state, build the parts, and run one round or the loop.

    Raises :class:`~sia_slurm.service.lock.LockHeldError` at once if another controller runs,
    :class:`~sia_slurm.state.StoreError` / :class:`~sia_slurm.service.build.ServiceError` if
    the state or the backend cannot be set up.
    """
    dry_run = options.dry_run or config.dry_run
    problems = prepare_tree(config.state_dir, os.geteuid())
    if problems:
        raise ServiceError(
            f"the state directory {config.state_dir} is not safe to run on:\n  "
            + "\n  ".join(problems)
        )
    if os.geteuid() == 0:
        logger.warning(
            "the controller runs as root; it needs only Slurm's SlurmUser (docs/operations.md)"
        )
    with ControllerLock(config.state_dir), Store.open(config.db_path) as store:
        controller, _notes = open_controller(config, store, options.profiles_dir)
        backend = options.backend_factory(config)
        if options.once:
            return [run_round(config, backend, store, controller, dry_run)]
        logger.info(
            "controller loop: a round every %g s, policy %s%s",
            config.round_seconds,
            config.policy.name,
            " (dry run)" if dry_run else "",
        )
        _describe(backend)
        return run_loop(
            lambda: run_round(config, backend, store, controller, dry_run),
            config.round_seconds,
            stop or threading.Event(),
            max_rounds=options.max_rounds,
            early=MeasurementWatch(
                StatePaths(config.state_dir).jobs_dir, lambda: _profiling_jobs(controller)
            ),
        )


def _profiling_jobs(controller: Controller) -> list[tuple[str, int, int]]:
    """The jobs the controller is profiling, with their users' uids (from Slurm) and the
    number of GPU types each has left to measure."""
    return [
        (sia_id, record.spec.owner_uid, len(record.profile_left))
        for sia_id, record in controller.jobs.items()
        if record.profiling is not None and record.spec.owner_uid is not None
    ]


def _describe(backend: object) -> None:
    """Log what the backend says about its cluster (the Slurm backend: its release and
    settings to change); other backends say nothing."""
    describe = getattr(backend, "describe", None)
    if describe is None:
        return
    try:
        first, *warnings = describe()
    except Exception as exc:  # the loop's rounds will say what is wrong with Slurm
        logger.warning("cannot describe the cluster: %s", exc)
        return
    logger.info("cluster: %s", first)
    for warning in warnings:
        logger.warning("cluster: %s", warning)


def run_loop(
    one_round: Callable[[], RoundReport],
    period: float,
    stop: threading.Event,
    *,
    clock: Clock = WALL_CLOCK,
    max_rounds: int | None = None,
    early: MeasurementWatch | None = None,
    poll_s: float = POLL_S,
) -> list[RoundReport]:
    """Call ``one_round`` now and at every multiple of ``period`` until ``stop`` is set, and
    in between as soon as ``early`` says a profiling measurement arrived (:mod:`.early`)."""
    reports: list[RoundReport] = []
    attempts = 0
    scheduled = True
    watch = _Guarded(early)
    while not stop.is_set():
        attempts += 1
        try:
            reports.append(one_round())
        except Exception as exc:
            logger.exception("round failed: %s; the next round runs on schedule", exc)
        watch.after_round(scheduled)
        if max_rounds is not None and attempts >= max_rounds:
            break
        woken = _wait(stop, next_round_time(clock.now(), period), clock, watch, poll_s)
        if woken is None:
            break
        scheduled = not woken
    logger.info("controller loop stopped after %d round(s)", attempts)
    return reports


class _Guarded:
    """The loop's hold on the watch: the watch is a shortcut, never worth a stopped loop, so
    the first exception it raises is logged and the loop goes on without it."""

    def __init__(self, watch: MeasurementWatch | None) -> None:
        self.watch = watch

    def after_round(self, scheduled: bool) -> None:
        if self.watch is not None:
            self._call(lambda watch: watch.after_round(scheduled=scheduled))

    def due(self) -> bool:
        return self.watch is not None and bool(self._call(lambda watch: watch.due()))

    def _call(self, call: Callable[[MeasurementWatch], bool | None]) -> bool | None:
        try:
            return call(self.watch)  # type: ignore[arg-type]
        except Exception as exc:
            logger.exception("cannot watch the profiling jobs: %s; rounds on schedule only", exc)
            self.watch = None
            return None


def _wait(
    stop: threading.Event, until: float, clock: Clock, watch: _Guarded, poll_s: float
) -> bool | None:
    """Wait until ``until`` on ``clock``: ``False`` then, ``True`` as soon as ``watch`` is due
    before it, ``None`` if ``stop`` was set."""
    while True:
        left = until - clock.now()
        if left <= 0:
            return False
        if stop.wait(left if watch.watch is None else min(left, poll_s)):
            return None
        if watch.due():
            return True
