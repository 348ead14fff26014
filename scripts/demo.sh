#!/usr/bin/env bash
# Set up and run the offline demo (README command 1): a Docker engine for the sandboxes, the
# package, then two grids on the embedded solver model, each ending with a report: the reference
# ladder, and hermes-agent + openclaw with memory on and off on a short stream.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/docker-up.sh
python3 -m pip install --quiet -e .
carc grid run examples/offline-demo.yaml "$@"
# the harness grid: hermes-agent and openclaw (real packages, in Docker), memory on and off
carc grid run examples/offline-demo-harnesses.yaml
