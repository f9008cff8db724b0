#!/usr/bin/env bash
# The sia-slurm demo (the README's first command; docs/demo.md): install everything, start a dev cluster
# with three GPU types (2 x 4 a100, 2 x 4 rtx, 2 x 4 t4 fake GPUs), submit a small mixed workload
# with sia-sbatch (emulated trainers of six apps and two real PyTorch jobs), run the controller
# until every job has finished, print the job table and write the dashboard; the cluster it
# started is taken down on exit, whatever happens.
#
# Run as root (it installs packages, creates accounts and starts Slurm), but the scheduler runs as
# it does in production: the controller as the unprivileged service account sia-slurm, which is
# the dev cluster's SlurmUser, on a state tree made by `sia-slurm setup --user sia-slurm`; the jobs
# are submitted by an ordinary user, sia-demo. Both accounts are created if missing (useradd).
#
# Time is scaled down so that it takes minutes: 15 s rounds instead of 60 s, jobs of a few
# minutes (small datasets, few epochs), metrics every 5 s instead of 30 s.
#
# Environment (all optional): SIA_DEMO_DIR (/tmp/sia-slurm-demo: cluster, state, logs),
# SIA_DEMO_OUT (dashboard folder, $SIA_DEMO_DIR/dashboard), SIA_DEMO_PORT_BASE (20817),
# SIA_DEMO_ROUND_S (15), SIA_DEMO_TIMEOUT_S (1200), SIA_DEMO_SKIP_INSTALL=1 (already installed),
# SIA_DEMO_ACCOUNT (sia-slurm: the controller's service account), SIA_DEMO_USER (sia-demo: who
# submits the jobs; root works too), SIA_DEMO_SLURM (system: the host's Slurm; 24.11 or 26.05: that
# release from its cached Debian root, `dev-cluster up --slurm`, built first if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
started=$(date +%s)

[ "${SIA_DEMO_SKIP_INSTALL:-0}" = 1 ] || bash scripts/install.sh
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
# The interpreter itself, not a wrapper (a pyenv shim works for root only): the service account
# and the user run it too.
python=$(python3 -c 'import sys; print(sys.executable)')

dir=${SIA_DEMO_DIR:-/tmp/sia-slurm-demo}
out=${SIA_DEMO_OUT:-$dir/dashboard}
port_base=${SIA_DEMO_PORT_BASE:-20817}
round_s=${SIA_DEMO_ROUND_S:-15}
timeout_s=${SIA_DEMO_TIMEOUT_S:-1200}
account=${SIA_DEMO_ACCOUNT:-sia-slurm}
user=${SIA_DEMO_USER:-sia-demo}
slurm=${SIA_DEMO_SLURM:-system}
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

