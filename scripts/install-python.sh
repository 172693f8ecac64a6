#!/usr/bin/env bash
# The Python package, in one command: built by the Python whose torch it links (the venv's, or
# the system's where the bootstrap chose it), with tandem's C++ libraries compiled from this
# checkout and shipped inside it — never an installed tandem found by chance (to link one you
# installed, give pip -C cmake.define.CMAKE_PREFIX_PATH=<prefix>). The build tree is
# build-python/ beside build/, with the main build's compiler and ccache's paths relative to the
# checkout, so after `scripts/build.sh` the libraries' objects come from the cache.
# Arguments go to pip (e.g. --target DIR, -q).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
source "$root/scripts/env.sh"
build=${TANDEM_BUILD_DIR:-$root/build}
cxx=""
[ -f "$build/CMakeCache.txt" ] && cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:FILEPATH=//p' "$build/CMakeCache.txt")
echo "[install-python] $TANDEM_PYTHON -m pip install --no-build-isolation --no-deps $root/python $*" >&2
# --no-deps: the torch already there is the one it links; pip must not fetch a second one.
CXX=${cxx:-${CXX:-c++}} CCACHE_BASEDIR="$root" "$TANDEM_PYTHON" -m pip install --no-build-isolation \
  --no-deps "$root/python" -C build-dir="$root/build-python" "$@"
