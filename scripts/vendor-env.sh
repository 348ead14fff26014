# Sourced by scripts/test.sh and scripts/demo.sh: other projects' files beside the repository
# (../shared/vendor/README.md) are used when present, so their live parts run here too:
# prime-agent's source at the pinned commit, a Re-ARC checkout and two ARC-AGI-3 games. A variable
# already set wins.
vendor="$(dirname "$PWD")/shared/vendor"
if [ -f "$vendor/prime-agent-e319a66d7.tar.gz" ] && [ -z "${CARC_PRIME_AGENT_SOURCE:-}" ]; then
  export CARC_PRIME_AGENT_SOURCE="$vendor/prime-agent-e319a66d7.tar.gz"
fi
if [ -d "$vendor/re-arc" ] && [ -z "${CARC_REARC_PATH:-}" ]; then
  export CARC_REARC_PATH="$vendor/re-arc"
fi
if [ -d "$vendor/arc-agi-3/environment_files" ] && [ -z "${CARC_ARC3_GAMES:-}" ]; then
  export CARC_ARC3_GAMES="$vendor/arc-agi-3/environment_files"
fi
