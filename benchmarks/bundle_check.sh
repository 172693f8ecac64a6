#!/usr/bin/env bash
# One GPU-machine call on this machine's build (scripts/gpu-bundle.sh pack, carry .ref/bundle),
# its phases in the order named, each in the time left: packages (this tree's Python package and
# .ref/old's, built there), wallclock (benchmarks/wallclock.py, the package against the older one
# where packed or built), profile (the ResNet step's kernels,
# profile_resnet.sh), train (`tandem train`'s evaluations from a generated photo folder: the
# first beside the later ones), precision (`tandem train`'s accuracy and rate in bf16 and fp16
# from a generated folder), gputest (the gpu-labelled tests), probe (cuDNN's fused graphs,
# benchmarks/lab/cudnn_fusion_probe.sh), resnet_ab (the ResNets' step, this build against
# .ref/bundle-old's: benchmarks/resnet_ab_table.py), pytest (the Python tests PYTEST_FILES names,
# on the package built here), scenario_ab (the seg and cls workloads'
# steps, the same two builds), sanitize (compute-sanitizer's memcheck,
# racecheck and synccheck over the GPU tests SANITIZE_FILTER names), ncu (each launch of the
# ResNet step's own kernels under Nsight Compute: time, bytes, grid), firststep (a first fit's
# runtime calls, a first and a second process: lab/first_step_profile.py), mlperf_resident and
# mlperf_photos (the ResNets against MLPerf's per-GPU rate: mlperf.json). JSON and CSV into OUT;
# the whole logs in OUT/bundle-logs.tar.gz.
#
#   bash benchmarks/bundle_check.sh OUT [PHASES (profile train gputest)]
#   env: DEADLINE_S (560: the call's seconds the phases share), GPUTEST_REGEX (ctest -R),
#        GPUTEST_S (the gpu tests' seconds at most, e.g. while the packages build), PYTEST_FILES
#        and PYTEST_S (pytest: the files, and its seconds at most),
#        WALLCLOCK_ARGS (wallclock.py's; default the frozen ResNet-50 and ResNet-18 at bs 32,
#        300-step first fits), WALLCLOCK_ARGS2 (a second run's, into wallclock-2.json),
#        TRAIN_EAGER_LOADING (train: see there), SANITIZE_FILTER (sanitize: a GoogleTest
#        filter over the models' tests; default the batch-norm and max-pool kernels', without
#        the whole-ResNet ones: cuDNN's own kernels are not ours to check),
#        SANITIZE_BINARY (sanitize: another test binary, e.g. build/tests/tandem_core_tests)
#        FIRSTSTEP_ARGS, FIRSTSTEP_ENV (firststep: see there)
set -uo pipefail
OUT=${1:?usage: benchmarks/bundle_check.sh OUT [profile train gputest]}
shift
PHASES=" ${*:-profile train gputest} "
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.." || exit 1
START=$(date +%s)
LOGS=$(mktemp -d)
say() { echo "== +$(($(date +%s) - START))s $*" | tee -a "$LOGS/summary.log"; }
left() { echo $((${DEADLINE_S:-560} - ($(date +%s) - START))); }
# A phase's seconds: what is left of the call less 5, or its own cap ($1) where set and smaller.
within() {
  local l; l=$(left)
  if [ -n "${1:-}" ] && [ "$l" -ge "$1" ]; then echo "$1"; else echo $((l - 5)); fi
}
# Build $1 (new: this bundle's; old, old-eager: .ref/bundle-old's) as $cli, and in $libs the
# older build's libraries, to go before the bundle's in LD_LIBRARY_PATH (empty for new).
use_build() {
  libs="" cli=build/tandem
  if [ "${1#old}" != "$1" ]; then
    libs=$(printf '%s:' "$PWD"/.ref/bundle-old/build{,/models,/data,/distributed})
    cli=.ref/bundle-old/build/tandem
  fi
}

