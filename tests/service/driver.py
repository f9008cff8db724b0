"""Runs ``sia-slurm`` in a child process against the file-backed fake cluster (crash, lock and
signal tests need a real process to kill or to race).

    python tests/service/driver.py CLUSTER_JSON [--crash-after K] [--raise-after K]
        [--slow-snapshot S] -- SIA_SLURM_ARGS...
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sia_slurm.cli.main import cli  # noqa: E402
from tests.service.fakes import FakeCluster  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("cluster", type=Path)
    parser.add_argument("--crash-after", type=int, default=None)
    parser.add_argument("--raise-after", type=int, default=None)
    parser.add_argument("--slow-snapshot", type=float, default=0.0)
    argv = sys.argv[1:]
    split = argv.index("--") if "--" in argv else len(argv)
    options = parser.parse_args(argv[:split])
    args = argv[split + 1 :]
    fake = FakeCluster(
        options.cluster,
        crash_after=options.crash_after,
        raise_after=options.raise_after,
        slow_snapshot_s=options.slow_snapshot,
    )
    cli.main(args=args, obj={"backend_factory": lambda _config: fake}, prog_name="sia-slurm")


if __name__ == "__main__":
    main()
