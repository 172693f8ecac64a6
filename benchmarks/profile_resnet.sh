#!/usr/bin/env bash
# Where a ResNet training step's device time goes, kernel by kernel: `tandem bench` on resident
# 224 px batches (bf16, channels_last, pipelined+graphed, the rate the ResNet work is measured
# by), its timed steps, then N more under LibTorch's profiler (--kernels). One JSON and one table
# per model into OUT.
#
#   bash benchmarks/profile_resnet.sh OUT [BUILD_DIR (build-gpu)] [MODELS (r50_full r18_full)]
#   env: BATCH (256), STEPS (60), KERNEL_STEPS (10), PRECISION (bf16; fp16: with its loss scale)
set -uo pipefail
OUT=${1:?usage: benchmarks/profile_resnet.sh OUT [BUILD_DIR] [MODELS...]}
BUILD=${2:-build-gpu}
shift $(($# < 2 ? $# : 2))
MODELS=${*:-r50_full r18_full}
mkdir -p "$OUT"
suffix=${PRECISION:+-$PRECISION}  # the files of an fp16 profile apart from bf16's
for model in $MODELS; do
  "$BUILD/tandem" bench --workload images --param source=resident --param model="$model" \
    --param precision="${PRECISION:-bf16}" --param layout=channels_last \
    --batch-size "${BATCH:-256}" \
    --mode pipelined+graphed --steps "${STEPS:-60}" --kernels "${KERNEL_STEPS:-10}" \
    --json "$OUT/kernels-$model$suffix.json" > "$OUT/kernels-$model$suffix.txt" 2>&1
  echo "[profile] $model: exit $? \
($(grep -m1 -iE 'img/s|images/s' "$OUT/kernels-$model$suffix.txt"))"
done
