#!/usr/bin/env bash
# Downloads, on this machine (which reaches Debian's mirror), the .debs the offline GPU machine
# lacks for the data layer — TurboJPEG's library and header — into .ref/debs (git-ignored).
# Carry that folder in the device call; scripts/gpu-check.sh's build phase unpacks them.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$root/.ref/debs"
cd "$root/.ref/debs"
apt-get download libturbojpeg0 libturbojpeg0-dev dataset-fashion-mnist 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
ls -1 "$root/.ref/debs"
