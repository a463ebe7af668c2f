#!/usr/bin/env bash
# install_consumer.sh — `cmake --install` into a temporary prefix, then a consumer project finds the
# package with find_package(gpuguard), builds against the shared and static libraries, and runs; the
# pkg-config file gives working flags too; the installed `gpuguard` command starts without LD_LIBRARY_PATH,
# also after the whole prefix is moved (RUNPATH relative to the binary). Arguments: build dir, source dir.
set -euo pipefail
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
# A sanitized library needs a sanitized consumer.
san=$(sed -n 's/^GPUGUARD_SANITIZE:STRING=//p' "$build/CMakeCache.txt")
case "$san" in
  address) cflags="-fsanitize=address -fsanitize=undefined" ;;
  thread) cflags="-fsanitize=thread" ;;
  *) cflags="" ;;
esac
test -f "$tmp/prefix/include/gpuguard/gpuguard.h"
test -f "$tmp/prefix/include/gpuguard/version.h"
cmake -S "$src/tests/consumer" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$tmp/prefix" -DCMAKE_C_FLAGS="$cflags" >/dev/null
cmake --build "$tmp/consumer" >/dev/null
GPUGUARD_BACKEND=host LD_LIBRARY_PATH="$tmp/prefix/lib" "$tmp/consumer/consumer" | grep -q "device 0 is 'gpuguard host device' on host"
GPUGUARD_BACKEND=host "$tmp/consumer/consumer_static" | grep -q "on host"
# pkg-config: compile and link the same program with the flags it gives.
libdir=$(ls -d "$tmp"/prefix/lib*/pkgconfig | head -1)
flags=$(PKG_CONFIG_PATH="$libdir" pkg-config --cflags --libs gpuguard)
cc $cflags "$src/tests/consumer/main.c" $flags -o "$tmp/pc_consumer"
GPUGUARD_BACKEND=host LD_LIBRARY_PATH="$(dirname "$libdir")" "$tmp/pc_consumer" | grep -q "on host"
# The installed command line finds its library through RUNPATH ($ORIGIN/../lib or ../lib64), from any prefix.
readelf -d "$tmp/prefix/bin/gpuguard" | grep -Eq 'R(UN)?PATH.*\$ORIGIN/\.\./lib' ||
  { echo "FAIL: installed gpuguard has no \$ORIGIN/../lib RUNPATH" >&2; exit 1; }
mv "$tmp/prefix" "$tmp/moved"
env -u LD_LIBRARY_PATH "$tmp/moved/bin/gpuguard" --help | grep -q "^usage: gpuguard" ||
  { echo "FAIL: the installed gpuguard --help does not start without LD_LIBRARY_PATH" >&2; exit 1; }
env -u LD_LIBRARY_PATH GPUGUARD_BACKEND=host "$tmp/moved/bin/gpuguard" info --json | grep -q '"host"'
echo "install, find_package and pkg-config consumers, installed command line: ok"
