#!/usr/bin/env bash
# The wall-clock A/B on the GPU machine, in one call: this tree's Python package against an old
# source tree's (`git archive REV` unpacked into OLD_TREE, carried along), both built alike with
# pip, then benchmarks/wallclock.py with --old-package (each tandem row run on both, the plain
# loops once). Beside it, while the packages build: the GPU-labelled C++ tests TESTS names (a
# ctest -R regex; empty: none) through scripts/gpu-check.sh, then python/tests/test_trainer.py
# on CUDA. Everything lands in OUT: wallclock.json, pytest.log, chk/, the build logs.
#
#   bash benchmarks/wallclock_ab.sh OUT [OLD_TREE|none] [WALLCLOCK ARGS...]
#   env: STEPS (default "build pytest wallclock": any of them, in that order, so that a call
#        within the device's time limit can build and a second one on the warm machine run),
#        TESTS (built and run with "build"; default the runner, graph and trainer GPU tests),
#        PYTEST_WHEELS (.ref/debs/wheels: where pytest's wheel is; the machine has no network),
#        PYTEST_K (a pytest -k expression: a part of test_trainer.py). OLD_TREE "none": this
#        tree alone (no A/B: where a call's time cannot fit two builds)
set -uo pipefail
OUT=${1:?usage: benchmarks/wallclock_ab.sh OUT [OLD_TREE] [wallclock.py args...]}
OLD=${2:-.ref/old}
shift $(($# < 2 ? $# : 2))
mkdir -p "$OUT"
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
TESTS=${TESTS-RunnerGpuTest|GraphedStageGpuTest|GraphGpuTest|LossLogGpuTest|TrainerGpuTest|KeptThreads}
STEPS=" ${STEPS:-build pytest wallclock} "
say() { echo "[wallclock-ab $(date +%T)] $*"; }

pip_build() {  # SOURCE_TREE DEST: the package into DEST/py
  rm -rf "$2/py"
  python3 -m pip install -q --no-build-isolation --no-deps --target "$2/py" "$1/python" \
    -C "build-dir=$2/build"
}
if [[ $STEPS == *" build "* ]]; then
say "building the packages (this tree, $OLD) and the test binaries"
(pip_build "$root" "$root/build-ab-new" > "$OUT/pip-new.log" 2>&1; echo $? > "$OUT/pip-new.rc") &
if [ "$OLD" != none ]; then
  (pip_build "$(cd "$OLD" && pwd)" "$root/build-ab-old" > "$OUT/pip-old.log" 2>&1
   echo $? > "$OUT/pip-old.rc") &
else
  echo "not built (none)" > "$OUT/pip-old.rc"
fi
if [ -n "$TESTS" ]; then
  TANDEM_BUILD_TARGETS="tandem_core_tests tandem_train_tests" TANDEM_GPUTEST_REGEX="$TESTS" \
    scripts/gpu-check.sh "$OUT/chk" build gputest > "$OUT/gpu-check.log" 2>&1
  say "gpu tests: exit $? ($(grep -cE 'Passed' "$OUT/gpu-check.log") passed," \
      "$(grep -cE 'Failed|\*\*\*Exception' "$OUT/gpu-check.log") failed)"
fi
wait
say "packages: new exit $(cat "$OUT/pip-new.rc"), old exit $(cat "$OUT/pip-old.rc")"
fi
deps=$root/build-gpu-deps/usr/lib/x86_64-linux-gnu  # TurboJPEG from the .debs, where unpacked
[ -d "$deps" ] && export LD_LIBRARY_PATH=$deps${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
if [[ $STEPS == *" pytest "* ]]; then
python3 -m pip install -q --no-index --find-links "${PYTEST_WHEELS:-.ref/debs/wheels}" \
  --target /tmp/wallclock-ab-pytest pytest > /dev/null 2>&1
PYTHONPATH=$root/build-ab-new/py:/tmp/wallclock-ab-pytest timeout 300 python3 -m pytest -q \
  -p no:cacheprovider python/tests/test_trainer.py ${PYTEST_K:+-k "$PYTEST_K"} \
  > "$OUT/pytest.log" 2>&1
say "python/tests/test_trainer.py on CUDA: exit $? ($(tail -1 "$OUT/pytest.log"))"
fi
[[ $STEPS == *" wallclock "* ]] || exit 0
old_package=()
[ "$OLD" != none ] && old_package=(--old-package "$root/build-ab-old/py")
PYTHONPATH=$root/build-ab-new/py python3 benchmarks/wallclock.py "${old_package[@]}" \
  --out "$OUT/wallclock.json" "$@"
say "wallclock: exit $?"
