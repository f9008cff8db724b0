"""Capture Slurm accounting's output for the parsers' tests (issue 20):
``tests/fixtures/slurm-<release>/{sacctmgr-assoc,sacctmgr-qos,sacct-runs,sshare}.txt``.

Run as root: ``python3 scripts/capture_accounting_fixtures.py 24.11`` (or ``26.05``, or
``system`` for the host's 22.05). It starts a dev cluster with accounting
(:class:`~sia_slurm_dev.DevCluster`, ports 18400..), creates the associations of the
22.05 fixtures (biology limited to 4 GPUs, physics twice its share, root in both with
MaxTRESPerJob 8 and QOS short), runs a finished job, a cancelled one and one requeued once,
then writes the controller's own commands' output (:mod:`sia_slurm.slurm.observe.sacct`).
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sia_slurm.slurm.observe.sacct import SHOW_ASSOC, SHOW_QOS, sacct_runs  # noqa: E402
from sia_slurm_dev import DevCluster, DevClusterSpec  # noqa: E402
from sia_slurm_dev.accounts_spec import AccountingSpec  # noqa: E402

SPEC = """\
accounts:
  biology: {gpus: 4}
  physics: {fairshare: 2}
users:
  root: {accounts: [biology, physics], gpus_per_job: 8}
qos:
  short: {gpus_per_user: 6, gpus_per_job: 4}
"""
SSHARE_FIELDS = "Account,User,RawShares,NormShares,RawUsage,EffectvUsage,FairShare"
SSHARE = ["sshare", "-a", "-n", "-P", "-o", SSHARE_FIELDS]


def main() -> None:
    release = sys.argv[1] if len(sys.argv) > 1 else "system"
    out = REPO / "tests" / "fixtures" / f"slurm-{'22.05' if release == 'system' else release}"
    root = Path(tempfile.mkdtemp(prefix="sia-acct-capture-"))
    root.chmod(0o711)  # MariaDB runs as mysql, slurmctld as SlurmUser: both go in
    cluster = DevCluster(
        root,
        port_base=18400,
        slurm=release,
        accounting=AccountingSpec.parse(SPEC, "SPEC"),
    )
    cluster.up(DevClusterSpec.parse("a100:1x4"))
    try:
        run = cluster.runner().run

        def sbatch(*args: str) -> str:
            argv = ["sbatch", "--parsable", "-o", "/dev/null", "-p", "a100", *args]
            return run(argv).stdout.strip().split(";")[0]

        def state(job: str) -> str:
            return run(["squeue", "-h", "-j", job, "-o", "%T"], check=False).stdout.strip()

        done = sbatch(
            "-A", "biology", "--gpus-per-node=4", "--comment=sia-slurm:b1", "--wrap", "sleep 2"
        )
        while state(done):
            time.sleep(0.5)
        moved = sbatch(
            "-A", "biology", "--gpus-per-node=2", "--comment=sia-slurm:mv-1", "--wrap", "sleep 60"
        )
        while state(moved) != "RUNNING":
            time.sleep(0.5)
        time.sleep(3)
        run(["scontrol", "requeuehold", moved])
        time.sleep(2)
        run(["scancel", moved])
        other = sbatch("-A", "physics", "--gpus-per-node=1", "--comment=other", "--wrap", "sleep 1")
        while state(other):
            time.sleep(0.5)
        time.sleep(2)
        out.mkdir(parents=True, exist_ok=True)
        for name, argv in (
            ("sacctmgr-assoc.txt", list(SHOW_ASSOC)),
            ("sacctmgr-qos.txt", list(SHOW_QOS)),
            ("sacct-runs.txt", sacct_runs("now-1days")),
            ("sshare.txt", SSHARE),
        ):
            (out / name).write_text(run(argv).stdout)
            print(f"{out / name}: {' '.join(argv)}")
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
