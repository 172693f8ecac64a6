#!/usr/bin/env bash
# The README's main job: build, then train the small CNN on Fashion-MNIST with `tandem train`
# and print its accuracy and speed. On a GPU: 10 epochs of the whole set. Without one: one epoch
# on a 12 000-image subset on the CPU (about a minute on 2 cores). Without Debian's
# dataset-fashion-mnist (the bootstrap installs it) it says so and trains on generated IDX files.
# Extra arguments go to `tandem train` (e.g. --precision bf16, --epochs 3). TANDEM_RUN_DIR names
# the run folder (default build/runs/fashion-mnist-<time>); it holds summary.json.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/env.sh"
# The CLI alone: the tests are test.sh's to build (TANDEM_BUILD_TARGETS= builds everything).
TANDEM_BUILD_TARGETS=${TANDEM_BUILD_TARGETS-tandem_cli} bash "$root/scripts/build.sh"
build=${TANDEM_BUILD_DIR:-$root/build}
tandem=$build/tandem
data=${TANDEM_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
if [ ! -f "$data/train-images-idx3-ubyte.gz" ] && [ ! -f "$data/train-images-idx3-ubyte" ]; then
  echo "[run] no Fashion-MNIST in $data (Debian package dataset-fashion-mnist): training on" \
       "generated IDX files instead (bars of 10 classes in noise)" >&2
  data=$build/generated-idx
  # The standard library only: any Python 3 writes them (the GPU machine's has no venv).
  "$TANDEM_PYTHON" - "$data" <<'PY'
import gzip, os, random, struct, sys
out = sys.argv[1]
os.makedirs(out, exist_ok=True)
rng = random.Random(0)
for prefix, n in (("train", 12000), ("t10k", 2000)):
    labels = bytes(rng.randrange(10) for _ in range(n))
    pixels = bytearray(rng.getrandbits(8) % 90 for _ in range(n * 28 * 28))
    for i, c in enumerate(labels):  # class c: a bright bar across rows 2c+2 .. 2c+4
        start = i * 784 + (2 * c + 2) * 28
        pixels[start:start + 3 * 28] = bytes(p + 160 for p in pixels[start:start + 3 * 28])
    with gzip.open(f"{out}/{prefix}-images-idx3-ubyte.gz", "wb") as f:
        f.write(struct.pack(">4I", 0x803, n, 28, 28) + bytes(pixels))
    with gzip.open(f"{out}/{prefix}-labels-idx1-ubyte.gz", "wb") as f:
        f.write(struct.pack(">2I", 0x801, n) + labels)
PY
fi
run_dir=${TANDEM_RUN_DIR:-$build/runs/fashion-mnist-$(date +%Y%m%d-%H%M%S)}
if "$TANDEM_PYTHON" -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null &&
   command -v nvidia-smi >/dev/null; then
  where="GPU found: the whole set"
  sizes=(--epochs 10)
else
  where="no GPU here: a 12 000-image subset on the CPU (about a minute on 2 cores)"
  sizes=(--epochs 1 --subset 12000 --val-subset 2000 --lr 2e-3 --warmup-epochs 0.1)
fi
# The defaults above give way to the same flags given on the command line (--epochs 3, ...).
defaults=()
for ((i = 0; i < ${#sizes[@]}; i += 2)); do
  [[ " $* " == *" ${sizes[i]} "* ]] || defaults+=("${sizes[i]}" "${sizes[i + 1]}")
done
args=(--data "$data" --model small_cnn ${defaults[@]+"${defaults[@]}"} --out "$run_dir"
      --json "$run_dir/summary.json" "$@")
echo "[run] $where, small CNN: tandem train ${args[*]}" >&2
"$tandem" train "${args[@]}"
