#!/usr/bin/env bash
# Install everything, start a three-GPU-type dev cluster (2 x 4 a100, 2 x 4 rtx, 2 x 4 t4),
# check the example configuration against it, show it, and take it down again.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

dir=${SIA_DEV_CLUSTER_DIR:-/tmp/sia-slurm-demo}
trap 'sia-slurm dev-cluster down --dir "$dir"' EXIT
eval "$(sia-slurm dev-cluster up --dir "$dir")"
sia-slurm config check --live etc/sia.yaml
sia-slurm dev-cluster status --dir "$dir"
