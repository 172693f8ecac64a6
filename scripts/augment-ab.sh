#!/bin/bash
# A/B of the fused augmentation kernel on the GPU machine: this tree (already built by
# gpu-check.sh into $TANDEM_BUILD_DIR) against another source tree (e.g. `git archive REV`),
# built here, in one call: alternating augment-bench rounds (the same-call ratio is what counts:
# times drift between calls), the augment and cls GPU tests of this tree, and racecheck and
# memcheck of the augment kernel under those tests, for both trees.
# Usage: scripts/augment-ab.sh OUT OTHER_SOURCE_DIR [rounds]
# Env: AB_THIS_ARGS: more augment-bench arguments for this tree only (e.g. "--sampling
# gather,staged"); AB_SANITIZE=0 skips the sanitizers; AB_SANITIZE_FILTER: their gtest filter.
set -uo pipefail
OUT=${1:?usage: scripts/augment-ab.sh OUT OTHER_SOURCE_DIR [rounds]}
OTHER=${2:?usage: scripts/augment-ab.sh OUT OTHER_SOURCE_DIR [rounds]}
ROUNDS=${3:-3}
THIS_BUILD=${TANDEM_BUILD_DIR:-build-gpu}
OTHER_BUILD=/tmp/tandem-ab-other
LOG="$OUT/ab.log"
PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)')
if ! { cmake -S "$OTHER" -B "$OTHER_BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$OTHER_BUILD" -j "$(nproc)" --target tandem tandem_tests; } >"$OUT/ab-build.log" 2>&1; then
  echo "building $OTHER failed (ab-build.log)" | tee -a "$LOG"
  exit 1
fi
rm -f "$OUT/ab-build.log"
for round in $(seq "$ROUNDS"); do
  for side in this:"$THIS_BUILD" other:"$OTHER_BUILD"; do
    echo "== round $round, ${side%%:*}" >>"$LOG"
    extra=()
    [ "${side%%:*}" = this ] && read -r -a extra <<<"${AB_THIS_ARGS:-}"
    "${side#*:}/tandem" augment-bench --batch-sizes 32,128 --repeats 100 "${extra[@]}" 2>&1 |
      grep -E "^gpu |error" >>"$LOG"
  done
done
echo "== this tree: augment and cls GPU tests" >>"$LOG"
# The summary line and any failure (a plain tail cut the summary off behind ctest's time lines).
(cd "$THIS_BUILD" && ctest -L gpu -R "Augment|Cls" --output-on-failure) 2>&1 |
  grep -E "tests passed|tests failed|\(Failed\)|Failure|Expected|Which is" >>"$LOG"
[ "${AB_SANITIZE:-1}" = 0 ] && { cat "$LOG"; exit 0; }
for side in this:"$THIS_BUILD" other:"$OTHER_BUILD"; do
  for tool in racecheck memcheck; do
    echo "== $tool, ${side%%:*}: AugmentGpuTest.*, augment_kernel only" >>"$LOG"
    timeout 300 compute-sanitizer --tool "$tool" --kernel-name kns=augment_kernel --print-limit 10 \
      "${side#*:}/tests/tandem_tests" --gtest_filter="${AB_SANITIZE_FILTER:-AugmentGpuTest.*}" 2>&1 |
      grep -E "SUMMARY|PASSED|FAILED|Error|error" | head -12 >>"$LOG"
  done
done
cat "$LOG"
