"""Partition moves against the real slurmctld, with both cores busy: every one is taken.

24.11 and 26.05 without accounting storage refuse a Partition= change with whatever errno the
RPC's worker thread last set (sia_slurm/slurm/actuate/calls.py). On 26.05.5 under this load one
update sent again alone took up to 35 tries, more than the 30 the controller allows; with the copies
:class:`SlurmCalls` sends after a refusal, 7 at most (2026-11-27). 22.05 takes each at once.
"""

from __future__ import annotations

import pytest

from sia_slurm.slurm.actuate.calls import SlurmCalls
from sia_slurm_dev import DevCluster
from tests.cpuload import busy_cores

pytestmark = pytest.mark.slurm

MOVES = 20


def test_twenty_partition_moves_of_a_held_job_under_load_are_all_taken(
    dev_cluster: DevCluster,
) -> None:
    runner = dev_cluster.runner()
    job_id = runner.run(
        ["sbatch", "--parsable", "--hold", "--partition=a100", "--nodes=1",
         "--gres=gpu:1", "--output=/dev/null", "--wrap=sleep 600"]
    ).stdout.strip()  # fmt: skip
    calls = SlurmCalls(runner)
    try:
        with busy_cores():
            for move in range(MOVES):
                partition = ("rtx", "a100")[move % 2]
                calls.run([
                    "scontrol", "update", f"JobId={job_id}", f"Partition={partition}",
                    f"TresPerNode=gres:gpu:{1 + move % 2}", "NumNodes=1-1",
                ])  # fmt: skip
                shown = runner.run(["squeue", "-h", "-j", job_id, "-o", "%P %b"]).stdout.split()
                assert shown[0] == partition, f"move {move}: {shown}"
                assert shown[1].endswith(f":{1 + move % 2}"), f"move {move}: {shown}"
    finally:
        runner.run(["scancel", job_id], check=False)
