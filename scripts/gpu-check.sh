#!/usr/bin/env bash
# The one GPU-machine check: build against that machine's torch, run the tests (gpu-labelled
# ones included), compute-sanitizer on a short pipelined run, and the seg benchmark beside the
# Python reference loops in the same run. Logs and JSON go to OUT.
# Usage: scripts/gpu-check.sh OUT [phase...]
#   phases: build test gputest sanitize seg cls augment mlp graphs sweep pair profile profile-mlp
#   redesign data train photos ddp gathercost package python decode pybench compile trainer-ab runsh
#   (default: build test sanitize seg cls augment graphs sweep; "bench" means seg; gputest runs
#   only the gpu-labelled tests; graphs includes mlp)
#   Runs use the workload CLI (tandem bench --workload W --mode M [--param K=V]); the Python
#   reference's cls modes are compared with tandem's cls serial mode: cpu_aug with
#   --param augment=cpu (the loader's workers augment), gpu_aug without; its mlp eager loop with
#   tandem's mlp serial mode.
#   env: TANDEM_BENCH_BS (seg, default "8 32 128"), TANDEM_CLS_BS (default "32 128"),
#        TANDEM_SANITIZERS (default "racecheck synccheck memcheck"), TANDEM_SANITIZE_ARGS (runs
#        separated by ';'), TANDEM_SANITIZER_FLAGS (e.g. "--kernel-regex kns=augment"),
#        TANDEM_MLP_ROUNDS (3), TANDEM_SWEEP_BS ("8,32,128"), TANDEM_SWEEP_ROUNDS (1: each
#        point's median over that many runs), TANDEM_SWEEP_SCENARIOS ("seg cls"),
#        TANDEM_LAUNCH_BS ("1 2"),
#        TANDEM_LAUNCH_ROUNDS (3),
#        TANDEM_VARIANTS=1 (extra seg runs without cuDNN autotuning / with a normal-priority lane)
#   pair: pipelined vs pipelined+graphed of one scenario and batch size, alternating on fresh
#        instances, with and without cuDNN autotuning and with a normal-priority train lane;
#        medians and each run's stage device times (pair.txt in OUT). env TANDEM_PAIR_SCENARIO
#        (seg), TANDEM_PAIR_BS (8), TANDEM_PAIR_ROUNDS (3), TANDEM_PAIR_VARIANTS ("bench nobench
#        normalprio"; also streamprio), TANDEM_PAIR_NCU=1 (also each mode's
#        kernels under ncu, one at a time: names, counts and GPU times, pair-kernels.txt)
#   profile: ncu of the augment kernel (full set, source counters; profile-augment.txt in OUT);
#   profile-mlp: per-kernel GPU times of the mlp step, tandem beside Python (profile-mlp.txt)
#   redesign: scripts/redesign-ab.sh OUT ${TANDEM_OLD_TREE:-.ref/old}: this tree against a source
#        tree of commit d529f74 (the scenario CLI), alternating rounds, redesign.json in OUT (its
#        env: AB_ROUNDS, AB_CELLS, AB_PHASE, AB_REBUILD, ...; see that script)
# The Python reference loops are bench/python/reference_loops.py.
set -uo pipefail
OUT=${1:?usage: scripts/gpu-check.sh OUT [build test sanitize seg cls augment]}
shift
PHASES=${*:-build test sanitize seg cls augment graphs sweep}
PHASES=" $PHASES "
PHASES=${PHASES// bench / seg }  # the word only: phase pybench stays
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)  # the script works from the repository root
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
BUILD=${TANDEM_BUILD_DIR:-build-gpu}
LOG="$OUT/gpu-check.log"
RAW=$(mktemp -d)
LAUNCH_BS_LIST=${TANDEM_LAUNCH_BS:-1 2}   # seg's launch-bound regime (graphs phase)
BS_LIST=${TANDEM_BENCH_BS:-8 32 128}
CLS_BS_LIST=${TANDEM_CLS_BS:-32 128}
export PYTHONUNBUFFERED=1

