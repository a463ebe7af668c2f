#!/usr/bin/env bash
# cli_prom_tmp.sh BUILD SRC — `watch --prom-file PATH` leaves no temporary files behind: one a killed
# exporter left (PATH.tmp.XXXXXX, ours, older than a minute) is removed by the first write, while a fresh
# one (another exporter's write in progress) and anything not named so are left alone.
set -euo pipefail
build=$1
g="$(cd "$build" && pwd)/gpuguard"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1
out=$tmp/node.prom
echo "half a file" >"$out.tmp.Ab3xYz"          # a killed exporter's, two minutes ago
touch -d '-2 minutes' "$out.tmp.Ab3xYz"
echo "in progress" >"$out.tmp.Qw9rTy"          # a write under way now
echo "keep" >"$out.tmp.notours"                # not a mkostemp name
touch -d '-2 minutes' "$out.tmp.notours"
"$g" watch --prom-file "$out" --count 1 --interval 50ms >/dev/null 2>"$tmp/err" || { cat "$tmp/err"; fail "watch failed"; }
grep -q "^# " "$out" || fail "no textfile written"
[ ! -e "$out.tmp.Ab3xYz" ] || fail "a killed exporter's temporary file was left: $(ls "$tmp" | tr "\n" " ")"
[ -e "$out.tmp.Qw9rTy" ] || fail "a fresh temporary file (a write under way) was removed"
[ -e "$out.tmp.notours" ] || fail "a file not named as a temporary was removed"
# Not swept at every write: one planted once the first write is done outlives the writes after it.
rm -f "$out"
"$g" watch --prom-file "$out" --count 30 --interval 50ms >/dev/null 2>"$tmp/err" &
pid=$!
for _ in $(seq 200); do [ -e "$out" ] && break; sleep 0.05; done
[ -e "$out" ] || { kill "$pid"; fail "no first write"; }
echo "half a file" >"$out.tmp.Zz9kLm"
touch -d '-2 minutes' "$out.tmp.Zz9kLm"
wait "$pid" || { cat "$tmp/err"; fail "watch failed"; }
[ -e "$out.tmp.Zz9kLm" ] || fail "the directory was swept again at a later write"
echo "prom-file: a stale PATH.tmp.XXXXXX removed by the first write; a fresh one and other names kept; no sweep at each later write"
