#!/bin/sh
# Builds prime-agent in $1 with the image's Node, offline: upstream's build scripts (root
# package.json "build") minus the model-catalog refresh (network) and npm (not in the image):
# tsgo per package, then coding-agent's copy-assets and esbuild bundle (dist/bundle/cli.js).
set -eu
cd "$1"
export PATH="$1/node_modules/.bin:$PATH" TMPDIR=/tmp/prime-build
mkdir -p "$TMPDIR"
for package in tui ai agent coding-agent; do
  (cd "packages/$package" && tsgo -p tsconfig.build.json)
done
cd packages/coding-agent
chmod +x dist/cli.js
sh -c "$(node -p 'require("./package.json").scripts["copy-assets"]')"
node scripts/bundle.mjs
rm -rf "$TMPDIR"