LOOPS=bench/python/reference_loops.py  # the Python reference loops

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
                -DJPEG_LIBRARY="$DEPS/usr/lib/x86_64-linux-gnu/libjpeg.so")
    say "libjpeg from $DEBS (unpacked into $DEPS)"
  fi
  if ! { cmake -S . -B "$BUILD" -G Ninja -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_BUILD_TYPE=Release \
           ${DEPS_ARGS[@]+"${DEPS_ARGS[@]}"} &&
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
elif has_phase gputest; then
  say "tests labelled gpu"
  # TANDEM_GPUTEST_REGEX: only the tests whose names match (ctest -R).
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

# One floor run serves every phase: reference_loops.py floor measures seg and cls per batch size.
floor() {
  [ -f "$RAW/python-floor.json" ] && return 0
  local all
  local sizes="$BS_LIST $CLS_BS_LIST"
  has_phase graphs && sizes="$sizes $LAUNCH_BS_LIST"
  all=$(echo $sizes | tr ' ' '\n' | sort -n | uniq | paste -sd, -)
  say "python reference_loops.py floor --bs $all"
  python3 "$LOOPS" floor --bs "$all" --json "$RAW/python-floor.json" \
    >>"$LOG" 2>&1 || status=1
}
need_reference() {
  [ -f "$LOOPS" ] || { say "no $LOOPS: the Python reference loops"; exit 1; }
}

# bench_scenario NAME "RUNS" "PYTHON MODES" "BATCH SIZES": tandem and the Python loops, then
# compare.py (which pairs them: see its PYTHON_TO_TANDEM). A run is a mode, optionally with
# workload parameters after colons: "serial:augment=cpu" is --mode serial --param augment=cpu.
bench_scenario() {
  local scenario=$1 runs=$2 py_modes=$3 sizes=$4
  need_reference
  local bs_csv py_csv run mode tag
  local -a params spec
  bs_csv=$(echo $sizes | tr ' ' ',')
  py_csv=$(echo $py_modes | tr ' ' ',')
  say "tandem bench --workload $scenario, runs $runs, bs $bs_csv"
  for bs in $sizes; do
    for run in $runs; do
      IFS=: read -r -a spec <<<"$run"
      mode=${spec[0]}
      params=()
      for kv in "${spec[@]:1}"; do params+=(--param "$kv"); done
      tag=$(echo "$run" | tr ':=+' '___')  # serial:augment=cpu -> serial_augment_cpu
      "$TANDEM" bench --workload "$scenario" --mode "$mode" "${params[@]}" --batch-size "$bs" \
        --steps 100 --warmup 10 --workers 8 --json "$RAW/tandem-$scenario-$tag-$bs.json" \
        >>"$LOG" 2>&1 || status=1
    done
  done
  say "python reference_loops.py $scenario --bs $bs_csv --modes $py_csv"
  python3 "$LOOPS" "$scenario" --bs "$bs_csv" --modes "$py_csv" \
    --json "$RAW/python-$scenario.json" >>"$LOG" 2>&1 || status=1
  floor
  local shown=""  # serial:augment=cpu -> "serial --param augment=cpu", comma-separated
  for run in $runs; do
    IFS=: read -r -a spec <<<"$run"
    mode=${spec[0]}
    for kv in "${spec[@]:1}"; do mode+=" --param $kv"; done
    shown+=${shown:+,}$mode
  done
  say "compare $scenario"
  python3 bench/compare.py --scenario "$scenario" --tandem "$RAW"/tandem-"$scenario"-*.json \
    --python "$RAW/python-$scenario.json" --floor "$RAW/python-floor.json" \
    --command "scripts/gpu-check.sh OUT $scenario (tandem bench --workload $scenario --mode {$shown} --batch-size {$bs_csv} --steps 100 --warmup 10 --workers 8; reference_loops.py $scenario --bs $bs_csv --modes $py_csv; reference_loops.py floor)" \
    --out "$OUT/$scenario.json" 2>&1 | tee -a "$LOG" || status=1
}

if has_phase seg; then
  bench_scenario seg "serial pipelined" "serial pipelined" "$BS_LIST"
  if [ -n "${TANDEM_VARIANTS:-}" ]; then
    say "tandem bench seg pipelined, variants for comparison (not in seg.json)"
    for bs in $BS_LIST; do
      "$TANDEM" bench --workload seg --mode pipelined --batch-size "$bs" --no-cudnn-benchmark \
        --workers 8 --json "$RAW/variant-nocudnnbench-$bs.json" 2>&1 | grep -E "^seg +[a-z]" | tail -1 | sed 's/$/  (no cuDNN autotuning)/' | tee -a "$LOG"
      "$TANDEM" bench --workload seg --mode pipelined --batch-size "$bs" --train-priority normal \
        --workers 8 --json "$RAW/variant-normalprio-$bs.json" 2>&1 | grep -E "^seg +[a-z]" | tail -1 | sed 's/$/  (train lane normal priority)/' | tee -a "$LOG"
    done
  fi
fi

if has_phase cls; then
  # Python's cpu_aug and gpu_aug loops beside tandem's serial mode, augmenting on the loader's
  # workers (--param augment=cpu) and on the GPU (the default).
  bench_scenario cls "serial:augment=cpu serial pipelined" "cpu_aug gpu_aug pipelined" "$CLS_BS_LIST"
fi

if has_phase augment; then
  need_reference
  bs_csv=$(echo $CLS_BS_LIST | tr ' ' ',')
  say "tandem augment-bench --batch-sizes $bs_csv --sampling auto,staged"
  "$TANDEM" augment-bench --batch-sizes "$bs_csv" --sampling auto,staged \
    --json "$RAW/augment-bench.json" 2>&1 | tee -a "$LOG" || status=1
  floor
  say "compare augment (torchvision's GPU batch transform from reference_loops.py floor)"
  python3 bench/compare.py --scenario augment --tandem "$RAW/augment-bench.json" \
    --floor "$RAW/python-floor.json" --device "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    --command "scripts/gpu-check.sh OUT augment (tandem augment-bench --batch-sizes $bs_csv --sampling auto,staged; reference_loops.py floor)" \
    --out "$OUT/augment.json" 2>&1 | tee -a "$LOG" || status=1
fi

mlp_rounds() {
  local rounds=${TANDEM_MLP_ROUNDS:-3}
  # serial is compared with Python's eager loop, the graphed modes with its graph replay;
  # pipelined is for the record.
  local modes="serial pipelined graphed graphed_k pipelined+graphed"
  say "tandem bench mlp ($modes; 1000 steps) and reference_loops.py mlp, $rounds rounds"
  for round in $(seq "$rounds"); do
    for mode in $modes; do
      "$TANDEM" bench --workload mlp --mode "$mode" --steps 1000 --warmup 100 \
        --json "$RAW/tandem-mlp-${mode//+/_}-$round.json" >>"$LOG" 2>&1 || status=1
    done
    python3 "$LOOPS" mlp --json "$RAW/python-mlp-$round.json" >>"$LOG" 2>&1 || status=1
    # The graphed runs again without the NVML reader thread: what it costs, for the log only
    # (not in graphs.json).
    for mode in graphed pipelined+graphed; do
      "$TANDEM" bench --workload mlp --mode "$mode" --steps 1000 --warmup 100 --no-gpu-monitor 2>&1 |
        grep -E "^mlp " | sed 's/$/  (--no-gpu-monitor)/' | tee -a "$LOG"
    done
  done
  MLP_COMMAND="$rounds rounds of: tandem bench --workload mlp --mode {${modes// /,}} --steps 1000 --warmup 100; reference_loops.py mlp"
}

if has_phase mlp && ! has_phase graphs; then
  need_reference
  mlp_rounds
  python3 bench/compare.py --scenario mlp --tandem "$RAW"/tandem-mlp-*.json \
    --python-rounds "$RAW"/python-mlp-*.json \
    --command "scripts/gpu-check.sh OUT mlp ($MLP_COMMAND)" \
    --out "$OUT/graphs.json" 2>&1 | tee -a "$LOG" || status=1
fi

# One sweep per workload: every mode and auto at each batch size, in one process (serial, the
# baseline, first). It serves the graphs comparison (pipelined+graphed vs pipelined) and
# auto.json (auto vs the best mode).
SWEEP_BS=${TANDEM_SWEEP_BS:-8,32,128}
SWEEP_ROUNDS=${TANDEM_SWEEP_ROUNDS:-1}
if has_phase sweep; then
  for scenario in ${TANDEM_SWEEP_SCENARIOS:-seg cls}; do
    say "tandem sweep --workload $scenario --batch-sizes $SWEEP_BS --rounds $SWEEP_ROUNDS (every mode, then auto)"
    TANDEM_DEBUG=1 TORCH_SHOW_CPP_STACKTRACES=1 timeout 540 "$TANDEM" sweep --workload "$scenario" --batch-sizes "$SWEEP_BS" --modes all,auto --rounds "$SWEEP_ROUNDS" \
      --workers 8 --json "$RAW/sweep-$scenario.json" --csv "$RAW/sweep-$scenario.csv" \
      --svg "$OUT/sweep-$scenario.svg" 2>&1 | tee -a "$LOG" | grep -v "^  done:" | head -40 || status=1
  done
  say "compare auto"
  python3 bench/compare.py --scenario auto --sweep $(ls "$RAW"/sweep-seg.json "$RAW"/sweep-cls.json 2>/dev/null) \
    --device "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)" \
    --command "scripts/gpu-check.sh OUT sweep (tandem sweep --workload {${TANDEM_SWEEP_SCENARIOS:-seg cls}} --batch-sizes $SWEEP_BS --modes all,auto --rounds $SWEEP_ROUNDS --workers 8)" \
    --out "$OUT/auto.json" 2>&1 | tee -a "$LOG" || status=1
  say "a Chrome trace of seg pipelined+graphed, bs 8 (in raw.tar.gz)"
  "$TANDEM" bench --workload seg --mode pipelined+graphed --batch-size 8 --steps 20 --warmup 10 \
    --trace "$RAW/trace-seg-pipelined-graphed-8.json" >>"$LOG" 2>&1 || status=1
  "$TANDEM" bench --workload cls --mode pipelined --batch-size 32 --steps 20 --warmup 10 \
    --trace "$RAW/trace-cls-pipelined-32.json" >>"$LOG" 2>&1 || status=1
fi

if has_phase pair; then
  pair_scenario=${TANDEM_PAIR_SCENARIO:-seg}
  pair_bs=${TANDEM_PAIR_BS:-8}
  pair_rounds=${TANDEM_PAIR_ROUNDS:-3}
  # Variants: bench (cuDNN autotuning, the default), nobench (--no-cudnn-benchmark),
  # normalprio (--train-priority normal), streamprio (CUDA_GRAPHS_USE_NODE_PRIORITY=0: graphs
  # run at the priority of the stream they are launched into, not their nodes'. How the fix was
  # measured before it was made; since commit 902ddb2 GraphedStep instantiates graphs so.)
  pair_variants=${TANDEM_PAIR_VARIANTS:-bench nobench normalprio}
  say "pair: $pair_scenario bs $pair_bs, pipelined vs pipelined+graphed, $pair_rounds rounds of: $pair_variants"
  for round in $(seq "$pair_rounds"); do
    for variant in $pair_variants; do
      flags=() envs=()
      case $variant in
        nobench) flags=(--no-cudnn-benchmark) ;;
        normalprio) flags=(--train-priority normal) ;;
        streamprio) envs=(CUDA_GRAPHS_USE_NODE_PRIORITY=0) ;;
      esac
      for mode in pipelined pipelined+graphed; do
        env "${envs[@]}" "$TANDEM" bench --workload "$pair_scenario" --mode "$mode" \
          --batch-size "$pair_bs" --steps 300 --warmup 20 --workers 8 "${flags[@]}" \
          --json "$RAW/pair-$variant-$mode-$round.json" >>"$LOG" 2>&1 || status=1
      done
    done
  done
  if [ -n "${TANDEM_PAIR_NCU:-}" ]; then
    # Kernel by kernel, serialized by ncu: does a replayed step run the kernels its eager twin
    # runs, for as long? 40 steps in, 4 steps' worth of launches (about 150 per step).
    for mode in pipelined pipelined+graphed; do
      say "ncu: $pair_scenario $mode bs $pair_bs, per-kernel GPU time"
      ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 6000 \
        --launch-count 600 --csv "$TANDEM" bench --workload "$pair_scenario" --mode "$mode" \
        --batch-size "$pair_bs" --steps 100 --warmup 20 --workers 8 --no-gpu-monitor \
        >"$RAW/ncu-pair-$mode.csv" 2>&1 || status=1
    done
    python3 - "$RAW" <<'PY' 2>&1 | tee "$OUT/pair-kernels.txt" | tail -40 | tee -a "$LOG"