# The generated photo folder the train and precision phases train from (3,000 photos of 10
# classes, 320-640 px), made once a machine.
photo_folder=/tmp/tandem-photos-bundle
make_photo_folder() {
  [ -d "$photo_folder" ] || python3 scripts/make_image_folder.py "$photo_folder" --count 3000 \
    --classes 10 >"$LOGS/make-folder.log" 2>&1
}

# A tree's sources, as one checksum: what decides whether a package built earlier is its.
sources_stamp() {
  (cd "$1" && find python src include models data distributed train run tools CMakeLists.txt \
     cmake -type f ! -name '*.pyc' 2>/dev/null | LC_ALL=C sort | xargs md5sum | md5sum | cut -c1-32)
}
# The packages phase's builds awaited (once): PACKAGE_NEW and PACKAGE_OLD where they built.
await_packages() {
  if [ -n "${new_pid:-}" ]; then
    wait "$new_pid" && PACKAGE_NEW=/tmp/bundle-pkg-new
    say "packages: this tree's exit $?"; new_pid=""
  fi
  if [ -n "${old_pid:-}" ]; then
    wait "$old_pid" && PACKAGE_OLD=/tmp/bundle-pkg-old
    say "packages: .ref/old's exit $?"; old_pid=""
  fi
}

# The package a Python phase ($1) imports: the packages phase's, else the bundle's where it was
# built for this Python; where neither, the phase is skipped with a note (returns 1).
python_package() {
  await_packages
  [ -n "${PACKAGE_NEW:-}" ] && export PYTHONPATH=$PACKAGE_NEW TANDEM_BUNDLE_PYTHON=1
  [ "${TANDEM_BUNDLE_PYTHON:-}" = 1 ] && return 0
  say "$1: skipped (no package for this Python: the packages phase builds one)"
  return 1
}

# shellcheck source=scripts/gpu-bundle.sh
source scripts/gpu-bundle.sh env >"$LOGS/bundle-env.log" 2>&1
cat "$LOGS/bundle-env.log" | tee -a "$LOGS/summary.log"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOGS/summary.log"
python3 -V 2>&1 | tee -a "$LOGS/summary.log"
if ! build/tandem --help >/dev/null 2>"$LOGS/tandem-start.log"; then
  say "the bundled CLI does not start:"; tail -5 "$LOGS/tandem-start.log" | tee -a "$LOGS/summary.log"
fi

for phase in $PHASES; do
case $phase in
packages)
  # The Python packages built here, where the bundled one is for another Python: this tree's
  # and, where carried, .ref/old's (a `git archive` of the older tree), side by side, in the
  # background (the phases after it run meanwhile; wallclock and the timed phases wait for
  # them). A package this tree's sources built in an earlier call on the same warm machine is
  # kept (its stamp: the sources' checksum).
  pip_build() {
    if [ -f "$2/.sources" ] && [ "$(cat "$2/.sources")" = "$(sources_stamp "$1")" ]; then
      echo "kept from an earlier call" >"$LOGS/pip-$(basename "$2").log"; return 0
    fi
    # The machine's python has no cuDNN frontend wheel: its headers carried in .ref/cudnn-frontend
    # (a copy of the wheel's include/), else the package's cuDNN graphs are compiled out.
    local frontend=()
    [ -f .ref/cudnn-frontend/include/cudnn_frontend.h ] &&
      frontend=(-C "cmake.define.CUDNN_FRONTEND_INCLUDE_DIR=$PWD/.ref/cudnn-frontend/include")
    rm -rf "$2" && python3 -m pip install -q --no-build-isolation --no-deps --target "$2" \
      "$1/python" -C "build-dir=$2-build" "${frontend[@]}" >"$LOGS/pip-$(basename "$2").log" 2>&1 &&
      sources_stamp "$1" >"$2/.sources"
  }
  say "packages: building this tree's$([ -d .ref/old ] && echo " and .ref/old's")"
  pip_build . /tmp/bundle-pkg-new & new_pid=$!
  [ -d .ref/old ] && { pip_build .ref/old /tmp/bundle-pkg-old & old_pid=$!; } ;;
