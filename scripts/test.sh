#!/usr/bin/env bash
# Set up and run the tests on a fresh machine (README command 2; .ci/run calls this).
#   scripts/test.sh           every test, as CI runs them (starts Docker, builds the images)
#   scripts/test.sh --fast    the fast tier for day-to-day work: no Docker, no server, no whole
#                             grid, no browser (tests/conftest.py); installs carc, nothing else
# Other arguments go to pytest. Both print the 25 slowest tests and the time per tier. The fast
# tier runs on two pytest-xdist workers, a module to a worker; CARC_TEST_WORKERS=N runs the whole
# suite on N (tests/conftest.py says which modules share one; docs/testing.md what two workers
# measured), and without it the suite runs in one process, as CI runs it.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --fast "* ]]; then
  python3 -m pip install --quiet -e '.[test]'
  exec python3 -m pytest -q --durations=25 -n "${CARC_TEST_WORKERS:-2}" --dist loadgroup "$@"
fi
# Headless Chromium for the report's browser test (Debian's package; no browser download).
if ! command -v chromium >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq chromium >/dev/null
fi
# Debian's python3: host programs (sandbox.engine process) run as nobody when the tests run as
# root, and nobody cannot enter a /root/.pyenv interpreter.
if [ "$(id -u)" = 0 ] && [ ! -x /usr/bin/python3 ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq python3-minimal >/dev/null
fi
# A real Docker engine for the sandbox, proxy and security tests (never mocked).
bash scripts/docker-up.sh
python3 -m pip install --quiet -e '.[test]'
# prime-agent's source and Re-ARC from ../shared/vendor when present (CARC_PRIME_AGENT_SOURCE, CARC_REARC_PATH).
source scripts/vendor-env.sh
# Images the Docker tests use (offline base when no registry answers), harness images included
# (hermes-agent from a host wheelhouse, openclaw from the host npm, prime-agent from its source
# when one is set); cached by content hash.
images=(base proxy hermes-agent openclaw)
if [ -n "${CARC_PRIME_AGENT_SOURCE:-}" ]; then
  images+=(prime-agent)
fi
carc images build "${images[@]}"
if [ -n "${CARC_TEST_WORKERS:-}" ]; then
  exec python3 -m pytest -q --durations=25 -n "$CARC_TEST_WORKERS" --dist loadgroup "$@"
fi
python3 -m pytest -q --durations=25 "$@"
