#!/usr/bin/env bash
# The README's test command: set up a fresh machine if needed, build, run every test (arguments go
# to ctest), then install into a temporary prefix and build and run examples/ against it, as a
# user's project would (find_package(tandem)). GPU tests (label `gpu`) skip themselves where
# there is no CUDA device; the examples run on the CPU.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
trap 'echo "[test] FAILED (exit $?): $BASH_COMMAND" >&2' ERR
bash "$root/scripts/build.sh"
source "$root/scripts/env.sh"
ctest_bin=$(dirname "$TANDEM_CMAKE")/ctest
[ -x "$ctest_bin" ] || ctest_bin=ctest
build=${TANDEM_BUILD_DIR:-$root/build}
echo "[test] ctest in $build"
# ctest -j 2 runs two test processes on CI's 2 cores: one OpenMP thread each, or LibTorch's
# spinning thread pools oversubscribe the cores (CPU steps then vary up to 100x).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
(cd "$build" && "$ctest_bin" --output-on-failure -j 2 "$@")  # a failure ends the script here

SECONDS=0
prefix=$(mktemp -d "${TMPDIR:-/tmp}/tandem-test.XXXXXX")
# The README's Install block, in its order: `cmake --install` into a prefix that CMake searches
# by default (/opt/tandem*, where this user may write there), then the one-command Python
# package below, which must still carry its own libraries, not link that prefix.
installed=$prefix/usr
if [ -w /opt ]; then installed=$(mktemp -d /opt/tandem-test.XXXXXX); fi
trap 'rm -rf "$prefix"; [ "$installed" = "$prefix/usr" ] || rm -rf "$installed"' EXIT
echo "[test] install into $installed"
"$TANDEM_CMAKE" --install "$build" --prefix "$installed" >"$prefix/install.log" ||
  { cat "$prefix/install.log"; echo "[test] FAILED: cmake --install" >&2; exit 1; }
"$installed/bin/tandem" --help >/dev/null  # the installed CLI finds its libraries (RPATH)

# Only tandem's prefix: its package finds the LibTorch it was built against by itself.
echo "[test] examples: configure against the installed package, build"
launcher=()
if command -v ccache >/dev/null; then  # paths under the prefix hashed relative to it: hits
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  export CCACHE_BASEDIR="$installed"
fi
"$TANDEM_CMAKE" -S "$root/examples" -B "$prefix/examples" -G Ninja \
  -DCMAKE_PREFIX_PATH="$installed" "${launcher[@]}" >"$prefix/configure.log" 2>&1 ||
  { cat "$prefix/configure.log"; echo "[test] FAILED: configuring examples/" >&2; exit 1; }
"$TANDEM_CMAKE" --build "$prefix/examples" -j "$(nproc)"

echo "[test] examples: frozen_backbone --device cpu"
"$prefix/examples/frozen_backbone" --device cpu --steps 4 --batch-size 4
echo "[test] examples: data_parallel --nproc 2 --device cpu"
"$prefix/examples/data_parallel" --nproc 2 --device cpu --steps 16
if [ -x "$prefix/examples/train_your_job" ]; then
  echo "[test] examples: train_your_job --epochs 2, then --resume (the run is complete)"
  "$prefix/examples/train_your_job" --out "$prefix/run" --epochs 2
  "$prefix/examples/train_your_job" --out "$prefix/run" --epochs 2 --resume
fi
echo "[test] examples: augmented_classifier --device cpu --mode auto --sweep --trace"
"$prefix/examples/augmented_classifier" --device cpu --steps 2 --batch-size 2 --mode auto \
  --sweep --trace "$prefix/trace.json"
[ -s "$prefix/trace.json" ] || { echo "[test] FAILED: no trace written" >&2; exit 1; }

# The Python package (python/), in one command as the README says (scripts/install-python.sh):
# scikit-build-core builds tandem's libraries from this checkout into the package, from the cache
# the main build filled, whatever tandem is installed where CMake looks by default.
echo "[test] python: bash scripts/install-python.sh (one command), with tandem in $installed"
SECONDS_PIP=$SECONDS
bash "$root/scripts/install-python.sh" -q --target "$prefix/py" >"$prefix/pip.log" 2>&1 ||
  { tail -40 "$prefix/pip.log"; echo "[test] FAILED: building the Python package" >&2; exit 1; }
echo "[test] python: the one-command package built in $((SECONDS - SECONDS_PIP)) s"
ls "$prefix"/py/tandem/libtandem.so >/dev/null ||
  { echo "[test] FAILED: the one-command package does not carry libtandem.so" >&2; exit 1; }
