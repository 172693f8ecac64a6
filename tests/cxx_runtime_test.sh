#!/usr/bin/env bash
# Each given binary uses the shared C++ runtime and carries no copy of its own: it defines none
# of libstdc++'s core symbols (operator new/delete, __cxa_throw, std::string's storage). A copy
# linked in from libstdc++.a crashed Python processes beside LibTorch's runtime
# (cmake/TandemCxxRuntime.cmake).
# Usage: cxx_runtime_test.sh BINARY...
set -uo pipefail
symbols='^(_Znwm|_ZdlPv|_ZdlPvm|__cxa_throw|__cxa_allocate_exception|_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm)$'
command -v nm >/dev/null || { echo "nm (binutils) is needed"; exit 1; }
status=0
for binary in "$@"; do
  copies=$(nm -D --defined-only "$binary" | awk '{print $NF}' | grep -E "$symbols")
  if [ -n "$copies" ]; then
    echo "FAIL $binary defines the C++ runtime's own symbols (a static libstdc++ linked in):"
    echo "$copies" | sed 's/^/  /'
    status=1
  elif ! readelf -d "$binary" | grep -q 'NEEDED.*libstdc++\.so'; then
    echo "FAIL $binary does not link libstdc++.so"
    status=1
  else
    echo "ok   $binary: libstdc++.so, no copy of its own"
  fi
done
exit $status
