"""torchrun's elastic agent, shielded from SIGUSR1 and SIGUSR2, and quiet when Slurm stops it.

``sia-launch`` starts ``python -m launcher.agent <torchrun options> <script>`` on every node
instead of ``python -m torch.distributed.run`` directly. Two differences:

* the agent ignores SIGUSR1/SIGUSR2. torchrun installs no handler for them, so their default
  action would kill the agent, and with it the training, whenever such a signal reaches the
  whole job (``scancel --full --signal=USR1``, ``sbatch --signal=USR1@60``). The controller's
  stop request is a file the workers poll; the signal is only a hint (``docs/protocol.md``).
  The workers inherit the "ignore" disposition; :class:`launcher.elastic.ElasticTrainer`
  installs its own SIGUSR1 handler, which replaces it.
* a death signal (Slurm's SIGTERM when the controller requeues a job that has checkpointed and
  acknowledged its stop) ends the agent with status 128 + the signal and one log line, as a
  process killed by it would, instead of torchrun's uncaught ``SignalException`` traceback in
  the job's log at every move. torchrun has already stopped its workers by then.
"""

from __future__ import annotations

import logging
import signal
import sys

logger = logging.getLogger("launcher.agent")


def main() -> None:
    for number in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)
    # Imported after the signals are safe: importing torch takes a while.
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.run import main as torchrun_main

    try:
        torchrun_main()
    except SignalException as exc:
        logger.warning("torchrun stopped by signal %s; its workers are down", exc.sigval.name)
        sys.exit(128 + int(exc.sigval))


if __name__ == "__main__":
    main()
