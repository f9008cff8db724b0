#!/usr/bin/env bash
# The sia-slurm demo (README command 1; docs/demo.md): install everything, start a dev cluster
# with three GPU types (2 x 4 a100, 2 x 4 rtx, 2 x 4 t4 fake GPUs), submit a small mixed workload
# with sia-sbatch (emulated trainers of six apps and two real PyTorch jobs), run the controller
# until every job has finished, print the job table and write the dashboard; the cluster it
# started is taken down on exit, whatever happens.
#
# Time is scaled down so that it takes minutes: 15 s rounds instead of 60 s, jobs of a few
# minutes (small datasets, few epochs), metrics every 5 s instead of 30 s.
#
# Environment (all optional): SIA_DEMO_DIR (/tmp/sia-slurm-demo: cluster, state, logs),
# SIA_DEMO_OUT (dashboard folder, $SIA_DEMO_DIR/dashboard), SIA_DEMO_PORT_BASE (20817),
# SIA_DEMO_ROUND_S (15), SIA_DEMO_TIMEOUT_S (1200), SIA_DEMO_SKIP_INSTALL=1 (already installed).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
started=$(date +%s)

[ "${SIA_DEMO_SKIP_INSTALL:-0}" = 1 ] || bash scripts/install.sh
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"

dir=${SIA_DEMO_DIR:-/tmp/sia-slurm-demo}
out=${SIA_DEMO_OUT:-$dir/dashboard}
port_base=${SIA_DEMO_PORT_BASE:-20817}
round_s=${SIA_DEMO_ROUND_S:-15}
timeout_s=${SIA_DEMO_TIMEOUT_S:-1200}
config=$dir/sia.yaml
state=$dir/state
controller_pid=""

say() { echo "demo: $*" >&2; }

cleanup() {
    status=$?
    if [ -n "$controller_pid" ] && kill -0 "$controller_pid" 2>/dev/null; then
        kill -TERM "$controller_pid" 2>/dev/null || true
        wait "$controller_pid" 2>/dev/null || true
    fi
    sia-slurm dev-cluster down --dir "$dir/cluster" || true
    say "cluster down; $(($(date +%s) - started)) s in all (exit $status)"
}
trap cleanup EXIT

rm -rf "$state" "$dir/jobs-out" "$dir/controller.log"
mkdir -p "$state" "$dir/jobs-out"
cluster_env=$(sia-slurm dev-cluster up --dir "$dir/cluster" --port-base "$port_base")
eval "$cluster_env"
export SLURM_CONF

# The dev cluster's three partitions, $round_s s rounds, really acting.
sia-slurm dev-cluster config --state-dir "$state" --round-seconds "$round_s" >"$config"
sia-slurm config check --live "$config"
export SIA_SLURM_CONFIG=$config

submitted=0
submit() { # submit NAME APP MAX_GPUS -- COMMAND...
    local name=$1 app=$2 max_gpus=$3
    shift 4
    sia-sbatch --config "$config" --app "$app" --max-gpus "$max_gpus" --job-name "$name" \
        --output "$dir/jobs-out/$name.out" \
        --export=ALL,SIA_METRICS_INTERVAL_S=5,SIA_LINGER_S=120 -- "$@" >/dev/null
    submitted=$((submitted + 1))
}
emulated() { # emulated NAME APP MAX_GPUS EPOCHS DATASET
    submit "$1" "$2" "$3" -- python -m launcher.examples.emulated \
        --epochs "$4" --dataset-size "$5"
}

say "submitting 10 jobs (8 emulated trainers of 6 apps, 2 real PyTorch jobs)"
emulated cifar10-a cifar10 8 20 32768
emulated cifar10-b cifar10 8 20 32768
emulated ncf-a ncf 4 20 131072
emulated deepspeech2-a deepspeech2 4 6 800
emulated bert-a bert 4 4 480
emulated yolov3-a yolov3 4 6 480
emulated cifar10-c cifar10 8 20 32768
emulated imagenet-a imagenet 4 8 8000
submit cnn-real cifar10 2 -- python -m launcher.examples.cnn --epochs 20 --dataset-size 4096
submit transformer-real bert 2 -- python -m launcher.examples.transformer --epochs 6

say "controller: sia-slurm controller run (rounds of $round_s s; log $dir/controller.log)"
sia-slurm controller run --config "$config" --log-file "$dir/controller.log" &
controller_pid=$!

finished() { # prints "<finished> <known>" from the controller's database
    python3 - "$state/sia.db" <<'EOF'
import sqlite3, sys
try:
    conn = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
    rows = conn.execute("SELECT phase FROM jobs").fetchall()
except sqlite3.Error:
    rows = []
print(sum(p in ("done", "failed", "gone") for (p,) in rows), len(rows))
EOF
}

deadline=$(($(date +%s) + timeout_s))
while :; do
    read -r done known < <(finished)
    say "$(date +%T): $done/$submitted jobs finished ($known known to the controller)"
    [ "$done" -ge "$submitted" ] && break
    if ! kill -0 "$controller_pid" 2>/dev/null; then
        say "the controller exited; last log lines:"
        tail -n 20 "$dir/controller.log" >&2
        exit 1
    fi
    if [ "$(date +%s)" -ge "$deadline" ]; then
        say "not finished after $timeout_s s; the dashboard shows where it stands"
        break
    fi
    sleep 20
done
kill -TERM "$controller_pid"
wait "$controller_pid" || true
controller_pid=""

sia-slurm report --config "$config" --out "$out" --title "sia-slurm demo (dev cluster)" --table
say "open $out/index.html in a browser (no server needed)"
