#!/usr/bin/env bash
# Set up and run the offline demo grid (README command 1): a Docker engine for the program
# checks' sandbox, the package, then the grid on the embedded solver model, ending with a report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/docker-up.sh
python3 -m pip install --quiet -e .
carc grid run examples/offline-demo.yaml "$@"
