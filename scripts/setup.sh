#!/usr/bin/env bash
# Create .venv (if missing) and install kplan into it.
#   scripts/setup.sh          the planner only (no torch, no cloud SDKs)
#   scripts/setup.sh dev      everything the tests need: torch==2.13.0 (CPU), dev tools
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
if [ "${1:-}" = "dev" ]; then
    # Pinned: any other version, or an unpinned install, pulls several GB of CUDA packages.
    .venv/bin/python -m pip install --quiet "torch==2.13.0"
    .venv/bin/python -m pip install --quiet -e ".[dev,torch]"
else
    .venv/bin/python -m pip install --quiet -e .
fi
