#!/usr/bin/env bash
# Set up everything the tests need (torch CPU build, dev tools) and run the test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh dev
.venv/bin/python -m pytest "$@"