import collections, csv, io, os, sys
def load(mode):
    text = open(os.path.join(sys.argv[1], f"ncu-pair-{mode}.csv")).read()
    start = text.find('"ID"')
    rows = list(csv.DictReader(io.StringIO(text[start:]))) if start >= 0 else []
    stats = collections.defaultdict(lambda: [0, 0.0])
    for r in rows:
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = r.get("Metric Unit", "")
        v = float(r["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3,
                 "msecond": 1e3}
        if unit not in scale:
            sys.exit(f"ncu reported gpu__time_duration in '{unit}': expected ns, us or ms")
        us = v * scale[unit]
        key = r["Kernel Name"][:90]
        stats[key][0] += 1
        stats[key][1] += us
    return stats, sum(s[0] for s in stats.values())
a, na = load("pipelined")
b, nb = load("pipelined+graphed")
print(f"kernels profiled: pipelined {na}, pipelined+graphed {nb}")
print(f"{'kernel':90s} {'n eager':>8s} {'us/launch':>10s} {'n graph':>8s} {'us/launch':>10s}")
for k in sorted(set(a) | set(b), key=lambda k: -(a.get(k, [0, 0])[1] + b.get(k, [0, 0])[1])):
    ca, ta = a.get(k, [0, 0.0]); cb, tb = b.get(k, [0, 0.0])
    print(f"{k:90s} {ca:8d} {ta / ca if ca else 0:10.2f} {cb:8d} {tb / cb if cb else 0:10.2f}")
ta = sum(s[1] for s in a.values()) / max(na, 1); tb = sum(s[1] for s in b.values()) / max(nb, 1)
print(f"mean us per launch: pipelined {ta:.2f}, pipelined+graphed {tb:.2f}")
PY
  fi
  python3 - "$RAW" <<'PY' 2>&1 | tee "$OUT/pair.txt" | tee -a "$LOG"
import glob, json, os, re, statistics, sys
runs = {}
for path in sorted(glob.glob(os.path.join(sys.argv[1], "pair-*.json"))):
    variant, mode, rnd = re.match(r"pair-(\w+)-(.+)-(\d+)\.json", os.path.basename(path)).groups()
    r = json.load(open(path))
    runs.setdefault((variant, mode), []).append(r)
    stages = "  ".join(f"{s['name']} {s['device_ms_per_step']:.3f}" for s in r["stages"]
                       if s["device_ms_per_step"] is not None)
    print(f"{variant:10s} {mode:18s} round {rnd}: {r['steps_per_s']:8.2f} steps/s  "
          f"device ms/step: {stages}  util {r['gpu_utilization']}")
for variant in ("bench", "nobench", "normalprio", "streamprio"):
    a, b = runs.get((variant, "pipelined")), runs.get((variant, "pipelined+graphed"))
    if a and b:
        ma = statistics.median(x["steps_per_s"] for x in a)
        mb = statistics.median(x["steps_per_s"] for x in b)
        print(f"{variant:10s} median pipelined {ma:.2f}, pipelined+graphed {mb:.2f}: ratio {mb / ma:.3f}")
PY
fi

if has_phase graphs; then
  need_reference
  launch_csv=$(echo $LAUNCH_BS_LIST | tr ' ' ',')
  # Python's serial loop at these sizes varies by up to 25% between calls: rounds, alternating
  # tandem and Python, and medians (compare.py).
  launch_rounds=${TANDEM_LAUNCH_ROUNDS:-3}
  say "seg at bs $launch_csv, $launch_rounds rounds: tandem serial, pipelined, pipelined+graphed; python serial"
  for round in $(seq "$launch_rounds"); do
    for bs in $LAUNCH_BS_LIST; do
      for mode in serial pipelined pipelined+graphed; do
        "$TANDEM" bench --workload seg --mode "$mode" --batch-size "$bs" --steps 300 --warmup 20 \
          --workers 8 --json "$RAW/tandem-seg-$mode-$bs-$round.json" >>"$LOG" 2>&1 || status=1
      done
    done
    python3 "$LOOPS" seg --bs "$launch_csv" --modes serial \
      --json "$RAW/python-seg-launch-$round.json" >>"$LOG" 2>&1 || status=1
  done
  floor
  mlp_rounds
  say "compare graphs"
  sweeps=$(ls "$RAW"/sweep-seg.json "$RAW"/sweep-cls.json 2>/dev/null)
  python3 bench/compare.py --scenario graphs --tandem "$RAW"/tandem-mlp-*.json "$RAW"/tandem-seg-*.json \
    --python-rounds "$RAW"/python-mlp-*.json --python "$RAW"/python-seg-launch-*.json \
    --floor "$RAW/python-floor.json" ${sweeps:+--sweep $sweeps} \
    --command "scripts/gpu-check.sh OUT sweep graphs ($MLP_COMMAND; $launch_rounds rounds of: tandem bench --workload seg --mode {serial,pipelined,pipelined+graphed} --batch-size {$launch_csv} --steps 300 --warmup 20, reference_loops.py seg --bs $launch_csv --modes serial; reference_loops.py floor; the sweeps of the sweep phase)" \
    --out "$OUT/graphs.json" 2>&1 | tee -a "$LOG" || status=1
fi

if has_phase profile; then
  need_reference
  say "ncu: augment kernel, batch 32 (--set full, source counters)"
  ncu --clock-control none --kernel-name regex:augment_kernel --launch-skip 3 --launch-count 1 \
    --set full --import-source yes -o "$RAW/augment" -f \
    "$TANDEM" augment-bench --batch-sizes 32 --repeats 2 --sampling "${TANDEM_PROFILE_SAMPLING:-auto}" \
    >>"$LOG" 2>&1 || status=1
  { ncu -i "$RAW/augment.ncu-rep" --print-details all
    ncu -i "$RAW/augment.ncu-rep" --page source --print-source sass --csv; } \
    >"$OUT/profile-augment.txt" 2>&1
fi
if has_phase profile-mlp; then
  need_reference
  say "ncu: per-kernel GPU time of mlp steps (tandem serial, Python eager), 60 launches each"
  ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 3000 --launch-count 60 \
    --csv "$TANDEM" bench --workload mlp --mode serial --steps 400 --warmup 10 --no-gpu-monitor \
    >"$OUT/profile-mlp.txt" 2>&1 || status=1
  ncu --clock-control none --metrics gpu__time_duration.sum --launch-skip 3000 --launch-count 60 \
    --csv python3 "$LOOPS" mlp >>"$OUT/profile-mlp.txt" 2>&1 || status=1
  say "mlp timing without the GPU monitor, tandem graphed beside Python, 2 rounds"
  for round in 1 2; do
    "$TANDEM" bench --workload mlp --mode graphed --steps 1000 --warmup 100 --no-gpu-monitor 2>&1 |
      grep -E "^mlp " | tee -a "$LOG"
    python3 "$LOOPS" mlp 2>&1 | tail -2 | tee -a "$LOG"
  done
fi

# The acceptance A/B of the workload API against the scenario CLI (commit d529f74): its own builds
# (build-ab, build-ab-old), its result in OUT/redesign.json beside the others, its log, build log
# and runs in OUT (redesign-ab.log, redesign-build.log, redesign-runs.tar.gz).
if has_phase redesign; then
  old_tree=${TANDEM_OLD_TREE:-.ref/old}
  # Its runs stop inside a device call's 600 s, counted from this script's start (the phases
  # before it included) unless AB_BUDGET_S says otherwise.
  budget=${AB_BUDGET_S:-$((540 - SECONDS))}
  say "redesign: scripts/redesign-ab.sh OUT $old_tree (this tree against commit d529f74; budget $budget s)"
  AB_BUDGET_S=$((budget > 0 ? budget : 0)) bash scripts/redesign-ab.sh "$OUT" "$old_tree" 2>&1 | tee -a "$LOG"
  rc=${PIPESTATUS[0]}
  # 3: every run done, some cell below the ratio: a result (like compare.py's MISS), not a failure.
  case $rc in
    0) say "redesign: every cell PASS" ;;
    3) say "redesign: some cells below the ratio (redesign.json)" ;;
    *) say "redesign FAILED (exit $rc; redesign-ab.log)"; status=1 ;;
  esac
fi

