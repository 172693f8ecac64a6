#!/usr/bin/env bash
# The README's main job: build, then benchmark the seg workload serial vs pipelined.
# On a GPU: SPEC's sizes (batch 8, 100 timed steps). Without one: small sizes on the CPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
bash "$root/scripts/build.sh"
tandem=${TANDEM_BUILD_DIR:-$root/build}/tandem
if python3 -c 'import ctypes; ctypes.CDLL("libcuda.so.1")' 2>/dev/null && command -v nvidia-smi >/dev/null; then
  echo "[run] GPU found: seg benchmark at SPEC sizes" >&2
else
  echo "[run] no GPU here: running the seg benchmark on the CPU with small sizes" >&2
fi
for mode in serial pipelined; do
  "$tandem" bench --workload seg --mode "$mode" --json "${TANDEM_BUILD_DIR:-$root/build}/seg-$mode.json" "$@"
  echo
done
