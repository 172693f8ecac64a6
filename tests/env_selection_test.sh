#!/usr/bin/env bash
# The set-up scripts choose a Python whose torch the build links, whatever the current directory
# and whatever CMake they find: with a scratch HOME and a venv (here a stand-in whose python runs
# the real one), and with "system torch, no venv" (a python3 first on PATH that has torch).
# Needs a Python with torch 2.11 (TANDEM_PYTHON, which scripts/test.sh exports); skips without.
set -u
root=$(cd "$(dirname "$0")/.." && pwd)
real=${TANDEM_PYTHON:-}
if [ -z "$real" ] || ! "$real" -I -c "import torch" 2>/dev/null; then
  echo "skipped: TANDEM_PYTHON names no Python with torch"
  exit 77
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0
check() {  # check <what> <condition...>
  local what=$1
  shift
  if "$@"; then passed=$((passed + 1)); else failed=$((failed + 1)); echo "FAIL: $what"; fi
}
# A stand-in venv: bin/python runs the real interpreter (so it has torch, pip's cmake and the
# build tools).
stand_in_venv() {
  mkdir -p "$1/bin"
  printf '#!/bin/sh\nexec "%s" "$@"\n' "$real" >"$1/bin/python"
  chmod +x "$1/bin/python"
}
# choose <cwd> <env...>: sources env.sh from cwd and prints what it chose, one per line.
choose() {
  local cwd=$1
  shift
  (cd "$cwd" && env "$@" bash -c 'source "$0/scripts/env.sh" &&
     printf "%s\n%s\n%s\n" "$TANDEM_PYTHON" "$TANDEM_CMAKE" "$TANDEM_TORCH_PREFIX"' "$root") \
    2>"$tmp/err"
}
cmake_is_recent() {
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^cmake version \([0-9]*\.[0-9]*\).*/\1/p')
  [ -n "$v" ] && printf '3.27\n%s\n' "$v" | sort -V -C
}
imports_torch() { "$1" -I -c "import torch" 2>/dev/null; }

# 1. A scratch HOME with a venv, from the repository root (whose cmake/ folder must not pass for
#    pip's cmake package) and from elsewhere: the venv's python and cmake are chosen.
home=$tmp/home && mkdir -p "$home"
stand_in_venv "$tmp/venv"
for cwd in "$root" "$tmp"; do
  mapfile -t got < <(choose "$cwd" HOME="$home" TANDEM_VENV="$tmp/venv" TANDEM_FORCE_VENV=1)
  check "venv, cwd $cwd: python ${got[0]:-none} is the venv's" [ "${got[0]:-}" = "$tmp/venv/bin/python" ]
  check "venv, cwd $cwd: cmake ${got[1]:-none} is 3.27 or newer" cmake_is_recent "${got[1]:-}"
  check "venv, cwd $cwd: the chosen python imports torch" imports_torch "${got[0]:-/nonexistent}"
  check "venv, cwd $cwd: a LibTorch prefix" [ -d "${got[2]:-/nonexistent}" ]
done
[ "$failed" -eq 0 ] || cat "$tmp/err"

# 2. System torch, no venv: python3 first on PATH has torch 2.11 with CUDA, the venv folder does
#    not exist. That python3 is chosen, and nothing is created in HOME.
mkdir -p "$tmp/sysbin" "$tmp/home2"
printf '#!/bin/sh\nexec "%s" "$@"\n' "$real" >"$tmp/sysbin/python3"
chmod +x "$tmp/sysbin/python3"
if "$real" -I -c "import sys, torch; sys.exit(0 if torch.version.cuda else 1)"; then
  mapfile -t got < <(choose "$root" HOME="$tmp/home2" PATH="$tmp/sysbin:$PATH")
  check "system torch: python ${got[0]:-none} is python3 on PATH" [ "${got[0]:-}" = "$tmp/sysbin/python3" ]
  check "system torch: the chosen python imports torch" imports_torch "${got[0]:-/nonexistent}"
  check "system torch: no venv created" [ ! -e "$tmp/home2/.cache/tandem" ]
  [ "$failed" -eq 0 ] || cat "$tmp/err"
else
  echo "note: this torch has no CUDA, so it is not a 'system torch' the bootstrap takes; case 2 not run"
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
