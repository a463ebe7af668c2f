#!/usr/bin/env bash
# hpp_cxx17.sh — gpuguard.hpp before C++17 stops with one clear error, not template errors from inside
# the header; the same file compiles with -std=c++17, so the check is not vacuous. Each C++ compiler found
# (the build's, clang++) is tried. Arguments: build dir, source dir.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
fail() { cat "$tmp" >&2; echo "FAIL: $*" >&2; exit 1; }
compilers=("$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build/CMakeCache.txt")")
if command -v clang++ >/dev/null; then compilers+=(clang++); fi
for cxx in "${compilers[@]}"; do
  flags=(-fsyntax-only -Wall -Wextra -I "$src/include" -I "$build/generated" "$src/tests/hpp_probe.cpp")
  "$cxx" -std=c++17 "${flags[@]}" 2>"$tmp" || fail "$cxx -std=c++17 does not compile hpp_probe.cpp"
  if "$cxx" -std=c++14 "${flags[@]}" 2>"$tmp"; then fail "$cxx -std=c++14 compiled gpuguard.hpp"; fi
  # The first error says why; the header itself gives no other (the probe's own uses of gg:: may fail).
  grep -m1 "error:" "$tmp" | grep -q "gpuguard.hpp needs C++17" ||
    fail "$cxx -std=c++14: the first error is not 'needs C++17'"
  n=$(grep -c "include/gpuguard/.*error:" "$tmp" || true)
  [ "$n" = 1 ] || fail "$cxx -std=c++14: $n errors inside the headers, wanted the one that says why"
done
echo "gpuguard.hpp: C++17 compiles, C++14 stops with 'needs C++17' (${compilers[*]})"