wallclock)
  python_package wallclock || continue
  old=(); [ -d .ref/bundle/python-old ] && old=(--old-package .ref/bundle/python-old)
  [ -n "${PACKAGE_OLD:-}" ] && old=(--old-package "$PACKAGE_OLD")
  : "${WALLCLOCK_ARGS:=--cells r50_frozen_head:256,r18_full:32 --impls eager,tandem-py --fit-steps-first 300 --n 50}"
  # WALLCLOCK_ARGS2: a second run after the first (other cells or impls; wallclock-2.json).
  run=1
  for args in "$WALLCLOCK_ARGS" ${WALLCLOCK_ARGS2:+"$WALLCLOCK_ARGS2"}; do
    name=wallclock$([ "$run" = 1 ] || echo "-$run")
    say "wallclock ($name): $args"
    # shellcheck disable=SC2086
    timeout $(($(left) - 5)) python3 benchmarks/wallclock.py "${old[@]}" $args \
      --cache-dir "/tmp/bundle-$name" --out "$OUT/$name.json" >"$LOGS/$name.log" 2>&1
    say "wallclock ($name): exit $?"
    tail -12 "$LOGS/$name.log" | tee -a "$LOGS/summary.log"
    run=$((run + 1))
  done ;;
firststep)
  # A first fit's runtime calls under torch.profiler, in a first process and a second one on
  # its kept plans (benchmarks/lab/first_step_profile.py; FIRSTSTEP_ARGS: e.g. --job, --bs;
  # FIRSTSTEP_ENV: variables both processes run with, e.g. TANDEM_KERNEL_WARMUP=1).
  python_package firststep || continue
  rm -rf /tmp/bundle-firststep
  for label in cold warm; do
    # shellcheck disable=SC2086
    env ${FIRSTSTEP_ENV:-} TANDEM_MODE_CACHE=/tmp/bundle-firststep timeout $(($(left) - 5)) \
      python3 benchmarks/lab/first_step_profile.py "$OUT" --label "$label" ${FIRSTSTEP_ARGS:-} \
      >"$LOGS/firststep-$label.log" 2>&1
    say "firststep ($label): exit $?"
    tail -3 "$LOGS/firststep-$label.log" | tee -a "$LOGS/summary.log"
  done ;;
profile)
  await_packages  # no build beside a timed phase
  say "profile: ResNet-50 and ResNet-18 steps, kernel by kernel"
  timeout $(($(left) - 10)) bash benchmarks/profile_resnet.sh "$OUT" build r50_full r18_full \
    2>&1 | tee -a "$LOGS/summary.log"
  mv "$OUT"/kernels-*.txt "$LOGS/" 2>/dev/null ;;
