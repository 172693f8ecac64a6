#!/usr/bin/env bash
# This machine's CUDA build, carried to the GPU machine instead of built there: building the CLI
# and the tests on the GPU machine costs minutes of its time, and this machine builds the same
# code for the same card (sm_90), against the same torch wheel.
#
#   bash scripts/gpu-bundle.sh pack [BUILD (build)] [PACKAGE_DIR [OLD_PACKAGE_DIR]]   (here)
#   source scripts/gpu-bundle.sh env                                  (there, in the repo root)
#
# pack copies the build tree's programs, libraries and CTest files (GoogleTest's discovered lists
# included; the same layout) into
# .ref/bundle/build, the non-torch libraries they link (libstdc++, TurboJPEG, libjpeg, libpng)
# into .ref/bundle/lib and, given PACKAGE_DIR (a `pip install --target` of ./python), the Python
# package into .ref/bundle/python (and an older tree's, for an A/B, into .ref/bundle/python-old).
# Carry .ref/bundle (the device tool's `carry`).
# env, on the GPU machine: links build -> .ref/bundle/build and, where this machine's build
# path is absent there, that path to the repository root (CTest files name absolute paths), and
# exports LD_LIBRARY_PATH (the bundle's libraries, then torch's, NCCL's and CUDA's wheels of the
# machine's python3) and PYTHONPATH (the package, when its Python version matches; the older
# one is .ref/bundle/python-old, for benchmarks/wallclock.py --old-package). The
# bundle's libstdc++ is used only where the machine's own is older than the one it was built
# with.
set -uo pipefail

bundle_pack() {
  local build=${1:-build} package=${2:-} old_package=${3:-} root dest
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  dest="$root/.ref/bundle"
  rm -rf "$dest" && mkdir -p "$dest/build" "$dest/lib" || return 1
  (cd "$root/$build" && find . \( -name CMakeFiles -prune \) -o -type f \
     \( -perm -u+x -o -name '*.so' -o -name 'CTestTestfile.cmake' -o -name '*_include.cmake' \
        -o -name '*_tests*.cmake' \) -print0 |
     xargs -0 cp --parents -p -t "$dest/build") || return 1
  # The libraries a fresh GPU machine may lack or have older: whatever the build links outside
  # torch, CUDA and the C library.
  find "$dest/build" -type f \( -perm -u+x -o -name '*.so' \) -exec ldd {} + 2>/dev/null |
    awk '$3 ~ /^\// {print $3}' | sort -u |
    grep -E 'libstdc\+\+|libgcc_s|libturbojpeg|libjpeg|libpng|libz\.' |
    xargs -r -I{} cp -L {} "$dest/lib/" || return 1
  if [ -n "$package" ]; then
    cp -r "$package" "$dest/python" && find "$dest/python" -name __pycache__ -prune -exec rm -rf {} +
  fi
  if [ -n "$old_package" ]; then
    cp -r "$old_package" "$dest/python-old" &&
      find "$dest/python-old" -name __pycache__ -prune -exec rm -rf {} +
  fi
  # The extension's tag (cpython-311) says which Python can import it.
  ls "$dest"/python/tandem/_C.cpython-*.so 2>/dev/null | sed -E 's/.*cpython-([0-9]+).*/\1/' \
    >"$dest/python-version"
  echo "bundle: $(du -sh "$dest" | cut -f1) in $dest"
}

bundle_env() {
  local root site newest_here
  root=$(pwd)
  [ -d "$root/.ref/bundle/build" ] || { echo "bundle: no .ref/bundle here (carry .ref)" >&2; return 1; }
  [ -d build ] && [ ! -L build ] && mv build "build.before-bundle.$$"  # a build made there
  ln -sfn .ref/bundle/build build
  # The CTest files and RUNPATHs name the path the bundle was built in.
  local built_at
  built_at=$(sed -n 's/^# Build directory: //p' .ref/bundle/build/CTestTestfile.cmake | head -1)
  built_at=${built_at%/build}
  if [ -n "$built_at" ] && [ ! -e "$built_at" ]; then
    mkdir -p "$(dirname "$built_at")" && ln -s "$root" "$built_at"
  fi
  site=$(python3 -c 'import torch, os; print(os.path.dirname(os.path.dirname(torch.__file__)))')
  local libs="$site/torch/lib:$site/nvidia/nccl/lib:$site/nvidia/cu13/lib:/usr/local/cuda/lib64"
  local ours="$root/.ref/bundle/lib"
  # The bundle's libstdc++ only where the machine's is older (a newer one serves both).
  newest_here=$(strings "$(ldconfig -p | awk '/libstdc\+\+\.so\.6 / {print $NF; exit}')" 2>/dev/null |
                grep -c '^GLIBCXX_3\.4\.30$')
  if [ "${newest_here:-0}" -gt 0 ]; then
    mkdir -p "$root/.ref/bundle/lib-nostd"
    find "$ours" -maxdepth 1 -type f ! -name 'libstdc++*' ! -name 'libgcc_s*' \
      -exec ln -sf {} "$root/.ref/bundle/lib-nostd/" \;
    ours="$root/.ref/bundle/lib-nostd"
  fi
  export LD_LIBRARY_PATH="$ours:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if [ -d .ref/bundle/python ] &&
     [ "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" = \
       "$(sed -E 's/^([0-9])/\1./' .ref/bundle/python-version 2>/dev/null)" ]; then
    export PYTHONPATH="$root/.ref/bundle/python${PYTHONPATH:+:$PYTHONPATH}"
    export TANDEM_BUNDLE_PYTHON=1
  else
    export TANDEM_BUNDLE_PYTHON=0
  fi
  export TANDEM_CLI="$root/build/tandem"
  echo "bundle: build -> .ref/bundle/build; python package: $TANDEM_BUNDLE_PYTHON"
}

case "${1:-}" in
  pack) shift; bundle_pack "$@" ;;
  env) bundle_env ;;
  *) echo "usage: bash scripts/gpu-bundle.sh pack [BUILD] [PACKAGE_DIR] | source scripts/gpu-bundle.sh env" >&2
     return 2 2>/dev/null || exit 2 ;;
esac