# Prints the generated JPEG ImageFolder's path (TANDEM_DATA_DIR, default /tmp/tandem-imagefolder),
# making it first (TANDEM_DATA_COUNT files, 6000) where it does not exist yet.
image_folder() {
  local dir=${TANDEM_DATA_DIR:-/tmp/tandem-imagefolder}
  if [ ! -d "$dir" ]; then
    say "make_image_folder.py $dir --count ${TANDEM_DATA_COUNT:-6000}" >&2
    python3 scripts/make_image_folder.py "$dir" --count "${TANDEM_DATA_COUNT:-6000}" \
      --classes 10 2>&1 | tail -3 | tee -a "$LOG" >&2
  fi
  echo "$dir"
}

# Real images: a generated JPEG ImageFolder; the Python reference (torchvision
# ImageFolder + DataLoader, PIL / torchvision.io decode) and tandem data-bench in one call;
# data.json in OUT merges both. env TANDEM_DATA_DIR (where the folder goes; kept if it exists),
# TANDEM_DATA_COUNT (6000), TANDEM_DATA_BS ("64 256"), TANDEM_DATA_MODELS ("r50_frozen_head
# r18_full"), TANDEM_DATA_STEPS (60), TANDEM_DATA_MODE (pipelined+graphed), TANDEM_DATA_DECODE ("cpu gpu": one run each),
# TANDEM_DATA_PY_WORKERS (8).
if has_phase data; then
  data_dir=$(image_folder)
  data_bs=${TANDEM_DATA_BS:-64 256}
  data_models=${TANDEM_DATA_MODELS:-r50_frozen_head r18_full}
  data_steps=${TANDEM_DATA_STEPS:-60}
  jobs="decode,$(echo $data_models | tr ' ' ',')"
  say "python data_bench.py --jobs $jobs --batch-sizes $(echo $data_bs | tr ' ' ',')"
  python3 bench/python/data_bench.py --data "$data_dir" --jobs "$jobs" \
    --batch-sizes "$(echo $data_bs | tr ' ' ',')" --workers "${TANDEM_DATA_PY_WORKERS:-8}" \
    --steps "$data_steps" --decode-files 1000 --out "$RAW/data-python.json" 2>&1 | tee -a "$LOG" ||
    status=1  # the 1000 files data-bench's --images 1000 decodes
  for model in $data_models; do
    for bs in $data_bs; do
      for decode in ${TANDEM_DATA_DECODE:-cpu gpu}; do
        say "tandem data-bench --model $model --batch-size $bs --decode $decode"
        "$TANDEM" data-bench --data "$data_dir" --model "$model" --batch-size "$bs" \
          --mode "${TANDEM_DATA_MODE:-pipelined+graphed}" --steps "$data_steps" --warmup 10 \
          --decode "$decode" --images 1000 \
          --json "$RAW/data-tandem-$model-$bs-$decode.json" 2>&1 | tee -a "$LOG" || status=1
      done
    done
  done
  python3 - "$OUT/data.json" "$RAW"/data-python.json "$RAW"/data-tandem-*.json <<'PY' 2>&1 | tee -a "$LOG"
import json, sys, datetime
out, parts = sys.argv[1], sys.argv[2:]
rows, loader, device, commands = [], [], None, []
for p in parts:
    try:
        d = json.load(open(p))
    except Exception as e:
        print(f"data.json: skipping {p}: {e}")
        continue
    device = device or d.get("device")
    commands.append(d.get("command", p))
    rows += d.get("rows", [])
    loader += d.get("loader", [])
json.dump({"device": device,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ; ".join(commands), "rows": rows, "loader": loader},
          open(out, "w"), indent=2)
print(f"wrote {out}: {len(rows)} rows")
PY
fi

# tandem train: Fashion-MNIST with the small CNN (accuracy), then the generated JPEG
# folder with a frozen ResNet-50 + head and a full ResNet-18 in fp32 and bf16 beside the same
# step on device-resident data and beside the Python loops; train.json in OUT. Python loads the
# exported ResNet-18 weights into torchvision's model (scripts/check_export.py).
#   env: TANDEM_FMNIST_EPOCHS (10), TANDEM_TRAIN_EPOCHS (4, image jobs), TANDEM_TRAIN_JOBS
#        ("fmnist images"), TANDEM_TRAIN_PRECISIONS ("fp32 bf16"), TANDEM_TRAIN_BS (256),
#        TANDEM_TRAIN_LAYOUTS ("channels_last"; "nchw channels_last" for both),
#        TANDEM_TRAIN_MODELS ("r50_frozen_head r18_full"), TANDEM_TRAIN_PYTHON (1; 0: no Python
#        loops)
# Prints the Fashion-MNIST folder: TANDEM_FASHION_MNIST or the Debian package's, else the
# carried .deb unpacked next to the build (the GPU machine has no registry).
fashion_mnist_dir() {
  local fm=${TANDEM_FASHION_MNIST:-/usr/share/datasets/fashion-mnist} deb
  if [ ! -f "$fm/train-images-idx3-ubyte.gz" ]; then
    deb=$(ls ${TANDEM_DEBS:-.ref/debs}/dataset-fashion-mnist_*.deb 2>/dev/null | head -1)
    if [ -n "$deb" ]; then
      mkdir -p "$ROOT/$BUILD-deps" && dpkg -x "$deb" "$ROOT/$BUILD-deps"
      fm="$ROOT/$BUILD-deps/usr/share/datasets/fashion-mnist"
      say "Fashion-MNIST from $deb" >&2
    fi
  fi
  echo "$fm"
}

if has_phase train; then
  fm=$(fashion_mnist_dir)
  train_jobs=${TANDEM_TRAIN_JOBS:-fmnist images}
  if [[ " $train_jobs " == *" fmnist "* ]]; then
    say "tandem train: small CNN on Fashion-MNIST, ${TANDEM_FMNIST_EPOCHS:-10} epochs"
    "$TANDEM" train --data "$fm" --model small_cnn --epochs "${TANDEM_FMNIST_EPOCHS:-10}" \
      --out "$RAW/run-fmnist" --json "$RAW/train-tandem-fmnist.json" 2>&1 | tee -a "$LOG" || status=1
    say "python train_bench.py --jobs fashion_mnist"
    python3 bench/python/train_bench.py --jobs fashion_mnist --fashion-dir "$fm" --precision fp32 \
      --epochs "${TANDEM_FMNIST_EPOCHS:-10}" --out "$RAW/train-python-fmnist.json" 2>&1 |
      tee -a "$LOG" || status=1
  fi
  if [[ " $train_jobs " == *" images "* ]]; then
    data_dir=$(image_folder)
    tbs=${TANDEM_TRAIN_BS:-256}
    for model in ${TANDEM_TRAIN_MODELS:-r50_frozen_head r18_full}; do
      case $model in
        r50_frozen_head) args=(--model resnet50 --freeze backbone) ;;
        *) args=(--model resnet18) ;;
      esac
      for prec in ${TANDEM_TRAIN_PRECISIONS:-fp32 bf16}; do
        for layout in ${TANDEM_TRAIN_LAYOUTS:-channels_last}; do
          [ "$layout" = nchw ] && lflag=--no-channels-last || lflag=--channels-last
          tag=$model-$prec-$layout
          say "tandem train $model $prec $layout bs $tbs, ${TANDEM_TRAIN_EPOCHS:-4} epochs"
          "$TANDEM" train --data "$data_dir" "${args[@]}" --optimizer sgd --lr 0.1 $lflag \
            --batch-size "$tbs" --precision "$prec" --epochs "${TANDEM_TRAIN_EPOCHS:-4}" \
            --val-split 0.1 --val-subset 512 --out "$RAW/run-$tag" \
            --json "$RAW/train-tandem-$tag.json" 2>&1 | grep -v "^epoch" | tee -a "$LOG" || status=1
          say "tandem bench images resident $model $prec $layout"
          "$TANDEM" bench --workload images --param source=resident --param model=$model \
            --param precision=$prec --param layout=$layout --batch-size "$tbs" \
            --mode pipelined+graphed --steps 60 --warmup 10 --json "$RAW/resident-$tag.json" 2>&1 |
            grep -E "^images|efficiency" | tee -a "$LOG" || status=1
        done
      done
    done
    if [ "${TANDEM_TRAIN_PYTHON:-1}" = 1 ]; then
      say "python train_bench.py --jobs r50_frozen_head,r18_full"
      python3 bench/python/train_bench.py --jobs r50_frozen_head,r18_full --data "$data_dir" \
        --precision "$(echo ${TANDEM_TRAIN_PRECISIONS:-fp32 bf16} | tr ' ' ',')" \
        --batch-sizes "$tbs" --steps 60 --out "$RAW/train-python-images.json" 2>&1 |
        tee -a "$LOG" || status=1
    fi
    if ls -d "$RAW"/run-r18_full-fp32-* >/dev/null 2>&1; then
      say "check_export.py: torchvision loads tandem's ResNet-18 weights"
      python3 scripts/check_export.py \
        --weights "$(ls -d "$RAW"/run-r18_full-fp32-* | head -1)/model.safetensors" \
        --arch resnet18 --num-classes 10 2>&1 | tee -a "$LOG" || status=1
    fi
  fi
  if [[ " $train_jobs " == *" seg "* ]]; then
    seg_dir=${TANDEM_SEG_DIR:-/tmp/tandem-segpairs}
    if [ ! -d "$seg_dir/masks" ]; then
      say "make_seg_pairs.py $seg_dir --count ${TANDEM_SEG_COUNT:-2000}"
      python3 scripts/make_seg_pairs.py "$seg_dir" --count "${TANDEM_SEG_COUNT:-2000}" \
        --classes 6 2>&1 | tail -4 | tee -a "$LOG"
    fi
    for prec in ${TANDEM_TRAIN_PRECISIONS:-fp32 bf16}; do
      say "tandem train fcn_resnet18 (segmentation) $prec, ${TANDEM_SEG_EPOCHS:-8} epochs"
      "$TANDEM" train --data "$seg_dir" --model fcn_resnet18 --classes 6 --ignore-index 255 \
        --optimizer sgd --lr 0.02 --epochs "${TANDEM_SEG_EPOCHS:-8}" --batch-size 32 \
        --precision "$prec" --val-split 0.1 --out "$RAW/run-seg-$prec" \
        --json "$RAW/train-tandem-seg_fcn_r18-$prec-channels_last.json" 2>&1 | grep -v "^epoch [0-9]*/.*step" |
        tail -16 | tee -a "$LOG" || status=1
    done
  fi
  python3 - "$OUT/train.json" "$RAW" <<'PY' 2>&1 | tee -a "$LOG"