train)
  await_packages  # no build beside a timed phase
  [ "$(left)" -gt 120 ] || { say "train: skipped ($(left) s left)"; continue; }
  say "train: photos 320-640 px, ResNet-18, the first evaluation beside the later ones"
  make_photo_folder
  folder=$photo_folder
  [ -d "$folder-val" ] || python3 scripts/make_image_folder.py "$folder-val" --count 2000 \
    --classes 10 --seed 1 >>"$LOGS/make-folder.log" 2>&1
  # The tree's build, and where packed (.ref/bundle-old: an older build's libraries, found
  # before the bundle's through LD_LIBRARY_PATH) the older one, alternating.
  # TRAIN_EAGER_LOADING=1 adds a run of the older build (the split only) with every CUDA module
  # loaded at start (CUDA_MODULE_LOADING=EAGER): how much of a first evaluation is the lazy
  # loading of kernels the training never launched.
  # TRAIN_BUILDS overrides the builds' order (e.g. "new new-again": this build twice, the second
  # run on the plans file the first wrote); TRAIN_PRECISION the precision (bf16).
  builds=(new); [ -d .ref/bundle-old/build ] && builds=(new old)
  [ -n "${TRAIN_BUILDS:-}" ] && read -r -a builds <<<"$TRAIN_BUILDS"
  for held in split folder; do
    if [ "$held" = split ]; then val=(--val-split 0.1); else val=(--val "$folder-val"); fi
    runs=("${builds[@]}")
    [ "$held" = split ] && [ "${TRAIN_EAGER_LOADING:-0}" = 1 ] && runs+=("${builds[-1]}-eager")
    for which in "${runs[@]}"; do
      use_build "$which"
      loading=${CUDA_MODULE_LOADING:-LAZY}
      [ "${which%-eager}" != "$which" ] && loading=EAGER
      CUDA_MODULE_LOADING=$loading LD_LIBRARY_PATH="$libs$LD_LIBRARY_PATH" timeout $(($(left) - 5)) "$cli" train \
        --data "$folder" "${val[@]}" --model resnet18 --precision "${TRAIN_PRECISION:-bf16}" \
        --channels-last --batch-size 256 --optimizer sgd --lr 0.1 --epochs 4 --workers 15 --quiet \
        --out "$LOGS/run-$held-$which" --json "$LOGS/train-$held-$which.json" \
        >"$LOGS/train-$held-$which.log" 2>&1
      say "train ($held, $which build): exit $?"
    done
  done
  python3 - "$LOGS" "$OUT/evaluations.json" <<'EOF'
import json, os, sys
logs, out = sys.argv[1:]
rows = []
for held in ("split", "folder"):
  runs = sorted(d for d in os.listdir(logs) if d.startswith(f"run-{held}-"))
  for which in (d[len(f"run-{held}-"):] for d in runs):
    path = os.path.join(logs, f"run-{held}-{which}", "metrics.jsonl")
    if not os.path.exists(path):
        continue
    evals = [json.loads(line) for line in open(path) if line.strip()]
    evals = [e for e in evals if "eval_images_per_s" in e]
    rates = [e["eval_images_per_s"] for e in evals]
    later = rates[1:]
    report = os.path.join(logs, f"train-{held}-{which}.json")
    setup = json.load(open(report)).get("setup") if os.path.exists(report) else None
    rows.append({"held_out": held, "build": which, "eval_images_per_s": rates, "epochs": evals,
                 "first_over_later": rates[0] / (sum(later) / len(later)) if later else None,
                 "epoch_images_per_s": [e.get("epoch_images_per_s") for e in evals],
                 "setup": setup})
    print(held, which, "eval img/s:", [round(r) for r in rates],
          "epoch img/s:", [round(e.get("epoch_images_per_s") or 0) for e in evals],
          "setup:", setup)
json.dump({"card": os.popen("nvidia-smi --query-gpu=name --format=csv,noheader").read().strip(),
           "rows": rows}, open(out, "w"), indent=1)
EOF
  ;;
gputest)
  [ "$(left)" -gt 60 ] || { say "gputest: skipped ($(left) s left)"; continue; }
  say "gputest: the gpu-labelled tests in $(left) s"
  (cd build && timeout "$(within "${GPUTEST_S:-}")" ctest -L gpu ${GPUTEST_REGEX:+-R "$GPUTEST_REGEX"} \
     --timeout 200 --output-on-failure) >"$LOGS/gputest.log" 2>&1
  say "gputest: exit $?"
  grep -E 'tests passed|Failed|\*\*\*|Timeout|Not Run' "$LOGS/gputest.log" | tail -30 |
    tee -a "$LOGS/summary.log"
  grep -E 'Test +#' "$LOGS/gputest.log" >"$OUT/gputest.txt" ;;
