#!/usr/bin/env bash
# The README's test command: set up a fresh machine if needed, build, run every test.
# GPU tests (label `gpu`) skip themselves where there is no CUDA device.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/build.sh"
source "$root/scripts/env.sh"
ctest_bin=$(dirname "$TANDEM_CMAKE")/ctest
[ -x "$ctest_bin" ] || ctest_bin=ctest
cd "${TANDEM_BUILD_DIR:-$root/build}"
"$ctest_bin" --output-on-failure -j 2 "$@"
