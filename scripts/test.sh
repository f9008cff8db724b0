#!/usr/bin/env bash
# Install everything, then run the linters, the documentation build and the whole test suite,
# Slurm integration included, on every Slurm release sia-slurm supports. Nine pytest sessions
# run side by side (docs/testing.md):
#   - the tests that start no daemon (`-m "not slurm"`: the inner loop and the heavy tier,
#     `-m "not slurm and not heavy"` and `-m heavy`, in one session), output here as it runs;
#   - the real-Slurm tests (marked `slurm`: every test that starts daemons, tests/conftest.py)
#     but those marked one_release, on the host's Slurm (Debian 12: 22.05), tests/e2e (but
#     profiling's) in one session and the rest in another, and those marked one_release in
#     two more;
#   - the same but those marked one_release, on Slurm 24.11 and 26.05, each from its Debian
#     root (built once by debootstrap, ~1 min each, cached under /var/cache/sia-slurm/roots or
#     $SIA_SLURM_ROOTS; dev/sia_slurm_dev/chroot.py), two sessions each as well.
# Each Slurm session has its own dev cluster on its own ports (SIA_TEST_SLURM,
# SIA_TEST_PORT_BASE; tests/release.py). The Slurm sessions spend most of their time waiting on
# Slurm (requeue delays, node timeouts), the first on the CPU, so together they take about as
# long as the longest one. The Slurm sessions' output is printed when they end.
# Arguments go to every session (e.g. `bash scripts/test.sh tests/slurm -x`); SIA_TEST_RELEASES
# chooses the other releases ("" runs the host's alone); SIA_TEST_PORT_BASE (17817) moves all
# port ranges (24.11's and 26.05's start 3000 and 6000 above it; each release's second session
# 1000 above its first; the host's one_release sessions 2000 above and 5000 below).
# The Slurm tests start their own dev clusters (real munged, slurmctld and slurmd); if Slurm
# cannot start they fail, they are never skipped.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
ruff check .
ruff format --check .
# The documentation site: a broken link, a missing page or a reference page the code cannot
# render fails here (mkdocs.yml; scripts/docs_hooks.py).
NO_MKDOCS_2_WARNING=1 mkdocs build --strict --quiet

read -r -a releases <<<"${SIA_TEST_RELEASES-24.11 26.05}"
# Each session's cluster takes 7 ports from its base, and a second cluster 500 above it.
base=${SIA_TEST_PORT_BASE:-17817}
declare -A port_base=([24.11]=$((base + 3000)) [26.05]=$((base + 6000)))
for release in "${releases[@]}"; do
    [ -n "${port_base[$release]:-}" ] || { echo "test.sh: no port base for Slurm $release" >&2; exit 2; }
done

started=$(date +%s)
# Build the missing roots first, side by side (debootstrap is mostly download and unpack).
pids=()
for release in "${releases[@]}"; do
    sia-slurm dev-cluster root "$release" >/dev/null &
    pids+=($!)
done
for pid in "${pids[@]}"; do wait "$pid"; done
echo "test.sh: Slurm roots ready after $(($(date +%s) - started)) s" >&2