pytest)
  # The Python tests PYTEST_FILES names (default the convolution plans'), on the package the
  # packages phase built here; pytest from .ref/pytest (`pip install --target .ref/pytest
  # pytest` on this machine: the GPU machine has none and no network).
  await_packages
  [ -n "${PACKAGE_NEW:-}" ] || { say "pytest: skipped (no package built here)"; continue; }
  say "pytest: ${PYTEST_FILES:=python/tests/test_conv_plans.py}"
  # shellcheck disable=SC2086
  PYTHONPATH=$PACKAGE_NEW:$PWD/.ref/pytest timeout "$(within "${PYTEST_S:-}")" \
    python3 -m pytest -q -p no:cacheprovider $PYTEST_FILES >"$LOGS/pytest.log" 2>&1
  say "pytest: exit $?"
  grep -E 'passed|failed|Error|error' "$LOGS/pytest.log" | tail -15 | tee -a "$LOGS/summary.log" ;;
resnet_ab)
  await_packages  # no build beside a timed phase
  # The ResNets' training step (resident batches, bf16, channels-last, pipelined+graphed) on this
  # build and on .ref/bundle-old's, alternating, ROUNDS times: img/s per model and build, and
  # ResNet-50's against MLPerf's per-GPU rate for the card; each process's wall seconds beside
  # (its start, cuDNN's tuning and the capture are in them). env: RESNET_AB_MODELS (r50_full
  # r18_full), BATCH (256), STEPS (100), ROUNDS (2), RESNET_AB_TUNED and RESNET_AB_TUNED2 (bench
  # flags: a third and fourth variant, this build with them, e.g. "--cudnn-benchmark-limit 0";
  # a later --param wins; a variant's --batch-size replaces BATCH), RESNET_AB_FLAGS (bench flags
  # every variant takes, before its own, e.g. "--param precision=fp16"; with "--param
  # source=files" and no --data, the step from the generated photo folder with its loader and
  # crops: the photo path's A/B).
  [ -d .ref/bundle-old/build ] || { say "resnet_ab: skipped (no .ref/bundle-old/build)"; continue; }
  say "resnet_ab: ${RESNET_AB_MODELS:=r50_full r18_full}, this build against .ref/bundle-old's"
  for round in $(seq "${ROUNDS:-2}"); do
    for which in new old ${RESNET_AB_TUNED:+tuned} ${RESNET_AB_TUNED2:+tuned2}; do
      use_build "$which"
      own=""
      [ "$which" = tuned ] && own=$RESNET_AB_TUNED
      [ "$which" = tuned2 ] && own=$RESNET_AB_TUNED2
      read -ra extra <<<"${RESNET_AB_FLAGS:-} $own"
      batch=(--batch-size "${BATCH:-256}")  # a variant's own --batch-size replaces it
      [[ " ${extra[*]} " == *" --batch-size "* ]] && batch=()
      if [[ " ${extra[*]} " == *" source=files "* && " ${extra[*]} " != *" --data "* ]]; then
        make_photo_folder
        extra+=(--data "$photo_folder" --workers 15)
      fi
      for model in $RESNET_AB_MODELS; do
        [ "$(left)" -gt 30 ] || break 3
        started=$(date +%s.%N)
        LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}" timeout $(($(left) - 10)) "$cli" bench \
          --workload images --param source=resident --param model="$model" \
          --param precision=bf16 --param layout=channels_last "${batch[@]}" \
          --mode pipelined+graphed --steps "${STEPS:-100}" "${extra[@]}" \
          --json "$LOGS/resnet-$model-$which-$round.json" \
          >"$LOGS/resnet-$model-$which-$round.txt" 2>&1
        status=$?
        awk -v a="$started" -v b="$(date +%s.%N)" 'BEGIN {print b - a}' \
          >"$LOGS/resnet-$model-$which-$round.wall"
        say "resnet_ab: $model $which round $round: exit $status"
      done
    done
  done
  python3 benchmarks/resnet_ab_table.py "$LOGS" "$OUT/resnet-ab.json" | tee -a "$LOGS/summary.log" ;;
