#!/usr/bin/env bash
# Where a Python process's C++ runtime symbols come from, for the crash the H200 machine showed
# (NOTES.md, "Known problem"): with tandem imported, the first C++ exception or fit crashed
# ("free(): invalid pointer", SIGSEGV) unless libstdc++.so.6 was preloaded. Prints which loaded
# libraries export operator new/delete, __cxa_* or std::string internals, and, through
# LD_DEBUG=bindings, which library tandem's own objects bind those symbols to — a library that
# bundles a copy of libstdc++ and wins the lookup is the suspect.
# Usage: PYTHONPATH=<tandem package> scripts/probe-libstdcxx.sh [OUT_DIR]
set -uo pipefail
out=${1:-.}
py=${PYTHON:-python3}
"$py" - <<'PY' 2>&1 | tee "$out/stdcxx-exporters.txt"
import subprocess
import torch
import tandem  # noqa: F401  (the crash needs it loaded)
libs = []
for line in open("/proc/self/maps"):
    path = line.split()[-1]
    if ".so" in path and path not in libs:
        libs.append(path)
syms = {"_Znwm", "_ZdlPv", "_ZdlPvm", "__cxa_throw", "__cxa_allocate_exception",
        "__cxa_free_exception", "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE10_M_disposeEv",
        "_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm"}
print(f"{len(libs)} libraries loaded, in load order; those exporting C++ runtime symbols:")
for lib in libs:
    nm = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True)
    found = sorted({l.split()[-1] for l in nm.stdout.splitlines() if l.split()} & syms)
    if found:
        print(f"  {lib}: {', '.join(found)}")
PY
# Which object each of tandem's libraries binds the runtime symbols to (the first exception).
LD_DEBUG=bindings LD_DEBUG_OUTPUT="$out/ld-bindings" "$py" -c '
import torch, tandem
try:
    tandem.data.Random(10, x=((2,), torch.uint8, 0, 300))
except ValueError as e:
    print("caught:", e)
' 2>&1 | tail -3
cat "$out"/ld-bindings.* 2>/dev/null |
  grep -E "binding file .*(tandem|_C\.cpython)" |
  grep -E "_Znwm|_ZdlPv|__cxa_throw|__cxa_allocate_exception|_M_dispose|_M_create" |
  sed -E 's/^ *[0-9]+: *//' | sort | uniq -c | sort -rn | head -40 | tee "$out/stdcxx-bindings.txt"