if [ $# -gt 0 ]; then targets=("$@"); else targets=(tests); fi
# Tests marked one_release run in the host's session only: their Slurm commands are those other
# tests run on every release, and what they check is the controller's or the job side's logic
# (profiling, the user-file door, this suite's SIGTERM teardown) or a long wait (a --time=3 job's
# 3.3 minutes). Each says why where it is marked (docs/testing.md, "Tiers").
# A SIGTERM or SIGINT to this script (a CI timeout, Ctrl-C) goes on to every session as
# SIGTERM, on which a session tears its fixtures down (dev clusters, slurmdbd, MariaDB;
# tests/conftest.py), and the script still waits for them. Without this they ran on unsignalled
# (a script's background jobs even ignore Ctrl-C) until killed outright, daemons left behind on
# the ports the next run needs.
pytest_pids=()
stop_sessions() { kill -TERM "${pytest_pids[@]}" 2>/dev/null || true; }
trap stop_sessions TERM INT
# wait_for PID: the session's exit status. A trapped signal cuts `wait` short (status 128+n)
# while the session is still tearing down: then wait again.
wait_for() {
    local code=0
    wait "$1" || code=$?
    while [ "$code" -gt 128 ] && kill -0 "$1" 2>/dev/null; do
        code=0
        wait "$1" || code=$?
    done
    return "$code"
}
logs=$(mktemp -d /tmp/sia-test-logs.XXXXXX)
# The Slurm sessions: per release, tests/e2e but profiling's in one and the other live tests
# in another, each with its own dev cluster on its own ports (the second 1000 above the
# first). They spend their time waiting on Slurm and on their jobs (the load stays near 3 on
# two cores), so side by side they take about as long as the longest; one after the other, a
# release's took ~40 minutes.
# Arguments given: one session per release, on what they name.
declare -a names=() sessions=()
add_session() {  # NAME RELEASE PORT_BASE SELECTION TARGET...
    local name=$1 release=$2 port=$3 selection=$4
    shift 4
    SIA_TEST_SLURM=$release SIA_TEST_PORT_BASE=$port \
        python3 -m pytest -q -p no:cacheprovider -m "$selection" "$@" >"$logs/$name.log" 2>&1 &
    names+=("$name: -m '$selection' $*")
    sessions+=("$!")
    pytest_pids+=("$!")
}
# The second session's paths: tests/ but tests/e2e, and profiling's file of it. Listed, since
# pytest drops a path given beside a folder that holds it (`tests --ignore=tests/e2e FILE`
# collects nothing of FILE).
rest=()
for path in tests/*/ tests/test_*.py; do
    [ "$path" = tests/e2e/ ] || rest+=("$path")
done
rest+=(tests/e2e/test_profiling_live.py)
declare -A first_port=([system]=$base)
for release in "${releases[@]}"; do first_port[$release]=${port_base[$release]}; done
every="slurm and not one_release"
for release in system "${releases[@]}"; do
    port=${first_port[$release]}
    if [ $# -gt 0 ]; then
        add_session "$release" "$release" "$port" "$every" "$@"
    else
        # profiling's every-release tests with the rest: tests/e2e is the longer session
        add_session "$release-e2e" "$release" "$port" "$every" tests/e2e \
            --ignore=tests/e2e/test_profiling_live.py
        add_session "$release-rest" "$release" "$((port + 1000))" "$every" "${rest[@]}"
    fi
done
# The tests of the host's release only, in two sessions of their own: profiling's (a real
# PyTorch job profiled, the service loop's early rounds) and the others (the controller killed
# at every step, a 3-minute job...).
if [ $# -gt 0 ]; then
    add_session system-one system "$((base + 2000))" one_release "$@"
else
    add_session system-one system "$((base + 2000))" one_release tests/e2e/test_profiling_live.py
    add_session system-one-b system "$((base - 5000))" one_release tests \
        --ignore=tests/e2e/test_profiling_live.py
fi
status=0
# The tests that start no daemon, the inner loop and the heavy tier together (CI leaves none
# out), on ports of their own (tests/release.py's quiet ports follow the base), in the
# background too (its output still comes here as it runs), so that the trap runs at once: bash
# runs no trap while it waits for a foreground command. In one process (-n 0): beside eight
# Slurm sessions both cores are busy already, so a worker per core would not end CI sooner (the
# Slurm sessions set its length), and its extra load at the start squeezed the speed ratios a
# live profiling test measures (t4 over a100: 1.16x, against 1.5x asked).
SIA_TEST_PORT_BASE=$((base + 9000)) python3 -m pytest -q -n 0 -m "not slurm" "${targets[@]}" &
host=$!
pytest_pids+=("$host")
# pytest's 5 is "no test collected": arguments that name no test of a session's selection.
code=0
wait_for "$host" || code=$?
[ "$code" = 0 ] || [ "$code" = 5 ] || status=$code
for i in "${!sessions[@]}"; do
    code=0
    wait_for "${sessions[$i]}" || code=$?
    echo
    echo "==================== Slurm ${names[$i]} ===================="
    cat "$logs/${names[$i]%%:*}.log"
    [ "$code" = 0 ] || [ "$code" = 5 ] || status=$code
done
echo "test.sh: all sessions done after $(($(date +%s) - started)) s (exit $status)" >&2
rm -rf "$logs"
exit "$status"
