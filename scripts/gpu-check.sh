#!/usr/bin/env bash
# The GPU machine's check: build against that machine's torch, run the tests (gpu-labelled ones
# included) and compute-sanitizer on a short pipelined run. Logs go to OUT (gpu-check.log; the
# build's and the sanitizers' whole output in raw-check.tar.gz).
# Usage: scripts/gpu-check.sh OUT [phase...]
#   phases: build test gputest sanitize (default: build test sanitize; gputest runs only the
#   gpu-labelled tests)
#   env: TANDEM_BUILD_DIR (build-gpu), TANDEM_BUILD_TARGETS (all; e.g. tandem: the CLI alone),
#        TANDEM_DEBS (.ref/debs: the .debs
#        scripts/fetch-gpu-debs.sh downloaded), TANDEM_GPUTEST_REGEX (gputest: only the tests whose
#        names match, ctest -R), TANDEM_SANITIZE_ARGS (`tandem bench` arguments of the runs,
#        separated by ';'), TANDEM_SANITIZERS (default "racecheck synccheck memcheck"),
#        TANDEM_SANITIZER_FLAGS (e.g. "--kernel-regex kns=augment"), TANDEM_SANITIZER_TIMEOUT (240)
# The benchmarks run on this build afterwards, into the same OUT (gpu-check.log continues):
#   python3 benchmarks/gpu_check.py run --out OUT --phases seg cls augment graphs sweep
#   python3 benchmarks/gpu_check.py PHASE --out OUT [options]   (--help lists the phases)
#   (with --build DIR where TANDEM_BUILD_DIR named another build than build-gpu)
set -uo pipefail
OUT=${1:?usage: scripts/gpu-check.sh OUT [build test gputest sanitize]}
shift
PHASES=" ${*:-build test sanitize} "
for phase in $PHASES; do
  case $phase in
    build | test | gputest | sanitize) ;;
    *) echo "gpu-check: phase '$phase' is not one of build, test, gputest, sanitize; the" \
         "benchmarks run with: python3 benchmarks/gpu_check.py run --out OUT --phases $phase" >&2
       exit 2 ;;
  esac
done
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # the script works from the repository root
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT" || exit 1
BUILD=${TANDEM_BUILD_DIR:-build-gpu}
LOG="$OUT/gpu-check.log"
RAW=$(mktemp -d)
export PYTHONUNBUFFERED=1

say() { echo "== $(date +%H:%M:%S) $*" | tee -a "$LOG"; }
status=0

has_phase() { [[ " $PHASES " == *" $1 "* ]]; }

if has_phase build; then
  say "build ($BUILD)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
  PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  # The GPU machine has no TurboJPEG and no network: scripts/fetch-gpu-debs.sh downloads the
  # .debs here into .ref/debs (carry it); they are unpacked next to the build and named to CMake.
  DEPS_ARGS=()
  DEBS=${TANDEM_DEBS:-.ref/debs}
  if [ ! -f /usr/include/turbojpeg.h ] && ls "$DEBS"/libturbojpeg0*.deb >/dev/null 2>&1; then
    DEPS="$ROOT/$BUILD-deps"
    mkdir -p "$DEPS"
    for deb in "$DEBS"/libturbojpeg0*.deb; do dpkg -x "$deb" "$DEPS"; done
    DEPS_ARGS=(-DTURBOJPEG_INCLUDE_DIR="$DEPS/usr/include"
               -DTURBOJPEG_LIBRARY="$DEPS/usr/lib/x86_64-linux-gnu/libturbojpeg.so")
    say "TurboJPEG from $DEBS (unpacked into $DEPS)"
  fi
  # libjpeg's own API (a JPEG's window decoded by skipping and cropping scanlines), the same way.
  if [ ! -f /usr/include/jpeglib.h ] && ls "$DEBS"/libjpeg62-turbo*.deb >/dev/null 2>&1; then
    DEPS="$ROOT/$BUILD-deps"
    mkdir -p "$DEPS"
    for deb in "$DEBS"/libjpeg62-turbo*.deb; do dpkg -x "$deb" "$DEPS"; done
    cp "$DEPS"/usr/include/x86_64-linux-gnu/jconfig.h "$DEPS/usr/include/"  # beside jpeglib.h
    DEPS_ARGS+=(-DJPEG_INCLUDE_DIR="$DEPS/usr/include"
                -DJPEG_LIBRARY="$DEPS/usr/lib/x86_64-linux-gnu/libjpeg.so"
                -DJPEG_LIBRARY_RELEASE="$DEPS/usr/lib/x86_64-linux-gnu/libjpeg.so")
    say "libjpeg from $DEBS (unpacked into $DEPS)"
  fi
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
           ${DEPS_ARGS[@]+"${DEPS_ARGS[@]}"} &&
         cmake --build "$BUILD" -j "$(nproc)" --target ${TANDEM_BUILD_TARGETS:-all}; } \
       >"$RAW/build.log" 2>&1; then
    tail -60 "$RAW/build.log" | tee -a "$LOG"
    say "BUILD FAILED"
    exit 1
  fi
  say "build ok"
fi
TANDEM="$BUILD/tandem"

if has_phase test; then
  say "tests (all labels, gpu included)"
  (cd "$BUILD" && ctest --output-on-failure -j 2) >>"$LOG" 2>&1 || { status=1; say "TESTS FAILED"; }
  tail -5 "$LOG" | grep -E "tests passed|tests failed" || true
elif has_phase gputest; then
  say "tests labelled gpu"
  (cd "$BUILD" && ctest --output-on-failure -L gpu --timeout 180 \
     ${TANDEM_GPUTEST_REGEX:+-R "$TANDEM_GPUTEST_REGEX"}) >>"$LOG" 2>&1 || { status=1; say "TESTS FAILED"; }
  grep -E "tests passed|tests failed|\(Failed\)" "$LOG" | tail -12 || true
fi

# A short pipelined run by default; TANDEM_SANITIZE_ARGS picks others (e.g. graphed modes),
# several separated by ';'.
SANITIZE_ARGS=${TANDEM_SANITIZE_ARGS:---workload seg --mode pipelined --batch-size 2 --steps 2 --warmup 1 --workers 2 --no-cudnn-benchmark}
if has_phase sanitize; then
  IFS=';' read -ra sanitize_runs <<<"$SANITIZE_ARGS"
  run_index=0
  for args in "${sanitize_runs[@]}"; do
    run_index=$((run_index + 1))
    for tool in ${TANDEM_SANITIZERS:-racecheck synccheck memcheck}; do
      say "compute-sanitizer --tool $tool on: tandem bench $args"
      # shellcheck disable=SC2086  # the flags and the run's arguments are several words each
      timeout ${TANDEM_SANITIZER_TIMEOUT:-240} compute-sanitizer --tool "$tool" --print-limit 20 \
        ${TANDEM_SANITIZER_FLAGS:-} \
        "$TANDEM" bench $args >"$RAW/sanitizer-$run_index-$tool.log" 2>&1
      rc=$?
      tail -4 "$RAW/sanitizer-$run_index-$tool.log" | tee -a "$LOG"
      say "$tool exit $rc"
      [ $rc -eq 0 ] || status=1
    done
  done
fi

tar -C "$RAW" -czf "$OUT/raw-check.tar.gz" . 2>/dev/null
say "done, status $status"
exit $status
