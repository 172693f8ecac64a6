#!/usr/bin/env bash
# Bootstraps (if needed) and builds tandem into ./build (or $TANDEM_BUILD_DIR): everything, or
# the targets TANDEM_BUILD_TARGETS names.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/env.sh"
build=${TANDEM_BUILD_DIR:-$root/build}
# ccache keys with paths relative to the checkout: a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$root}
echo "[build] LibTorch from $TANDEM_TORCH_PREFIX" >&2
"$TANDEM_CMAKE" -S "$root" -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$TANDEM_TORCH_PREFIX" \
  -DCMAKE_BUILD_TYPE=Release >/dev/null
# TANDEM_BUILD_TARGETS: only these (e.g. "tandem_cli", the CLI: what run.sh runs); default all.
# shellcheck disable=SC2086  # several targets are several words
"$TANDEM_CMAKE" --build "$build" -j "$(nproc)" ${TANDEM_BUILD_TARGETS:+--target $TANDEM_BUILD_TARGETS}
