"""torchrun's elastic agent, shielded from SIGUSR1 and SIGUSR2, and quiet when Slurm stops it.

``sia-launch`` starts ``python -m sia_slurm.job.agent <torchrun options> <script>`` on every node
instead of ``python -m torch.distributed.run`` directly. Two differences:

* the agent ignores SIGUSR1/SIGUSR2. torchrun installs no handler for them, so their default
  action would kill the agent, and with it the training, whenever such a signal reaches the
  whole job (``scancel --full --signal=USR1``, ``sbatch --signal=USR1@60``). The controller's
  stop request is a file the workers poll; the signal is only a hint (``docs/protocol.md``).
  The workers inherit the "ignore" disposition; :class:`sia_slurm.job.elastic.ElasticTrainer`
  installs its own SIGUSR1 handler, which replaces it.
* a death signal (Slurm's SIGTERM when the controller requeues a job that has checkpointed and
  acknowledged its stop) ends the agent with status 128 + the signal and one log line, as a
  process killed by it would, instead of torchrun's uncaught ``SignalException`` traceback in
  the job's log at every move. torchrun has already stopped its workers by then.

It also leaves the run's evidence for ``sia-launch`` (:mod:`sia_slurm.job.runs`): a mark that
``srun`` started its task on this node, written before torch is imported, and the error of a
rendezvous that failed; and it tells torchrun which node hosts the c10d store (node 0, whose
address is the endpoint), so that a port someone else took fails the rendezvous instead of
joining a stranger's store.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Mapping
from pathlib import Path

from sia_slurm.job.jobenv import env_name
from sia_slurm.job.runs import agent_options, mark_rendezvous_failure, mark_task
from sia_slurm.protocol import ProtocolError, StatePaths

logger = logging.getLogger("sia_slurm.job.agent")


def run_of(environ: Mapping[str, str]) -> tuple[Path, str, int, int] | None:
    """``(job dir, Slurm job id, restart count, node id)`` of the run this agent serves, or
    ``None`` outside ``sia-launch`` (then it leaves no evidence)."""
    state_dir, sia_id = environ.get(env_name("state_dir")), environ.get(env_name("sia_id"))
    job_id = environ.get("SLURM_JOB_ID", "")
    restarts, node = environ.get("SLURM_RESTART_COUNT", "0"), environ.get("SLURM_NODEID", "")
    if not (state_dir and sia_id and job_id.isdigit() and restarts.isdigit() and node.isdigit()):
        return None
    try:
        job_dir = StatePaths(Path(state_dir)).job_dir(sia_id)
    except ProtocolError:
        return None
    return job_dir, job_id, int(restarts), int(node)


def main() -> None:
    for number in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)
    run = run_of(os.environ)
    if run is not None:
        mark_task(*run)
    sys.argv[1:1] = agent_options(os.environ)
    # Imported after the signals are safe and the task is marked: importing torch takes a while.
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main()
    except SignalException as exc:
        logger.warning("torchrun stopped by signal %s; its workers are down", exc.sigval.name)
        sys.exit(128 + int(exc.sigval))
    except RendezvousError as exc:
        cause = f"{type(exc).__name__}: {exc}"
        if exc.__cause__ is not None:
            cause += f" ({type(exc.__cause__).__name__}: {exc.__cause__})"
        logger.error("the rendezvous failed: %s", cause)
        if run is not None:
            mark_rendezvous_failure(*run, cause)
        sys.exit(1)


if __name__ == "__main__":
    main()