import glob, json, os, sys, datetime
out, raw = sys.argv[1], sys.argv[2]
rows, commands, device = [], [], None
seg_rows, seg_commands = [], []
def load(p):
    try:
        return json.load(open(p))
    except Exception as e:
        print(f"train.json: skipping {p}: {e}")
        return None
def resident(tag):
    d = load(f"{raw}/resident-{tag}.json")
    if not d:
        return None
    d = d["runs"][0] if "runs" in d else d
    return d.get("samples_per_s")
for p in sorted(glob.glob(f"{raw}/train-tandem-*.json")):
    d = load(p)
    if not d:
        continue
    commands.append(d["command"])
    device = device or d.get("device")
    tag = os.path.basename(p)[len("train-tandem-"):-len(".json")]
    job = "fashion_mnist" if tag == "fmnist" else tag.split("-")[0]
    layout = None if tag == "fmnist" else tag.split("-")[2]
    if job == "seg_fcn_r18":  # segmentation: train-seg.json (train.json's jobs are classifiers)
        seg_rows.append({"impl": "tandem", "job": job, "precision": d["precision"],
                         "batch_size": d["batch_size"], "images_per_s": d["images_per_s"],
                         "miou": d.get("accuracy"),  # tandem train's headline metric
                         "epochs": d["epochs"], "layout": layout})
        seg_commands.append(d["command"])
        commands.pop()
        continue
    rows.append({"impl": "tandem", "job": job, "precision": d["precision"],
                 "batch_size": d["batch_size"], "images_per_s": d["images_per_s"],
                 "resident_images_per_s": None if job == "fashion_mnist" else resident(tag),
                 "accuracy": d.get("accuracy"), "epochs": d["epochs"], "layout": layout})
for p in sorted(glob.glob(f"{raw}/train-python-*.json")):
    d = load(p)
    if not d:
        continue
    commands.append(d.get("command", p))
    device = d.get("device") or device
    rows += d.get("rows", [])
now = datetime.datetime.now(datetime.timezone.utc).isoformat()
if rows:
    json.dump({"device": device, "date": now, "command": " ; ".join(commands), "rows": rows},
              open(out, "w"), indent=2)
    print(f"wrote {out}: {len(rows)} rows")
if seg_rows:
    seg_out = os.path.join(os.path.dirname(out), "train-seg.json")
    json.dump({"device": device, "date": now, "command": " ; ".join(seg_commands),
               "rows": seg_rows}, open(seg_out, "w"), indent=2)
    print(f"wrote {seg_out}: {len(seg_rows)} rows")
rows += seg_rows
for r in rows:
    print(r)
PY
fi

# Photos: two generated folders (photos of 320-640 and of 1000-2000 px a side), ResNet-18 and
# ResNet-50 trained in bf16, channels-last, bs 256: `tandem train` with each --crop (region,
# the default: only the drawn box, at its scale; whole: the whole image decoded at the scale 224
# needs), with its evaluation's rate (a tenth held out),
# the resident rate, data-bench's decode rows (per core, whole and region; nvJPEG), and
# torchvision's loop (train_bench.py, bf16, channels-last, DataLoader with as many workers)
# beside them: photos.json in OUT (bench/python/photos_table.py).
#   env: TANDEM_PHOTOS_SIDES ("320-640 1000-2000"), TANDEM_PHOTOS_COUNT (3000),
#        TANDEM_PHOTOS_MODELS ("r18_full r50_full"), TANDEM_PHOTOS_CROPS ("region whole"),
#        TANDEM_PHOTOS_EPOCHS (3), TANDEM_PHOTOS_PYTHON (1), TANDEM_PHOTOS_SPLIT (1: also the
#        region runs with decode auto, each batch split between the workers and the JPEG
#        engines: `tandem train --decode auto` and the bench's decode=auto)
if has_phase photos; then
  photo_workers=$(( $(nproc) - 1 > 15 ? 15 : $(nproc) - 1 ))
  for sides in ${TANDEM_PHOTOS_SIDES:-320-640 1000-2000}; do
    dir=/tmp/tandem-photos-$sides
    if [ ! -d "$dir" ]; then
      say "make_image_folder.py $dir: ${TANDEM_PHOTOS_COUNT:-3000} photos of $sides px"
      python3 scripts/make_image_folder.py "$dir" --count "${TANDEM_PHOTOS_COUNT:-3000}" \
        --classes 10 --min-side "${sides%-*}" --max-side "${sides#*-}" 2>&1 | tail -1 | tee -a "$LOG"
    fi
    say "photos $sides: tandem data-bench decode rows"
    "$TANDEM" data-bench --data "$dir" --steps 0 --images 500 --json "$RAW/photos-databench-$sides.json" \
      2>&1 | grep -E "^decode" | tee -a "$LOG" || status=1
    for model in ${TANDEM_PHOTOS_MODELS:-r18_full r50_full}; do
      net=resnet18; [ "$model" = r50_full ] && net=resnet50
      for crop in ${TANDEM_PHOTOS_CROPS:-region whole}; do
        say "photos $sides: tandem train $net bf16 --crop $crop --decode cpu"
        "$TANDEM" train --data "$dir" --model "$net" --precision bf16 --channels-last \
          --batch-size 256 --optimizer sgd --lr 0.1 --epochs "${TANDEM_PHOTOS_EPOCHS:-3}" \
          --val-split 0.1 --crop "$crop" --decode cpu --workers "$photo_workers" --quiet \
          --out "$RAW/run-photos-$sides-$model-$crop" --json "$RAW/photos-train-$sides-$model-$crop.json" \
          2>&1 | grep -E "^speed|^evaluation|rror" | tee -a "$LOG" || status=1
        if [ "$crop" = region ] && [ "${TANDEM_PHOTOS_SPLIT:-1}" = 1 ]; then
          say "photos $sides: tandem train $net bf16 --crop region --decode auto"
          "$TANDEM" train --data "$dir" --model "$net" --precision bf16 --channels-last \
            --batch-size 256 --optimizer sgd --lr 0.1 --epochs "${TANDEM_PHOTOS_EPOCHS:-3}" \
            --val-split 0.1 --crop region --decode auto --workers "$photo_workers" --quiet \
            --out "$RAW/run-photos-$sides-$model-region-auto" \
            --json "$RAW/photos-train-$sides-$model-region-auto.json" \
            2>&1 | grep -E "^speed|^evaluation|decode auto|JPEG engines|rror" | tee -a "$LOG" || status=1
        fi
        # The training rate from JPEGs without epoch ends: the loader runs on across epochs, so
        # no ring filled behind an evaluation or a checkpoint flatters it (small folders have
        # epochs shorter than the ring).
        "$TANDEM" bench --workload images --data "$dir" --param source=files --param crop="$crop" \
          --param model=$model --param precision=bf16 --param layout=channels_last --batch-size 256 \
          --mode pipelined+graphed --steps 60 --warmup 10 --workers "$photo_workers" \
          --json "$RAW/photos-files-$sides-$model-$crop.json" 2>&1 | grep -E "^images|rror" | tee -a "$LOG" || status=1
        # The same with the batch split between the CPU workers and the JPEG engines.
        if [ "$crop" = region ] && [ "${TANDEM_PHOTOS_SPLIT:-1}" = 1 ]; then
          "$TANDEM" bench --workload images --data "$dir" --param source=files --param crop=region \
            --param decode=auto --param model=$model --param precision=bf16 --param layout=channels_last \
            --batch-size 256 --mode pipelined+graphed --steps 60 --warmup 10 --workers "$photo_workers" \
            --json "$RAW/photos-files-$sides-$model-region-auto.json" 2>&1 | grep -E "^images|decode=auto|JPEG engines|rror" | tee -a "$LOG" || status=1
        fi
      done
      if [ ! -f "$RAW/photos-resident-$model.json" ]; then
        "$TANDEM" bench --workload images --param source=resident --param model=$model \
          --param precision=bf16 --param layout=channels_last --batch-size 256 \
          --mode pipelined+graphed --steps 40 --warmup 10 --json "$RAW/photos-resident-$model.json" \
          2>&1 | grep -E "^images" | tee -a "$LOG" || status=1
      fi
    done
    if [ "${TANDEM_PHOTOS_PYTHON:-1}" = 1 ]; then
      say "photos $sides: train_bench.py (torchvision's loop, bf16, channels-last)"
      python3 bench/python/train_bench.py --jobs "$(echo ${TANDEM_PHOTOS_MODELS:-r18_full r50_full} | tr ' ' ',')" \
        --data "$dir" --precision bf16 --channels-last --batch-sizes 256 --steps 30 \
        --workers "$photo_workers" --out "$RAW/photos-python-$sides.json" 2>&1 | tail -4 | tee -a "$LOG" || status=1
    fi
  done
  python3 bench/python/photos_table.py "$RAW" "$OUT/photos.json" \
    "scripts/gpu-check.sh OUT photos (TANDEM_PHOTOS_SIDES='${TANDEM_PHOTOS_SIDES:-320-640 1000-2000}' TANDEM_PHOTOS_MODELS='${TANDEM_PHOTOS_MODELS:-r18_full r50_full}' TANDEM_PHOTOS_EPOCHS=${TANDEM_PHOTOS_EPOCHS:-3})" \
    2>&1 | tee -a "$LOG" || status=1