scenario_ab)
  await_packages  # no build beside a timed phase
  # The reference workloads' steps (`tandem bench --scenario`) on this build and on
  # .ref/bundle-old's, alternating which goes first, ROUNDS times; the table is resnet_ab's
  # (each cell a "model" there). env: SCENARIO_AB_CELLS (JOB:BS:MODE ..., default the seg and cls
  # cells every kernel change is held to), ROUNDS (2), STEPS (100).
  [ -d .ref/bundle-old/build ] || { say "scenario_ab: skipped (no .ref/bundle-old/build)"; continue; }
  cells=${SCENARIO_AB_CELLS:-seg:8:pipelined+graphed seg:32:pipelined+graphed cls:32:pipelined+graphed cls:128:pipelined}
  say "scenario_ab: $cells, this build against .ref/bundle-old's"
  mkdir -p "$LOGS/scenario"
  for round in $(seq "${ROUNDS:-2}"); do
    order="old new"; [ $((round % 2)) = 0 ] && order="new old"
    for cell in $cells; do
      IFS=: read -r job bs mode <<<"$cell"
      for which in $order; do
        [ "$(left)" -gt 30 ] || break 3
        use_build "$which"
        name="$job$bs${mode//+/_}"
        LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:-}" timeout $(($(left) - 10)) "$cli" bench \
          --scenario "$job" --mode "$mode" --batch-size "$bs" --steps "${STEPS:-100}" \
          --warmup 10 --workers 8 --no-gpu-monitor \
          --json "$LOGS/scenario/resnet-$name-$which-$round.json" \
          >"$LOGS/scenario/resnet-$name-$which-$round.txt" 2>&1
        say "scenario_ab: $cell $which round $round: exit $?"
      done
    done
  done
  python3 benchmarks/resnet_ab_table.py "$LOGS/scenario" "$OUT/scenario-ab.json" |
    tee -a "$LOGS/summary.log" ;;
precision)
  await_packages  # no build beside a timed phase
  # `tandem train` from the generated photo folder (a tenth held out), ResNet-18, in each of
  # TRAIN_PRECISIONS (bf16 fp16) and --seed 1 and 2: the held-out accuracy and loss after
  # PRECISION_EPOCHS (12) epochs, and the training rate, each precision beside the others.
  make_photo_folder
  folder=$photo_folder
  for precision in ${TRAIN_PRECISIONS:-bf16 fp16}; do
    for seed in 1 2; do
      [ "$(left)" -gt 40 ] || break 2
      timeout $(($(left) - 5)) build/tandem train --data "$folder" --val-split 0.1 \
        --model resnet18 --precision "$precision" --channels-last --batch-size 256 \
        --optimizer sgd --lr 0.1 --epochs "${PRECISION_EPOCHS:-12}" --workers 15 --quiet \
        --seed "$seed" --out "$LOGS/precision-$precision-$seed" \
        >"$LOGS/precision-$precision-$seed.log" 2>&1
      say "precision $precision seed $seed: exit $?"
    done
  done
  python3 - "$LOGS" "$OUT/precision.json" <<'EOF' | tee -a "$LOGS/summary.log"
import glob, json, os, sys
logs, out = sys.argv[1:]
rows = []
for path in sorted(glob.glob(os.path.join(logs, "precision-*-*", "metrics.jsonl"))):
    _, precision, seed = os.path.basename(os.path.dirname(path)).split("-")
    evals = [json.loads(l) for l in open(path) if l.strip()]
    evals = [e for e in evals if "accuracy" in e]
    if not evals:
        continue
    last = evals[-1]
    rows.append({"precision": precision, "seed": int(seed), "accuracy": last["accuracy"],
                 "val_loss": last.get("val_loss"), "train_loss": last.get("train_loss"),
                 "epoch_images_per_s": [e.get("epoch_images_per_s") for e in evals],
                 "accuracy_by_epoch": [e["accuracy"] for e in evals]})
    print("precision", precision, "seed", seed, "accuracy", last["accuracy"],
          "val_loss", round(last.get("val_loss") or 0, 4),
          "last epoch img/s", round(evals[-1].get("epoch_images_per_s") or 0))
