"""torchrun's elastic agent, shielded from SIGUSR1 and SIGUSR2.

``sia-launch`` starts ``python -m launcher.agent <torchrun options> <script>`` on every node
instead of ``python -m torch.distributed.run`` directly. The only difference: the agent
ignores SIGUSR1/SIGUSR2. torchrun installs no handler for them, so their default action
would kill the agent, and with it the training, whenever such a signal reaches the whole job
(``scancel --full --signal=USR1``, ``sbatch --signal=USR1@60``). The controller's stop
request is a file the workers poll; the signal is only a hint (``docs/protocol.md``).
The workers inherit the "ignore" disposition; :class:`launcher.elastic.ElasticTrainer`
installs its own SIGUSR1 handler, which replaces it.
"""

from __future__ import annotations

import signal


def main() -> None:
    for number in (signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(number, signal.SIG_IGN)
    from torch.distributed.run import main as torchrun_main  # after the signals are safe

    torchrun_main()


if __name__ == "__main__":
    main()