fi

# Data parallel: tandem bench --nproc W beside PyTorch DDP (bench/python/ddp_reference.py
# under torchrun) on the reference loops, world 1 and 2 in this call; ddp.json in
# OUT. Needs the nvidia-h200-x2 kind for world 2.
#   env: TANDEM_DDP_WORLDS ("1 2"), TANDEM_DDP_SEG_BS ("8 32"), TANDEM_DDP_CLS_BS ("32 128"),
#        TANDEM_DDP_MODES ("pipelined pipelined+graphed": the all-reduce eager, then captured),
#        TANDEM_DDP_PYTHON (1: run the Python reference), TANDEM_DDP_SCENARIOS ("seg cls"),
#        TANDEM_DDP_ALLREDUCED (1: at world > 1, pipelined+graphed also with --no-gathered-grad:
#        the GatheredGrad layers' gradients all-reduced like the rest, rows "gathered_grad": false),
#        TANDEM_DDP_BUCKET_MB (unset: tandem's 25; else every tandem run's --bucket-cap-mb)
if has_phase ddp; then
  for world in ${TANDEM_DDP_WORLDS:-1 2}; do
    for scen in ${TANDEM_DDP_SCENARIOS:-seg cls}; do
      [ "$scen" = seg ] && bss=${TANDEM_DDP_SEG_BS:-8 32} || bss=${TANDEM_DDP_CLS_BS:-32 128}
      for bs in $bss; do
        for mode in ${TANDEM_DDP_MODES:-pipelined pipelined+graphed}; do
          # A run as configured, and at world > 1 in pipelined+graphed the GatheredGrad layers
          # all-reduced instead (suffix -allreduced).
          variants=(gathered)
          if [ "$world" -gt 1 ] && [ "$mode" = pipelined+graphed ] && [ "${TANDEM_DDP_ALLREDUCED:-1}" = 1 ]; then
            variants+=(allreduced)
          fi
          for variant in "${variants[@]}"; do
            [ "$variant" = allreduced ] && flag=--no-gathered-grad suffix=-allreduced || flag= suffix=
            ddp_run=ddp-tandem-$scen-$mode-$bs-w$world$suffix
            say "tandem bench --nproc $world $scen $mode bs $bs $flag"
            timeout 180 "$TANDEM" bench --workload "$scen" --mode "$mode" --batch-size "$bs" --workers 8 \
              --nproc "$world" $flag ${TANDEM_DDP_BUCKET_MB:+--bucket-cap-mb "$TANDEM_DDP_BUCKET_MB"} \
              --json "$RAW/$ddp_run.json" >"$RAW/$ddp_run.log" 2>&1 || status=1
            grep -E "^$scen +[a-z]|^data parallel:|error" "$RAW/$ddp_run.log" | tee -a "$LOG"
          done
        done
      done
    done
    if [ "${TANDEM_DDP_PYTHON:-1}" = 1 ]; then
      for scen in ${TANDEM_DDP_SCENARIOS:-seg cls}; do
        [ "$scen" = seg ] && bss=${TANDEM_DDP_SEG_BS:-8 32} || bss=${TANDEM_DDP_CLS_BS:-32 128}
        say "python ddp_reference.py --scenario $scen world $world"
        timeout 300 torchrun --nproc-per-node "$world" bench/python/ddp_reference.py --scenario "$scen" \
          --bs "$(echo $bss | tr ' ' ',')" \
          --json "$RAW/ddp-python.json" --append >"$RAW/ddp-python-$scen-w$world.log" 2>&1 || status=1
        grep -E '^\{|error' "$RAW/ddp-python-$scen-w$world.log" | tail -6 | tee -a "$LOG"
      done
    fi
    # TANDEM_DDP_NCCL_VARIANTS: ';'-separated NCCL settings, each one extra run of seg at the
    # first batch size, pipelined+graphed (not in ddp.json; for tuning).
    if [ "$world" -gt 1 ] && [ -n "${TANDEM_DDP_NCCL_VARIANTS:-}" ]; then
      IFS=';' read -ra variants <<<"$TANDEM_DDP_NCCL_VARIANTS"
      for v in "${variants[@]}"; do
        bs=$(echo ${TANDEM_DDP_SEG_BS:-8 32} | cut -d' ' -f1)
        say "variant $v: tandem bench --nproc $world seg pipelined+graphed bs $bs"
        env $v timeout 180 "$TANDEM" bench --workload seg --mode pipelined+graphed --batch-size "$bs" \
          --workers 8 --nproc "$world" 2>&1 | grep -E "^seg +[a-z]|error" | tee -a "$LOG"
      done
    fi
    if [ "$world" -gt 1 ]; then
      say "allreduce_floor.py: one NCCL all-reduce of the workloads' gradient bytes, world $world"
      timeout 120 torchrun --nproc-per-node "$world" bench/python/allreduce_floor.py \
        --mb ${TANDEM_DDP_FLOOR_MB:-179 25 1} --json "$RAW/allreduce-floor-w$world.json" \
        2>&1 | grep '^{' | tee -a "$LOG"
    fi
  done
  # tandem train --nproc W on the generated ImageFolder (ResNet-18, the loader's default
  # threads: shared by the ranks of this machine): the CLI's data parallel on real data.
  # env TANDEM_DDP_TRAIN (1), TANDEM_DDP_TRAIN_EPOCHS (2), TANDEM_DDP_TRAIN_BS (128 per rank).
  if [ "${TANDEM_DDP_TRAIN:-1}" = 1 ]; then
    data_dir=$(image_folder)
    for world in ${TANDEM_DDP_WORLDS:-1 2}; do
      say "tandem train --nproc $world resnet18 on $data_dir, bs ${TANDEM_DDP_TRAIN_BS:-128} per rank"
      timeout 300 "$TANDEM" train --data "$data_dir" --model resnet18 --optimizer sgd --lr 0.1 \
        --batch-size "${TANDEM_DDP_TRAIN_BS:-128}" --epochs "${TANDEM_DDP_TRAIN_EPOCHS:-2}" \
        --val-split 0.1 --nproc "$world" --out "$RAW/ddp-train-w$world" \
        --json "$RAW/ddp-train-w$world.json" >"$RAW/ddp-train-w$world.log" 2>&1 || status=1
      grep -v "step" "$RAW/ddp-train-w$world.log" | tail -8 | tee -a "$LOG"
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print('ddp-train world', sys.argv[2], {k: d.get(k) for k in ('images_per_s','accuracy','epochs','batch_size')})" \
        "$RAW/ddp-train-w$world.json" "$world" 2>&1 | tee -a "$LOG"
    done
  fi
  python3 - "$OUT/ddp.json" "$RAW" <<'PY' 2>&1 | tee -a "$LOG"
