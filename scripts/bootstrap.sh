#!/usr/bin/env bash
# Makes a fresh machine ready to build tandem: Debian packages, and a Python venv holding
# torch==2.11.0 (the CUDA 13.0 build, whose LibTorch we link) and nvidia-nvjpeg (nvjpeg.h).
# Idempotent and quick when done.
# Where python3 already has torch 2.11 with CUDA (the GPU machine), that torch is used instead.
# Prints, as its last three lines, KEY=VALUE for env.sh: python= (the Python whose torch the
# build links), cmake= (a CMake new enough for LibTorch + CUDA 13) and prefix= (LibTorch's
# CMAKE_PREFIX_PATH). Every Python check runs isolated (-I) from / so that no folder of the
# current directory (the project's own cmake/, say) can pass for a package.
set -euo pipefail
cd /

TORCH_VERSION=2.11.0
VENV=${TANDEM_VENV:-$HOME/.cache/tandem/venv-torch${TORCH_VERSION}}
say() { echo "[bootstrap] $*" >&2; }

# --- Debian packages ------------------------------------------------------------------------
DEB_PACKAGES=(build-essential ccache ninja-build pkg-config libgtest-dev libgmock-dev
  libbenchmark-dev libcli11-dev nlohmann-json3-dev libfmt-dev libspdlog-dev libjpeg-dev
  libpng-dev libturbojpeg0-dev zlib1g-dev
  dataset-fashion-mnist)  # IDX files for `tandem train`'s main job and its CPU acceptance test
if command -v dpkg-query >/dev/null 2>&1; then
  missing=()
  for p in "${DEB_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    say "installing Debian packages: ${missing[*]}"
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
    # A machine without a package mirror (e.g. an offline GPU box whose image already has the
    # libraries under other package names) must still build: warn, and let CMake say what is
    # really missing.
    if ! { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
           $SUDO apt-get install -y -qq "${missing[@]}"; } >&2; then
      say "warning: could not install ${missing[*]}; continuing with what is installed"
    fi
  else
    say "Debian packages present"
  fi
else
  say "no dpkg here: assuming the system libraries (GoogleTest, CLI11, nlohmann-json, ...) exist"
fi

# --- torch --------------------------------------------------------------------------------
# py_has PYTHON MODULE...: the interpreter imports every module, isolated from cwd and the user.
py_has() { local py=$1 modules; shift; modules="$*"; "$py" -I -c "import ${modules// /, }" 2>/dev/null; }
system_torch_ok() {
  python3 -I - <<PY 2>/dev/null
import torch, sys
ok = torch.__version__.startswith("${TORCH_VERSION}") and torch.version.cuda is not None
sys.exit(0 if ok else 1)
PY
}
if [ -z "${TANDEM_FORCE_VENV:-}" ] && system_torch_ok; then
  PY=python3
  say "using the system python3's torch ($(python3 -c 'import torch;print(torch.__version__)'))"
else
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating venv $VENV"
    mkdir -p "$(dirname "$VENV")"
    python3 -m venv "$VENV"
  fi
  PY="$VENV/bin/python"
  if ! "$PY" -I -c "import torch,sys; sys.exit(0 if torch.__version__.startswith('${TORCH_VERSION}') else 1)" 2>/dev/null; then
    say "installing torch==${TORCH_VERSION} into $VENV (a few GB, once per machine)"
    "$PY" -m pip install -q --upgrade pip >&2
    "$PY" -m pip install -q "torch==${TORCH_VERSION}" numpy >&2
  fi
  if ! py_has "$PY" cmake; then
    say "installing a recent cmake into the venv (LibTorch + CUDA 13 want cmake >= 3.27)"
    "$PY" -m pip install -q "cmake>=3.27" >&2
  fi
  # nvJPEG's header (and a libnvjpeg.so.13 fallback) for the data layer's GPU JPEG decoder,
  # which loads the library at run time. Optional: without it the decoder is compiled out.
  if ! "$PY" -m pip show -q nvidia-nvjpeg >/dev/null 2>&1; then
    say "installing nvidia-nvjpeg==13.0.* into the venv (nvjpeg.h for the GPU JPEG decoder)"
    "$PY" -m pip install -q "nvidia-nvjpeg==13.0.*" >&2 ||
      say "warning: could not install nvidia-nvjpeg; the GPU JPEG decoder will be compiled out"
  fi
  # cuDNN's C++ frontend (header-only; its wheel's include/ folder) for the models' fused
  # convolution + batch-norm graphs. --no-deps: only the headers are used, not its Python
  # side. Optional: without it those graphs are compiled out and the unfused kernels run.
  if ! "$PY" -m pip show -q nvidia-cudnn-frontend >/dev/null 2>&1; then
    say "installing nvidia-cudnn-frontend==1.32.0 into the venv (cuDNN's graph API headers)"
    "$PY" -m pip install -q --no-deps "nvidia-cudnn-frontend==1.32.0" >&2 ||
      say "warning: could not install nvidia-cudnn-frontend; the fused cuDNN graphs will be compiled out"
  fi
  # The Python package (python/): scikit-build-core builds it, pytest tests it.
  if ! py_has "$PY" scikit_build_core pytest; then
    say "installing scikit-build-core and pytest into the venv (the Python package's build, tests)"
    "$PY" -m pip install -q "scikit-build-core>=0.10" pytest >&2
  fi
  say "torch $("$PY" -I -c 'import torch;print(torch.__version__, "cuda", torch.version.cuda)') ready"
fi

# --- the tools the build uses -------------------------------------------------------------
PY=$(command -v "$PY")
# The CMake of that Python's cmake package (pip's, in the venv), one beside it, or the one on
# PATH (LibTorch + CUDA 13 want 3.27 or newer).
CMAKE=$("$PY" -I -c "import cmake, os; print(os.path.join(cmake.CMAKE_BIN_DIR, 'cmake'))" \
        2>/dev/null) || CMAKE=""
[ -n "$CMAKE" ] && [ -x "$CMAKE" ] || CMAKE=$(dirname "$PY")/cmake
[ -x "$CMAKE" ] || CMAKE=$(command -v cmake || echo cmake)
PREFIX=$("$PY" -I -c "import torch; print(torch.utils.cmake_prefix_path)") ||
  { say "error: $PY cannot import torch"; exit 1; }
echo "python=$PY"
echo "cmake=$CMAKE"
echo "prefix=$PREFIX"
