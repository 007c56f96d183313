#!/usr/bin/env bash
# Create .venv (if missing) and install kplan into it, with the extras named.
#   scripts/setup.sh              the planner only (no torch, no cloud SDKs): kplan estimate,
#                                 simulate, catalog, model, launch --dry-run, status, report
#   scripts/setup.sh torch        + PyTorch 2.13.0 (CPU build): kplan profile, kplan launch on
#                                 this machine
#   scripts/setup.sh fit report   + scikit-learn (kplan launch --explore), matplotlib
#                                 (kplan report --html); aws, gcp: the cloud SDKs
#   scripts/setup.sh dev          everything the tests need: torch, every extra, the dev tools
# Extras add up: `scripts/setup.sh torch fit report` installs all three.
set -euo pipefail
cd "$(dirname "$0")/.."
extras=()
for word in "$@"; do
    case "$word" in
        torch | fit | report | aws | gcp) extras+=("$word") ;;
        dev) extras+=(dev torch) ;;
        *)
            echo "error: unknown set-up '$word'" >&2
            echo "hint: scripts/setup.sh [torch] [fit] [report] [aws] [gcp] [dev]" >&2
            exit 2
            ;;
    esac
done
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
# setuptools too: kplan launch builds kplan's wheel for the nodes with the venv's own
# setuptools (a Python 3.11 venv starts with 65, older than pyproject.toml's build requirement).
.venv/bin/python -m pip install --quiet --upgrade pip "setuptools>=77"
target="."
if [ "${#extras[@]}" -gt 0 ]; then
    target=".[$(IFS=,; echo "${extras[*]}")]"
fi
if [[ " ${extras[*]-} " == *" torch "* ]]; then
    # Pinned: any other version, or an unpinned install, pulls several GB of CUDA packages.
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
fi
# Built with the venv's setuptools (no isolated build env: faster); setuptools' notice that
# every editable install prints ("Editable installation... folders in your working directory
# with the same name as your package") is silenced: here that folder is the package.
PYTHONWARNINGS="ignore:Editable installation" \
    .venv/bin/python -m pip install --quiet --no-build-isolation -e "$target"