import datetime, glob, json, os, re, sys
out, raw = sys.argv[1], sys.argv[2]
rows, commands, device = [], [], None
for p in sorted(glob.glob(f"{raw}/ddp-tandem-*.json")):
    d = json.load(open(p))
    m = re.match(r"ddp-tandem-(\w+)-(.+)-(\d+)-w(\d+)(-allreduced)?\.json", os.path.basename(p))
    scen, mode, bs, world = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
    gathered = m.group(5) is None
    device = device or d.get("device_name") or d.get("device")
    dp = d.get("data_parallel") or {}
    rows.append({"impl": "tandem", "scenario": scen, "mode": mode, "batch_size_per_gpu": bs,
                 "world": world, "steps_per_s_per_gpu": d["steps_per_s"],
                 "steps_per_s_slowest_rank": dp.get("steps_per_s_slowest_rank", d["steps_per_s"]),
                 "backend": dp.get("backend"), "gathered_grad": gathered if world > 1 else None})
    commands.append(f"tandem bench --workload {scen} --mode {mode} --batch-size {bs} --workers 8 --nproc {world}"
                    + ("" if gathered else " --no-gathered-grad"))
py = f"{raw}/ddp-python.json"
if os.path.exists(py):
    d = json.load(open(py))
    rows += d["rows"]
    commands.append(d.get("command", "ddp_reference.py"))
worlds = max([r["world"] for r in rows] or [1])
if device and worlds > 1:
    device = f"{worlds}x {device} (one host)"
json.dump({"device": device,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "command": "scripts/gpu-check.sh OUT build ddp: " + " ; ".join(commands), "rows": rows},
          open(out, "w"), indent=2)
print(f"wrote {out}: {len(rows)} rows")
best = {}
for r in rows:
    if r.get("gathered_grad") is False:
        continue  # the comparison runs, printed below
    k = (r["impl"], r["scenario"], r["batch_size_per_gpu"], r["world"])
    best[k] = max(best.get(k, 0), r["steps_per_s_per_gpu"])
for (impl, scen, bs, world), v in sorted(best.items()):
    w1 = best.get((impl, scen, bs, 1))
    py2 = best.get(("python", scen, bs, world))
    print(f"{impl:7s} {scen} bs {bs:4d} world {world}: {v:8.2f} steps/s/GPU"
          + (f"  scaling {v / w1:.3f}" if w1 and world > 1 else "")
          + (f"  vs python {v / py2:.2f}x" if impl == "tandem" and py2 else ""))
for r in rows:
    if r.get("gathered_grad") is False:
        g = [x for x in rows if x.get("gathered_grad") and x["scenario"] == r["scenario"]
             and x["mode"] == r["mode"] and x["batch_size_per_gpu"] == r["batch_size_per_gpu"]
             and x["world"] == r["world"]]
        if g:
            print(f"gathered vs all-reduced: {r['scenario']} bs {r['batch_size_per_gpu']} world {r['world']} "
                  f"{r['mode']}: {g[0]['steps_per_s_per_gpu']:.2f} vs {r['steps_per_s_per_gpu']:.2f} steps/s/GPU "
                  f"({g[0]['steps_per_s_per_gpu'] / r['steps_per_s_per_gpu']:.3f}x)")
PY
fi

# What GatheredGrad's weight gradient costs at worlds 1, 2, 4 and 8 on one GPU (the worlds
# this GPU cannot run): the gathered batch's GEMM for the reference nets' wrapped layers, and
# the bytes a rank gathers against those an all-reduce of the same gradient moves.
# gathered-cost.json and gathered-cost.log in OUT.
if has_phase gathercost; then
  say "gathercost: bench/python/gathered_grad_cost.py, worlds 1 2 4 8"
  python3 bench/python/gathered_grad_cost.py --json "$OUT/gathered-cost.json" \
    >"$OUT/gathered-cost.log" 2>&1 || status=1
  tee -a "$LOG" <"$OUT/gathered-cost.log"
fi

# The Python package on the GPU: installed against this build, then python/tests
# (the CUDA ones included) and python/examples/plain_loop.py on CUDA.
# TurboJPEG unpacked from a .deb next to the build (phase build) is outside the loader's path.
deps_lib="$ROOT/$BUILD-deps/usr/lib/x86_64-linux-gnu"
if [ -d "$deps_lib" ]; then export LD_LIBRARY_PATH="$deps_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"; fi
# The Python package in one command (pip builds and bundles the C++ libraries it needs), for the
# phases that use it (compile, pybench) when phase python (against the full build) is not run.
# py_package TREE DEST: that source tree's package into DEST/py.
py_package() {
  rm -rf "$2/py" && python3 -m pip install -q --no-build-isolation --no-deps \
    --target "$2/py" "$1/python" -C build-dir="$2/build"
}
if has_phase package; then
  say "package: pip install --no-build-isolation --no-deps ./python (one command, bundled)"
  py_package "$ROOT" "$ROOT/$BUILD-py" >"$RAW/py-package.log" 2>&1 ||
    { tail -30 "$RAW/py-package.log" | tee -a "$LOG"; status=1; }
fi
if has_phase python; then
  say "python: install tandem, pip install --no-build-isolation ./python"
  pyprefix="$ROOT/$BUILD-py"
  rm -rf "$pyprefix" && cmake --install "$BUILD" --prefix "$pyprefix/usr" >"$RAW/py-install.log" 2>&1 &&
    python3 -m pip install -q --no-build-isolation --no-deps --target "$pyprefix/py" ./python \
      -C cmake.define.CMAKE_PREFIX_PATH="$pyprefix/usr" -C build-dir="$pyprefix/build" \
      >"$RAW/py-pip.log" 2>&1 || { tail -30 "$RAW/py-pip.log" | tee -a "$LOG"; status=1; }
  pytest_path=
  if ! python3 -c "import pytest" 2>/dev/null; then  # offline: the wheels fetch-gpu-debs.sh got
    python3 -m pip install -q --no-index --find-links "${TANDEM_DEBS:-.ref/debs}/wheels" \
      --target "$pyprefix/pytest" pytest >>"$RAW/py-pip.log" 2>&1 || say "no pytest to install"
    pytest_path=":$pyprefix/pytest"
  fi
  say "python: pytest python/tests"
  PYTHONPATH="$pyprefix/py$pytest_path" python3 -m pytest -q python/tests -p no:cacheprovider \
    >"$OUT/pytest.log" 2>&1 || status=1
  tail -15 "$OUT/pytest.log" | tee -a "$LOG"
  fm=$(fashion_mnist_dir)
  if [ -f "$fm/train-images-idx3-ubyte.gz" ]; then
    say "python: examples/plain_loop.py on CUDA, 2 epochs"
    PYTHONPATH="$pyprefix/py" python3 python/examples/plain_loop.py \
      "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz" --device cuda \
      --epochs 2 2>&1 | tail -3 | tee -a "$LOG" || status=1
  fi
fi

