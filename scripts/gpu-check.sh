#!/usr/bin/env bash
# The one GPU-machine check: build against that machine's torch, run the tests (gpu-labelled
# ones included), compute-sanitizer on a short pipelined run, and the seg benchmark beside the
# Python reference loops in the same run. Logs and JSON go to OUT.
# Usage: scripts/gpu-check.sh OUT [phase...]   phases: build test sanitize bench (default: all)
# The reference loops are read from $TANDEM_REFERENCE_DIR, else ../shared/reference, else .ref/.
set -uo pipefail
OUT=${1:?usage: scripts/gpu-check.sh OUT [build test sanitize bench]}
shift
PHASES=${*:-build test sanitize bench}
mkdir -p "$OUT"
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${TANDEM_BUILD_DIR:-build-gpu}
LOG="$OUT/gpu-check.log"
RAW=$(mktemp -d)
BS_LIST=${TANDEM_BENCH_BS:-8 32 128}
export PYTHONUNBUFFERED=1

REF=${TANDEM_REFERENCE_DIR:-}
for d in "$REF" ../shared/reference .ref; do
  if [ -n "$d" ] && [ -f "$d/seed_reference.py" ]; then REF=$d; break; fi
done

say() { echo "== $(date +%H:%M:%S) $*" | tee -a "$LOG"; }
status=0

has_phase() { [[ " $PHASES " == *" $1 "* ]]; }

if has_phase build; then
  say "build ($BUILD)"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >>"$LOG" 2>&1
  PREFIX=$(python3 -c 'import torch;print(torch.utils.cmake_prefix_path)' 2>/dev/null)
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release &&
         cmake --build "$BUILD" -j "$(nproc)"; } >"$RAW/build.log" 2>&1; then
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
fi

if has_phase sanitize; then
  for tool in ${TANDEM_SANITIZERS:-racecheck synccheck memcheck}; do
    say "compute-sanitizer --tool $tool on a short pipelined seg run"
    timeout ${TANDEM_SANITIZER_TIMEOUT:-240} compute-sanitizer --tool "$tool" --print-limit 20 \
      "$TANDEM" bench --scenario seg --mode pipelined --batch-size 2 --steps 2 --warmup 1 \
      --workers 2 --no-cudnn-benchmark >"$RAW/sanitizer-$tool.log" 2>&1
    rc=$?
    tail -4 "$RAW/sanitizer-$tool.log" | tee -a "$LOG"
    say "$tool exit $rc"
    [ $rc -eq 0 ] || status=1
  done
fi

if has_phase bench; then
  [ -f "$REF/seed_reference.py" ] || { say "no reference loops found (set TANDEM_REFERENCE_DIR)"; exit 1; }
  bs_csv=$(echo $BS_LIST | tr ' ' ',')
  say "tandem bench seg, bs $bs_csv"
  for bs in $BS_LIST; do
    for mode in serial pipelined; do
      "$TANDEM" bench --scenario seg --mode "$mode" --batch-size "$bs" --steps 100 --warmup 10 \
        --workers 8 --json "$RAW/tandem-seg-$mode-$bs.json" >>"$LOG" 2>&1 || status=1
    done
  done
  say "tandem bench seg pipelined, variants for comparison (not in seg.json)"
  for bs in $BS_LIST; do
    "$TANDEM" bench --scenario seg --mode pipelined --batch-size "$bs" --no-cudnn-benchmark \
      --workers 8 --json "$RAW/variant-nocudnnbench-$bs.json" 2>&1 | grep -A1 "^scenario  mode" | tail -1 | sed 's/$/  (no cuDNN autotuning)/' | tee -a "$LOG"
    "$TANDEM" bench --scenario seg --mode pipelined --batch-size "$bs" --train-priority normal \
      --workers 8 --json "$RAW/variant-normalprio-$bs.json" 2>&1 | grep -A1 "^scenario  mode" | tail -1 | sed 's/$/  (train lane normal priority)/' | tee -a "$LOG"
  done
  say "python seed_reference.py seg --bs $bs_csv --modes serial,pipelined"
  python3 "$REF/seed_reference.py" seg --bs "$bs_csv" --modes serial,pipelined \
    --json "$RAW/python-seg.json" >>"$LOG" 2>&1 || status=1
  say "python seed_reference.py floor --bs $bs_csv"
  python3 "$REF/seed_reference.py" floor --bs "$bs_csv" --json "$RAW/python-floor.json" \
    >>"$LOG" 2>&1 || status=1
  say "compare"
  python3 bench/compare.py --scenario seg --tandem "$RAW"/tandem-seg-*.json \
    --python "$RAW/python-seg.json" --floor "$RAW/python-floor.json" \
    --command "scripts/gpu-check.sh OUT bench (tandem bench --scenario seg --mode {serial,pipelined} --batch-size {$bs_csv} --steps 100 --warmup 10 --workers 8; seed_reference.py seg --bs $bs_csv --modes serial,pipelined; seed_reference.py floor --bs $bs_csv)" \
    --out "$OUT/seg.json" 2>&1 | tee -a "$LOG" || status=1
fi

tar -C "$RAW" -czf "$OUT/raw.tar.gz" . 2>/dev/null
say "done, status $status"
exit $status
