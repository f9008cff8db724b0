#!/usr/bin/env bash
# Install everything sia-slurm needs on a fresh Debian/Ubuntu machine (as root):
# Slurm and munge from the distribution, PyTorch's CPU build, and this project with its extras.
# Safe to run again: what is already there is kept.
#
# Offline, from a release's wheel (docs/operations.md, "Installing a release"):
#   bash scripts/install.sh --wheel dist/sia_slurm-X-py3-none-any.whl --find-links DIR \
#       [--extras train]
# installs that wheel into python3's environment with `pip install --no-index --find-links DIR`:
# nothing is downloaded, and neither Slurm nor munge is installed (those are the site's). DIR is
# a wheelhouse of the dependencies, filled beforehand on a machine that is online:
#   python3 -m pip download --dest DIR "dist/sia_slurm-X-py3-none-any.whl[train]"
set -euo pipefail

# The offline mode needs nothing of the checkout, and its paths are the caller's.
if [ $# -gt 0 ]; then
    wheel="" find_links="" extras=""
    while [ $# -gt 0 ]; do
        case "$1" in
            --wheel) wheel=${2:?--wheel needs a path}; shift 2 ;;
            --find-links) find_links=${2:?--find-links needs a directory}; shift 2 ;;
            --extras) extras=${2:?--extras needs a list, e.g. train}; shift 2 ;;
            *) echo "install: unknown argument '$1'" \
                   "(offline: --wheel PATH --find-links DIR [--extras LIST])" >&2
               exit 2 ;;
        esac
    done
    if [ -z "$wheel" ] || [ -z "$find_links" ]; then
        echo "install: the offline install needs both --wheel PATH and --find-links DIR" >&2
        exit 2
    fi
    [ -f "$wheel" ] || { echo "install: no wheel at $wheel" >&2; exit 2; }
    [ -d "$find_links" ] || { echo "install: no wheelhouse directory $find_links" >&2; exit 2; }
    requirement=$wheel
    [ -z "$extras" ] || requirement="$wheel[$extras]"
    export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
    python3 -m pip install -q --no-index --find-links "$find_links" "$requirement"
    echo "install: done offline ($(python3 --version), sia-slurm $(cd / && python3 -c \
        'import sia_slurm; print(sia_slurm.__version__)'))" >&2
    exit 0
fi

cd "$(dirname "$0")/.."

# chromium renders the static dashboard in its headless test (sia-slurm report); debootstrap
# builds the Debian roots of other Slurm releases (`sia-slurm dev-cluster root 24.11|26.05`,
# cached under /var/cache/sia-slurm/roots or $SIA_SLURM_ROOTS; dev/sia_slurm_dev/roots.py).
# slurmdbd and mariadb-server: Slurm accounting in the dev cluster (`dev-cluster up --accounting`,
# dev/sia_slurm_dev/slurmdbd.py); the dev cluster starts and stops them itself.
packages="slurmctld slurmd slurm-client munge chromium debootstrap slurmdbd mariadb-server"
missing=0
for program in slurmctld slurmd scontrol sinfo squeue sbatch munged mungekey chromium debootstrap \
    slurmdbd mariadbd sacctmgr; do
    command -v "$program" >/dev/null 2>&1 || [ -x "/usr/sbin/$program" ] || missing=1
done
if [ "$missing" = 1 ]; then
    echo "install: apt-get install $packages" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # shellcheck disable=SC2086
    apt-get install -y -qq --no-install-recommends $packages >/dev/null
fi

export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1
pip() { python3 -m pip "$@"; }
# torch==2.13.0 resolves to the CPU wheel on these machines; an unpinned torch pulls CUDA.
python3 -c "import torch" 2>/dev/null || pip install -q torch==2.13.0
# the lightning extra's tests run in CI; the constraint keeps lightning from replacing the
# installed torch (a CPU wheel) with another build
constraint=$(mktemp)
trap 'rm -f "$constraint"' EXIT
python3 -c "import torch; print(f'torch=={torch.__version__}')" >"$constraint"
pip install -q -c "$constraint" -e ".[train,lightning,dev,docs]"
# The dev cluster is a distribution of its own (dev/: sia-slurm-dev), so that a site's
# `pip install sia-slurm` carries none of it; its requirements are sia-slurm's, just installed.
pip install -q --no-deps -e ./dev
echo "install: done ($(slurmctld -V), $(python3 --version), sia-slurm $(python3 -c 'import sia_slurm, sia_slurm_dev; print(sia_slurm.__version__)'))" >&2
