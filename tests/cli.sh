#!/usr/bin/env bash
# cli.sh — the gpuguard command line on the host backend, with a stand-in NVML: usage and exit codes,
# JSON that parses, Prometheus text that a real parser (prometheus_client) accepts, atomic --prom-file.
# Arguments: build dir, source dir.
set -euo pipefail
build=$1
g=$build/gpuguard
tmp=$(mktemp -d)
sleeper=
trap 'rm -rf "$tmp"; [ -n "$sleeper" ] && kill $sleeper 2>/dev/null; true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() { # rc, command...
  local want=$1; shift
  set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
  [ $rc = "$want" ] || { cat "$tmp/out" "$tmp/err"; fail "'$*' exited $rc, wanted $want"; }
}
export GPUGUARD_BACKEND=host

# Usage and exit codes.
expect_rc 0 $g --help; grep -q "commands:" "$tmp/out" || fail "--help lists no commands"
expect_rc 2 $g; expect_rc 2 $g frobnicate; grep -q "unknown command 'frobnicate'" "$tmp/err" || fail "unknown command not named"
for c in ps info watch; do
  expect_rc 0 $g $c --help; grep -q "usage: gpuguard $c" "$tmp/out" || fail "$c --help"
  expect_rc 2 $g $c --no-such-flag; grep -q "unknown option '--no-such-flag'" "$tmp/err" || fail "$c bad flag not named"
  grep -q "usage: gpuguard $c" "$tmp/err" || fail "$c bad flag prints no usage"
  expect_rc 2 $g $c stray-argument
done
expect_rc 2 $g info --json --prom
for bad in 0 -1 abc 1e9 nan ''; do expect_rc 2 $g watch --interval "$bad" --count 1; done
expect_rc 2 $g watch --count 0
expect_rc 2 $g watch --prom-file ''

# JSON and Prometheus text, parsed by real parsers.
expect_rc 0 $g info --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["devices"][0]["backend"]=="host", d' "$tmp/out"
expect_rc 0 $g info --prom
cp "$tmp/out" "$tmp/info.prom"
cat > "$tmp/parse.py" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
for name in sys.argv[2:]:
    assert name in fams, (name, sorted(fams))
print("parsed", len(fams), "metric families")
PY
python3 "$tmp/parse.py" "$tmp/info.prom" gpuguard_device_memory_used_bytes gpuguard_device_memory_total_bytes gpuguard_device_info

# Processes from the stand-in NVML: this shell (1 MB) and a sleeper whose memory NVML does not know.
sleep 60 & sleeper=$!
export GPUGUARD_NVML_LIBRARY=$build/tests/libfake_nvml.so FAKE_NVML_PROCS="$$:1048576,$sleeper:na"
expect_rc 0 $g ps
grep -qE "^0 +$$ .* 1.0 MiB" "$tmp/out" || { cat "$tmp/out"; fail "ps does not show this shell with 1.0 MiB"; }
grep -qE "^0 +$sleeper .* \? .*sleep 60" "$tmp/out" || { cat "$tmp/out"; fail "ps does not show the sleeper with unknown memory"; }
expect_rc 0 $g ps --json
python3 - "$tmp/out" $$ $sleeper <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {p["pid"]: p for p in d["processes"]}
me, sl = int(sys.argv[2]), int(sys.argv[3])
assert rows[me]["used_bytes"] == 1048576 and rows[sl]["used_bytes"] is None, rows
assert rows[sl]["ppid"] == me and rows[sl]["command"] == "sleep 60" and rows[sl]["orphan"] is False, rows[sl]
PY
expect_rc 0 $g watch --prom-file "$tmp/gpu.prom" --count 2 --interval 0.05
[ ! -e "$tmp/gpu.prom.tmp.$$" ] && ! ls "$tmp" | grep -q '\.tmp\.' || fail "temporary file left behind"
python3 "$tmp/parse.py" "$tmp/gpu.prom" gpuguard_process_memory_used_bytes gpuguard_processes
grep -q "gpuguard_process_memory_used_bytes{device=\"0\",pid=\"$$\"" "$tmp/gpu.prom" || fail "process series missing"
expect_rc 1 $g watch --prom-file /nonexistent-dir/x.prom --count 1
grep -q "cannot write" "$tmp/err" || fail "unwritable --prom-file not explained"

# No GPU at all: ps says so and fails.
if ! [ -e /dev/nvidiactl ]; then
  export GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1
  expect_rc 1 $g ps; grep -q "no NVIDIA GPU" "$tmp/err" || fail "ps without a GPU says nothing clear"
fi
echo "cli: ok"