json.dump({"rows": rows}, open(out, "w"), indent=1)
EOF
  ;;
probe)
  # Which of cuDNN's fused convolution + batch-norm graphs run here, and their time beside the
  # plain convolutions (built on this machine's side: cudnn_fusion_probe.sh build).
  [ -x .ref/probe/cudnn_fusion_probe ] || { say "probe: skipped (no .ref/probe build)"; continue; }
  say "probe: cuDNN's fused convolution and batch-norm graphs"
  timeout $(($(left) - 5)) bash benchmarks/lab/cudnn_fusion_probe.sh run "$OUT" \
    >"$LOGS/probe.log" 2>&1
  say "probe: exit $?"; tail -40 "$LOGS/probe.log" | tee -a "$LOGS/summary.log" ;;
mlperf_resident|mlperf_photos)
  await_packages  # no build beside a timed phase
  # The ResNets against MLPerf's per-GPU rate (benchmarks/mlperf_table.py: mlperf.json, from
  # whichever of the two phases ran). mlperf_resident: compile_bench.py on resident batches,
  # tandem's C++ step, torch.compile and eager, bf16, channels-last, bs 256. mlperf_photos: from
  # generated photo folders (MLPERF_SIDES, default "320-640 1000-2000"; MLPERF_COUNT photos),
  # tandem's loader and step (`tandem bench --param source=files --param decode=auto`) and
  # torchvision's loop (train_bench.py). env: MLPERF_MODELS (r50_full r18_full), MLPERF_BS (the
  # resident rows' batch sizes, comma-separated: 256), MLPERF_PRECISION (bf16; fp16 or
  # "bf16,fp16": the resident rows' autocast, fp16 with torch's GradScaler in the plain loops),
  # MLPERF_IMPLS (tandem-cpp,compile,eager); tandem's photo rows run MLPERF_PRECISION's last.
  models=${MLPERF_MODELS:-r50_full r18_full}
  : "${MLPERF_PRECISION:=bf16}"
  if [ "$phase" = mlperf_resident ]; then
    [ "$(left)" -gt 120 ] || { say "mlperf_resident: skipped ($(left) s left)"; continue; }
    say "mlperf_resident: $models, tandem-cpp, torch.compile, eager"
    timeout $(($(left) - 10)) python3 benchmarks/compile_bench.py --jobs "${models// /,}" \
      --bs "${MLPERF_BS:-256}" --impls "${MLPERF_IMPLS:-tandem-cpp,compile,eager}" \
      --precision "$MLPERF_PRECISION" --mode pipelined+graphed \
      --steps 60 --warmup 15 \
      --tandem-cli build/tandem --timeout 240 --out "$LOGS/mlperf-resident.json" \
      >"$LOGS/mlperf-resident.log" 2>&1
    say "mlperf_resident: exit $?"
  else
    for sides in ${MLPERF_SIDES:-320-640 1000-2000}; do
      [ "$(left)" -gt 90 ] || { say "mlperf_photos: $sides skipped ($(left) s left)"; continue; }
      folder=/tmp/tandem-mlperf-$sides
      [ -d "$folder" ] || python3 scripts/make_image_folder.py "$folder" \
        --count "${MLPERF_COUNT:-3000}" --classes 10 --min-side "${sides%-*}" \
        --max-side "${sides#*-}" >>"$LOGS/make-folder.log" 2>&1
      for model in $models; do
        timeout $(($(left) - 10)) build/tandem bench --workload images --data "$folder" \
          --param source=files --param decode=auto --param model="$model" \
          --param precision="${MLPERF_PRECISION##*,}" --param layout=channels_last --batch-size 256 \
          --mode pipelined+graphed --steps 60 --warmup 10 --workers 15 --no-gpu-monitor \
          --json "$LOGS/mlperf-files-$sides-$model.json" >"$LOGS/mlperf-files-$sides-$model.txt" 2>&1
        say "mlperf_photos: $sides $model tandem: exit $?"
      done
      timeout $(($(left) - 10)) python3 benchmarks/train_bench.py --jobs "${models// /,}" \
        --data "$folder" --precision bf16 --channels-last --batch-sizes 256 --steps 30 \
        --workers 15 --out "$LOGS/mlperf-python-$sides.json" >"$LOGS/mlperf-python-$sides.log" 2>&1
      say "mlperf_photos: $sides torchvision's loop: exit $?"
    done
  fi
  python3 benchmarks/mlperf_table.py "$LOGS" "$OUT/mlperf.json" \
    --command "bash benchmarks/bundle_check.sh OUT $PHASES" | tee -a "$LOGS/summary.log" ;;
