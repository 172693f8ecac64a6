#!/usr/bin/env bash
# Downloads, on this machine (which reaches Debian's mirror and PyPI), what the offline GPU
# machine lacks: the data layer's .debs (TurboJPEG's and libjpeg's libraries and headers,
# Fashion-MNIST) into
# .ref/debs, and pytest's wheels (the python phase) into .ref/debs/wheels (git-ignored). Carry
# .ref/debs in the device call; scripts/gpu-check.sh (the build's libraries) and
# benchmarks/gpu_check.py (Fashion-MNIST, pytest) unpack and install from there.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.ref/debs"
cd "$root/.ref/debs"
apt-get download libturbojpeg0 libturbojpeg0-dev libjpeg62-turbo libjpeg62-turbo-dev dataset-fashion-mnist 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
python3 -m pip download -q --only-binary=:all: -d "$root/.ref/debs/wheels" pytest 2>&1 | tail -2 || true
ls -1 "$root/.ref/debs" "$root/.ref/debs/wheels"
