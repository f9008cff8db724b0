#!/usr/bin/env bash
# One loaded run of docs/reliability.md: CI's command (.ci/run) on a fresh clone while two busy
# loops keep both cores busy, the load average sampled every 30 s.
#   usage: bash scripts/loaded-run.sh CLONE_DIR LOG
# CLONE_DIR: a fresh `git clone` of the commit to test; LOG gets the suite's output and a last
# line `rc=N after S s`; LOG.load the samples. The clone's install (scripts/install.sh) points
# the editable installs of sia-slurm and sia-slurm-dev at the clone; this script points them
# back at the checkout it came from when done.
set -u
dir=$1
log=$2
home=$(cd "$(dirname "$0")/.." && pwd)
python3 -c "while True: pass" &
busy1=$!
python3 -c "while True: pass" &
busy2=$!
(while true; do echo "$(date +%T) $(cut -d' ' -f1 /proc/loadavg)"; sleep 30; done) >"$log.load" &
sampler=$!
started=$(date +%s)
(cd "$dir" && bash .ci/run) >"$log" 2>&1
rc=$?
echo "rc=$rc after $(($(date +%s) - started)) s" >>"$log"
kill "$busy1" "$busy2" "$sampler"
pip install -q -e "$home" --no-deps >/dev/null 2>&1
pip install -q -e "$home/dev" --no-deps >/dev/null 2>&1  # the dev cluster's distribution too
exit "$rc"