ncu)
  await_packages  # no build beside a timed phase
  # Each launch of the ResNet step's own kernels under Nsight Compute: its time, the bytes it
  # moved to and from memory and its grid, per call (one eager step after one warm-up step, so
  # every convolution shape appears once): which calls fall short of the memory's bandwidth.
  # env: NCU_MODELS (r50_full r18_full), NCU_KERNELS (a regex over kernel names), PRECISION
  # (bf16; also the profile phase's).
  for model in ${NCU_MODELS:-r50_full r18_full}; do
    [ "$(left)" -gt 60 ] || { say "ncu: $model skipped ($(left) s left)"; continue; }
    timeout $(($(left) - 10)) ncu --kernel-name \
      "regex:${NCU_KERNELS:-stats_|backward_|bn_apply|max_pool|AddPadding|elementwise_kernel|multi_tensor}" \
      --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,launch__grid_size,launch__block_size,dram__throughput.avg.pct_of_peak_sustained_elapsed \
      --csv --page raw build/tandem bench --workload images --param source=resident \
      --param model="$model" --param precision="${PRECISION:-bf16}" --param layout=channels_last \
      --batch-size 256 --mode serial --steps 1 --warmup 1 \
      >"$OUT/ncu-$model.csv" 2>"$LOGS/ncu-$model.log"
    say "ncu: $model exit $?, $(grep -c '"' "$OUT/ncu-$model.csv") rows"
    tail -3 "$LOGS/ncu-$model.log" | tee -a "$LOGS/summary.log"
  done ;;
sanitize)
  # The kernels' tests under each of compute-sanitizer's tools: memcheck (out-of-bounds and
  # misaligned accesses), racecheck (shared-memory hazards), synccheck (barriers).
  for tool in memcheck racecheck synccheck; do
    [ "$(left)" -gt 40 ] || { say "sanitize: $tool skipped ($(left) s left)"; continue; }
    timeout $(($(left) - 10)) compute-sanitizer --tool "$tool" --print-limit 20 \
      "${SANITIZE_BINARY:-build/tests/models/tandem_models_tests}" \
      --gtest_filter="${SANITIZE_FILTER:-BatchNormReluGpuTest.*:MaxPoolGpuTest.*:-*AResNet*}" \
      >"$LOGS/sanitize-$tool.log" 2>&1
    say "sanitize: $tool exit $?"
    grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|tests? ran|PASSED|FAILED' "$LOGS/sanitize-$tool.log" |
      tail -5 | tee -a "$LOGS/summary.log"
  done ;;
*) say "no phase '$phase' (packages, wallclock, profile, train, gputest, probe, resnet_ab, sanitize, ncu, mlperf_resident, mlperf_photos)" ;;
esac
done

say "done"
cp "$LOGS/summary.log" "$OUT/summary.log"
tar -C "$LOGS" -czf "$OUT/bundle-logs.tar.gz" --exclude='*.safetensors' --exclude='*.pt' . 2>/dev/null