# CPU decode per core, in rounds pinned to one core, on the same files of the
# generated folder: tandem data-bench's decode rows, then data_bench.py's decoders taking turns
# per 25 files in one process — PIL, torchvision.io and, with phase python's package,
# tandem.data.decode_image — whose ratios hold on a host whose speed drifts. decode.json in OUT
# holds every round and the medians.
#   env: TANDEM_DECODE_ROUNDS (5), TANDEM_DECODE_IMAGES (1000), TANDEM_DECODE_CORE (2),
#        TANDEM_DATA_DIR, TANDEM_DATA_COUNT
if has_phase decode; then
  data_dir=$(image_folder)
  core=${TANDEM_DECODE_CORE:-2}
  decode_images=${TANDEM_DECODE_IMAGES:-1000}  # both pick the same files, spread over the classes
  for round in $(seq 1 "${TANDEM_DECODE_ROUNDS:-5}"); do
    say "decode round $round on core $core: tandem data-bench --steps 0, then data_bench.py --jobs decode"
    taskset -c "$core" "$TANDEM" data-bench --data "$data_dir" --decode cpu --steps 0 \
      --images "$decode_images" --workers 1 --json "$RAW/decode-tandem-$round.json" >>"$LOG" 2>&1 ||
      status=1
    PYTHONPATH="$ROOT/$BUILD-py/py" taskset -c "$core" python3 bench/python/data_bench.py --data "$data_dir" --jobs decode \
      --decode-files "$decode_images" --out "$RAW/decode-python-$round.json" >>"$LOG" 2>&1 ||
      status=1
  done
  python3 - "$OUT/decode.json" "$RAW" <<'PY' 2>&1 | tee -a "$LOG"
import glob, json, os, statistics, sys, datetime
out, raw = sys.argv[1], sys.argv[2]
rows, per_round = [], []
for t in sorted(glob.glob(os.path.join(raw, "decode-tandem-*.json"))):
    n = t.rsplit("-", 1)[1].split(".")[0]
    rates = {}
    for p in (t, os.path.join(raw, f"decode-python-{n}.json")):
        for r in json.load(open(p))["rows"]:
            if r.get("job") == "decode" and r.get("decode") == "cpu":
                r["round"] = int(n)
                rows.append(r)
                rates[r["decoder"]] = r["images_per_s_per_core"]
    per_round.append(rates)
summary = {}
for d in ("turbojpeg_scaled", "turbojpeg_full", "pil", "torchvision.io", "tandem_scaled",
          "tandem_full"):
    vals = [r[d] for r in per_round if d in r]
    if vals:
        summary[d] = statistics.median(vals)
def ratio(num, den):
    return [r[num] / r[den] for r in per_round if num in r and den in r]
for name, num in (("cli_scaled_over_pil", "turbojpeg_scaled"),
                  ("interleaved_scaled_over_pil", "tandem_scaled"),
                  ("interleaved_full_over_pil", "tandem_full")):
    ratios = ratio(num, "pil")
    summary[name + "_per_round"] = ratios
    summary[name + "_median"] = statistics.median(ratios) if ratios else None
json.dump({"device": "NVIDIA H200 host CPU, one pinned core",
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "scripts/gpu-check.sh OUT build decode (rounds of: taskset -c CORE tandem "
                      "data-bench --decode cpu --steps 0 --images N --workers 1; taskset -c CORE "
                      "python3 bench/python/data_bench.py --jobs decode --decode-files N), N = "
                      + os.environ.get("TANDEM_DECODE_IMAGES", "1000"),
           "summary": summary, "rows": rows}, open(out, "w"), indent=2)
print("decode medians (img/s on one core):", {k: round(v, 2) for k, v in summary.items() if isinstance(v, float)})
for k, v in summary.items():
    if k.endswith("_per_round"):
        print(k, [round(x, 3) for x in v])
PY
fi

# tandem.Trainer's benchmark: the reference workloads' loops written with the Trainer
# (python/examples/*_trainer.py) beside the C++ CLI and the Python reference loops, and
# tandem.augment beside torchvision's batch transform. Needs phase python's package.
if has_phase pybench; then
  say "pybench: bench/python/python_bench.py (seg bs ${TANDEM_SEG_BS:-8,32}, cls bs ${TANDEM_CLS_BS_PY:-32,128})"
  PYTHONPATH="$ROOT/$BUILD-py/py" python3 bench/python/python_bench.py --tandem "$BUILD/tandem" \
    --seg-bs "${TANDEM_SEG_BS:-8,32}" --cls-bs "${TANDEM_CLS_BS_PY:-32,128}" \
    --scenarios "${TANDEM_PY_SCENARIOS:-seg,cls}" --out "$OUT/python.json" \
    2>&1 | tee -a "$LOG" || status=1
fi

# torch.compile beside tandem.Trainer (plain and compile=True) and tandem's C++ step (the CLI
# of phase build, impls tandem-cpp and tandem-cpp-module) on torchvision models, bf16 +
# channels_last, device-resident batches: compile.json in OUT. Needs phase package's package.
#   env: TANDEM_COMPILE_JOBS (r18_full,r50_full,r50_frozen_head), TANDEM_COMPILE_BS (32,256),
#        TANDEM_COMPILE_IMPLS (eager,compile,compile_ro,tandem-py,tandem-py-compiled),
#        TANDEM_COMPILE_STEPS (100), TANDEM_COMPILE_PROFILE
#        (JOB:BS:IMPL,...[;...]: those rows' kernel lists), TANDEM_COMPILE_MODE (auto)
if has_phase compile; then
  say "compile: bench/python/compile_bench.py (${TANDEM_COMPILE_JOBS:-r18_full,r50_full,r50_frozen_head} at bs ${TANDEM_COMPILE_BS:-32,256})"
  PYTHONPATH="$ROOT/$BUILD-py/py" python3 bench/python/compile_bench.py \
    --jobs "${TANDEM_COMPILE_JOBS:-r18_full,r50_full,r50_frozen_head}" \
    --bs "${TANDEM_COMPILE_BS:-32,256}" \
    --impls "${TANDEM_COMPILE_IMPLS:-eager,compile,compile_ro,tandem-py,tandem-py-compiled}" \
    --steps "${TANDEM_COMPILE_STEPS:-100}" --mode "${TANDEM_COMPILE_MODE:-auto}" \
    --profile "${TANDEM_COMPILE_PROFILE:-}" --tandem-cli "$ROOT/$BUILD/tandem" \
    --out "$OUT/compile.json" 2>&1 | tee -a "$LOG" || status=1
fi

# tandem.Trainer's examples (seg bs 8, cls bs 32), this tree's package against an old source
# tree's (TANDEM_OLD_TREE, default .ref/old; carry it), alternating rounds: trainer_ab.json.
# Needs phase package. env: TANDEM_AB_ROUNDS (3), TANDEM_AB_CELLS (seg:8,cls:32)
if has_phase trainer-ab; then
  old_tree=${TANDEM_OLD_TREE:-.ref/old}
  say "trainer-ab: tandem.Trainer, this tree against $old_tree"
  if py_package "$(cd "$old_tree" && pwd)" "$ROOT/$BUILD-py-old" >"$RAW/py-old.log" 2>&1; then
    python3 bench/python/trainer_ab.py --old "$ROOT/$BUILD-py-old/py" --new "$ROOT/$BUILD-py/py" \
      --rounds "${TANDEM_AB_ROUNDS:-3}" --cells "${TANDEM_AB_CELLS:-seg:8,cls:32}" \
      --out "$OUT/trainer_ab.json" 2>&1 | tee -a "$LOG" || status=1
  else
    tail -30 "$RAW/py-old.log" | tee -a "$LOG"; status=1
  fi
fi

# The README's main job as a newcomer runs it: a copy of the tracked tree, a HOME that never
# ran the bootstrap, `bash scripts/run.sh` (generated IDX files where Fashion-MNIST is absent).
if has_phase runsh; then
  say "runsh: bash scripts/run.sh in a fresh copy with an empty HOME"
  fresh=$(mktemp -d)
  tar --exclude='./build*' --exclude=./.git --exclude=./.ref -cf - . | tar -C "$fresh" -xf -
  (cd "$fresh" && HOME=$(mktemp -d) timeout 900 bash scripts/run.sh --epochs 2) \
    >"$OUT/runsh.log" 2>&1 && say "runsh: exit 0" || { status=1; say "runsh: FAILED (exit $?)"; }
  grep -E "^ +[0-9]+ |accuracy|speed|no Fashion|GPU found|error|Error" "$OUT/runsh.log" | tail -15 | tee -a "$LOG"
fi

# Run folders' checkpoints (hundreds of MB for the ResNets) stay out of the archive.
tar -C "$RAW" --exclude='./run-*/checkpoints' -czf "$OUT/raw.tar.gz" . 2>/dev/null
say "done, status $status"
exit $status
