#!/usr/bin/env bash
# Set up and run the offline demo (README command 1): a Docker engine for the sandboxes, the
# package, then the grids on the embedded solver model, each ending with a report: the reference
# ladder; hermes-agent and openclaw in every row (memory on and off, asked to store, the program
# procedure and its wiped twin) with the stores inspector's account; prime-agent's rows when
# its source is at hand (CARC_PRIME_AGENT_SOURCE, or ../shared/vendor); and ARC-AGI-3 games level
# by level through the official engine when games are at hand (CARC_ARC3_GAMES, or ../shared/vendor).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/docker-up.sh
python3 -m pip install --quiet -e .
source scripts/vendor-env.sh
carc grid run examples/offline-demo.yaml "$@"
carc grid run examples/offline-demo-harnesses.yaml
if [ -n "${CARC_PRIME_AGENT_SOURCE:-}" ]; then
  carc grid run examples/offline-demo-prime-agent.yaml
else
  echo "prime-agent's rows skipped: set CARC_PRIME_AGENT_SOURCE to its source tarball (see docs/harnesses/prime-agent.md)"
fi
if [ -n "${CARC_ARC3_GAMES:-}" ]; then
  carc grid run examples/arc3-demo.yaml
else
  echo "the arc3 demo skipped: set CARC_ARC3_GAMES to an ARC-AGI-3 environment_files folder (carc arc3 fetch DIR downloads the public games)"
fi
