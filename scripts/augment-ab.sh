#!/bin/bash
# A/B of the fused augmentation kernel on the GPU machine: this tree (already built by
# gpu-check.sh into $TANDEM_BUILD_DIR) against other source trees (e.g. `git archive REV`),
# built here, in one call: alternating augment-bench rounds (the same-call ratio is what counts:
# times drift between calls), the augment and cls GPU tests of this tree, and racecheck and
# memcheck of the augment kernel under those tests, for every tree.
# Usage: scripts/augment-ab.sh OUT OTHER_SOURCE_DIR[,OTHER_SOURCE_DIR...] [rounds]
# (the log names the others other1, other2, ... in the order given)
# Env: AB_ARGS: more augment-bench arguments for every tree (e.g. "--sampling auto,staged");
# AB_THIS_ARGS: for this tree only; AB_OTHER<n>_ARGS: for other<n> only; AB_SANITIZE=0 skips
# the sanitizers; AB_SANITIZE_FILTER: their gtest filter.
# The augment tests live in tests/tandem_core_tests since the workload API, in tests/tandem_tests
# before it (e.g. commit d529f74); each tree's own is used.
set -uo pipefail
USAGE="usage: scripts/augment-ab.sh OUT OTHER_SOURCE_DIR[,OTHER_SOURCE_DIR...] [rounds]"
OUT=${1:?$USAGE}
OTHERS=${2:?$USAGE}
ROUNDS=${3:-3}
THIS_BUILD=${TANDEM_BUILD_DIR:-build-gpu}
LOG="$OUT/ab.log"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
# test_target SOURCE_DIR: the test executable holding AugmentGpuTest in that tree.
test_target() {
  if grep -qs tandem_core_tests "$1/tests/CMakeLists.txt"; then echo tandem_core_tests; else echo tandem_tests; fi
}
SIDES=(this:"$THIS_BUILD")
TESTS=("$(test_target "$ROOT")")  # beside SIDES: each side's test executable
n=0
IFS=, read -r -a other_dirs <<<"$OTHERS"
for other in "${other_dirs[@]}"; do
  n=$((n + 1))
  build=/tmp/tandem-ab-other$n
  # The sanitizers run each tree's tests; without them only the CLI (target tandem_cli) is needed.
  TARGETS=(tandem_cli)
  [ "${AB_SANITIZE:-1}" = 0 ] || TARGETS+=("$(test_target "$other")")
  if ! { cmake -S "$other" -B "$build" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release &&
         cmake --build "$build" -j "$(nproc)" --target "${TARGETS[@]}"; } >"$OUT/ab-build.log" 2>&1; then
    echo "building $other failed (ab-build.log)" | tee -a "$LOG"
    exit 1
  fi
  echo "== other$n: $other" >>"$LOG"
  SIDES+=(other$n:"$build")
  TESTS+=("$(test_target "$other")")
done
rm -f "$OUT/ab-build.log"
for round in $(seq "$ROUNDS"); do
  for side in "${SIDES[@]}"; do
    echo "== round $round, ${side%%:*}" >>"$LOG"
    name=${side%%:*}
    own="AB_${name^^}_ARGS"  # AB_THIS_ARGS, AB_OTHER1_ARGS, ...
    read -r -a extra <<<"${AB_ARGS:-} ${!own:-}"
    "${side#*:}/tandem" augment-bench --batch-sizes 32,128 --repeats 100 "${extra[@]}" 2>&1 |
      grep -E "^gpu |error" >>"$LOG"
  done
done
echo "== this tree: augment and cls GPU tests" >>"$LOG"
# The summary line and any failure (a plain tail cut the summary off behind ctest's time lines).
(cd "$THIS_BUILD" && ctest -L gpu -R "Augment|Cls" --output-on-failure) 2>&1 |
  grep -E "tests passed|tests failed|\(Failed\)|Failure|Expected|Which is" >>"$LOG"
[ "${AB_SANITIZE:-1}" = 0 ] && { cat "$LOG"; exit 0; }
for i in "${!SIDES[@]}"; do
  side=${SIDES[$i]}
  tests=${TESTS[$i]}
  for tool in racecheck memcheck; do
    echo "== $tool, ${side%%:*}: AugmentGpuTest.*, augment_kernel only ($tests)" >>"$LOG"
    timeout 300 compute-sanitizer --tool "$tool" --kernel-name kns=augment_kernel --print-limit 10 \
      "${side#*:}/tests/$tests" --gtest_filter="${AB_SANITIZE_FILTER:-AugmentGpuTest.*}" 2>&1 |
      grep -E "SUMMARY|PASSED|FAILED|Error|error" | head -12 >>"$LOG"
  done
done
cat "$LOG"