[ "$(id -u)" = 0 ] || { say "run me as root (accounts, Slurm daemons)"; exit 1; }
case "$slurm" in
system) ;;
24.11 | 26.05)
    # Jobs run inside the release's root, which shares /tmp and /home with the host (and the
    # cluster's own directory), but not the rest: the state tree and job logs must be there.
    case "$(readlink -m "$dir")/" in
    /tmp/* | /home/*) ;;
    *)
        say "SIA_DEMO_DIR=$dir: with SIA_DEMO_SLURM=$slurm it must lie under /tmp or /home" \
            "(jobs run inside the Slurm root, which shares only those with the host)"
        exit 1
        ;;
    esac
    ;;
*)
    say "SIA_DEMO_SLURM=$slurm: expected system, 24.11 or 26.05 (sia-slurm dev-cluster up --slurm)"
    exit 1
    ;;
esac

ensure_account() { # ensure_account NAME system|user
    id -u "$1" >/dev/null 2>&1 && return 0
    if [ "$2" = system ]; then
        useradd --system --no-create-home --shell /usr/sbin/nologin "$1"
    else
        useradd --create-home --shell /bin/bash "$1"
    fi
    say "created the account $1 ($2)"
}
grant_traverse() { # o+x on $1 and every directory above it that lacks it (traverse only)
    local d
    d=$(readlink -f "$1")
    while :; do
        if [ -d "$d" ] && [ -z "$(find "$d" -maxdepth 0 -perm -o=x)" ]; then
            chmod o+x "$d"
            say "chmod o+x $d (so that $account and $user can reach what is inside)"
        fi
        [ "$d" = / ] && break
        d=$(dirname "$d")
    done
}
as() { # as USER COMMAND...: one short command as USER (same environment, no shell)
    local who=$1
    shift
    runuser -u "$who" -- "$@"
}

# The controller's service account (Slurm's SlurmUser below) and the user who submits the jobs.
ensure_account "$account" system
[ "$user" = root ] || ensure_account "$user" user
rm -rf "$state" "$dir/jobs-out" "$dir/controller.log"
mkdir -p "$dir"
chmod 0755 "$dir"
# Both run this interpreter and this checkout: let them reach it (/root is 0700 on a fresh
# machine). Traverse only: nothing becomes listable or readable that was not.
for path in "$(dirname "$python")" "$("$python" -c 'import sys; print(sys.prefix)')" \
    "$("$python" -c 'import sys; print(sys.base_prefix)')" "$repo" "$dir"; do
    grant_traverse "$path"
done
as "$account" "$python" -c "import sia_slurm.cli.main"
as "$user" "$python" -c "import sia_slurm.job, torch"
install -d -o "$user" -m 0755 "$dir/jobs-out"
install -o "$account" -m 0644 /dev/null "$dir/controller.log"

# SLURM_CONF, and for a root's release also PATH: its client wrappers (a 22.05 sbatch cannot talk
# to a 24.11 slurmctld), which sia-sbatch (run as $user, PATH kept) then finds first.
cluster_env=$(sia-slurm dev-cluster up --dir "$dir/cluster" --port-base "$port_base" \
    --slurm-user "$account" --slurm "$slurm")
eval "$cluster_env"
export SLURM_CONF PATH
say "Slurm: $(scontrol --version) ($slurm)"

# The dev cluster's three partitions, $round_s s rounds, really acting, and for a root's release
# its client wrappers as slurm.bin_dir; the state tree owned by the service account (jobs/ sticky
# and world-writable, like /tmp), as an admin would make it.
sia-slurm dev-cluster config --dir "$dir/cluster" --state-dir "$state" \
    --round-seconds "$round_s" >"$config"
sia-slurm setup --config "$config" --user "$account"
as "$account" "$python" -m sia_slurm.cli config check --live "$config"
export SIA_SLURM_CONFIG=$config

submitted=0
# submit NAME APP MAX_GPUS -- COMMAND...: APP "-" has no profile and is profiled first, at M0
# $m0 (12 unless set) with the LR rule's limit $max_batch (384 unless set)
submit() {
    local name=$1 app=$2 max_gpus=$3 model
    shift 4
    model=(--app "$app")
    [ "$app" = - ] && model=(--batch-size "${m0:-12}" --max-batch-size "${max_batch:-384}")
    (cd "$dir/jobs-out" && as "$user" "$python" -m sia_slurm.job.sbatch --config "$config" \
        "${model[@]}" --max-gpus "$max_gpus" --job-name "$name" \
        --output "$dir/jobs-out/$name.out" \
        --export=ALL,SIA_METRICS_INTERVAL_S=5,SIA_LINGER_S=120 -- "$@" >/dev/null)
    submitted=$((submitted + 1))
}
emulated() { # emulated NAME APP MAX_GPUS EPOCHS DATASET
    submit "$1" "$2" "$3" -- "$python" -m sia_slurm.job.examples.emulated \
        --epochs "$4" --dataset-size "$5"
}

say "submitting 10 jobs as $user (8 emulated trainers of 6 apps, 2 real PyTorch jobs)"
emulated cifar10-a cifar10 8 20 32768
emulated cifar10-b cifar10 8 20 32768
emulated ncf-a ncf 4 20 131072
emulated deepspeech2-a deepspeech2 4 6 800
emulated bert-a bert 4 4 480
emulated yolov3-a yolov3 4 6 480
emulated cifar10-c cifar10 8 20 32768
emulated imagenet-a imagenet 4 8 8000
# Models sia-slurm has no profile of: profiled on one GPU of each type first (docs/profiling.md),
# the CNN at cifar10's M0 and largest batch (it once borrowed that app's profile)
m0=128 max_batch=4096 submit cnn-real - 2 -- "$python" -m sia_slurm.job.examples.cnn \
    --epochs 20 --dataset-size 4096
submit transformer-real - 2 -- "$python" -m sia_slurm.job.examples.transformer --epochs 6

say "controller: sia-slurm controller run as $account (rounds of $round_s s; log $dir/controller.log)"
# setpriv, not runuser, for the long-running controller: setpriv execs it, so the SIGTERM below
# reaches the controller itself, which finishes its round and exits; runuser would SIGKILL it
# two seconds after passing the signal on.
setpriv --reuid="$account" --regid="$account" --init-groups -- \
    "$python" -m sia_slurm.cli controller run --config "$config" --log-file "$dir/controller.log" &
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
