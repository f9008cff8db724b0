"""The simulator's count of jobs waiting beside free GPUs: the controller's
(:mod:`sia_slurm.controller.idle_waits`), once the simulated cluster has applied the round's
actions."""

from __future__ import annotations

from sia_slurm.cluster import ClusterSnapshot
from sia_slurm.controller import RoundOutcome
from sia_slurm.controller.idle_waits import FreeGpus, RoundWaits, round_waits
from sia_slurm.sim.simulated_cluster import SimulatedCluster


def after_actions(
    snapshot: ClusterSnapshot, outcome: RoundOutcome, cluster: SimulatedCluster
) -> RoundWaits:
    """:func:`round_waits` of the round that decided ``outcome`` from ``snapshot``, once
    ``cluster`` has applied its actions (what the simulator records every round)."""
    free = FreeGpus.of(snapshot.nodes, cluster.free_gpus())
    return round_waits(snapshot.jobs, outcome, cluster.holding(), free)