if readelf -d "$prefix"/py/tandem/_C*.so | grep -q "$installed"; then
  echo "[test] FAILED: the one-command package links the installed tandem in $installed" >&2; exit 1
fi
# The two-step route, against the tandem installed above: the wheel that a release ships.
echo "[test] python: pip wheel against the installed tandem (one per torch minor: its version and torch pin)"
"$TANDEM_PYTHON" -m pip wheel -q --no-build-isolation --no-deps -w "$prefix/wheel" "$root/python" \
  -C cmake.define.CMAKE_PREFIX_PATH="$installed" -C build-dir="$prefix/wheel-build" \
  >"$prefix/wheel.log" 2>&1 ||
  { tail -40 "$prefix/wheel.log"; echo "[test] FAILED: building the wheel" >&2; exit 1; }
"$TANDEM_PYTHON" - "$prefix"/wheel/tandem-*.whl <<'PY'
import re, sys, zipfile, torch
major, minor = (int(x) for x in re.match(r"(\d+)\.(\d+)", torch.__version__).groups())
wheel = sys.argv[1]
assert f"+torch{major}.{minor}-" in wheel, f"{wheel}: expected the version to name torch {major}.{minor}"
meta = next(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".dist-info/METADATA"))
requires = [l for l in zipfile.ZipFile(wheel).read(meta).decode().splitlines()
            if l.startswith("Requires-Dist: torch")]
pin = sorted(requires[0].split(": ")[1].replace("torch", "").split(","))
assert pin == sorted([f">={major}.{minor}", f"<{major}.{minor + 1}"]), requires
print(f"[test] wheel {wheel.rsplit('/', 1)[-1]} requires {requires[0].split(': ')[1]}")
PY
echo "[test] python: pytest python/tests"
# TANDEM_CLI: the bad-data corpus runs this build's CLI beside the package.
TANDEM_CLI="$build/tandem" PYTHONPATH="$prefix/py" "$TANDEM_PYTHON" -m pytest -q "$root/python/tests" -p no:cacheprovider
echo "[test] python: examples/cls_trainer.py (tandem.Trainer) on the CPU, 2 steps"
PYTHONPATH="$prefix/py" "$TANDEM_PYTHON" "$root/python/examples/cls_trainer.py" --device cpu \
  --bs 2 --steps 2 >"$prefix/cls_trainer.log" ||
  { cat "$prefix/cls_trainer.log"; echo "[test] FAILED: cls_trainer.py" >&2; exit 1; }
echo "[test] python: examples/own_data.py (a torch Dataset through tandem.Trainer) on the CPU"
PYTHONPATH="$prefix/py" "$TANDEM_PYTHON" "$root/python/examples/own_data.py" --device cpu \
  --epochs 4 | tail -1
echo "[test] python: examples/own_data.py under torchrun, 2 ranks on the CPU (data parallel)"
PYTHONPATH="$prefix/py" "$TANDEM_PYTHON" -m torch.distributed.run --standalone \
  --nproc-per-node 2 "$root/python/examples/own_data.py" --device cpu --epochs 4 | tail -1
fm=/usr/share/datasets/fashion-mnist
if [ -f "$fm/train-images-idx3-ubyte.gz" ]; then
  echo "[test] python: examples/plain_loop.py on Fashion-MNIST, 100 steps"
  PYTHONPATH="$prefix/py" "$TANDEM_PYTHON" "$root/python/examples/plain_loop.py" \
    "$fm/train-images-idx3-ubyte.gz" "$fm/train-labels-idx1-ubyte.gz" --device cpu --epochs 1 \
    --max-steps 100
fi
# The README's main job as a fresh machine without Fashion-MNIST runs it: generated IDX files.
echo "[test] run.sh without Fashion-MNIST (generated IDX files), on the CPU"
TANDEM_FASHION_MNIST="$prefix/no-fashion-mnist" TANDEM_BUILD_DIR="$build" \
  TANDEM_RUN_DIR="$prefix/run-generated" bash "$root/scripts/run.sh" >"$prefix/run.log" 2>&1 ||
  { tail -30 "$prefix/run.log"; echo "[test] FAILED: scripts/run.sh" >&2; exit 1; }
"$TANDEM_PYTHON" - "$prefix/run-generated/summary.json" <<'PY'
import json, sys
accuracy = json.load(open(sys.argv[1]))["accuracy"]
print(f"[test] run.sh on generated IDX files: accuracy {accuracy:.4f}")
assert accuracy > 0.5, f"run.sh learned nothing on generated IDX files: accuracy {accuracy}"
PY
echo "[test] passed: ctest, the installed package with its examples, the Python package and run.sh (${SECONDS} s after ctest)"
