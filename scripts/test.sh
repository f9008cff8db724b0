#!/usr/bin/env bash
# Install everything, then run the linters and the whole test suite, Slurm integration included.
# The Slurm tests start their own dev cluster (real munged, slurmctld and slurmd); if Slurm
# cannot start they fail, they are never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
ruff check .
ruff format --check .
python3 -m pytest -q "$@"
