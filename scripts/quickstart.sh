#!/usr/bin/env bash
# Set up kplan (planner only) and run the main job: plan ImageNet/ResNet-50 on every cloud.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/kplan estimate --example imagenet-resnet50 "$@"
echo "kplan is in .venv: \`source .venv/bin/activate\` (or type .venv/bin/kplan); README.md has a tour" >&2
