#!/usr/bin/env bash
# cli_conventions.sh — the command line's conventions: durations with units on --grace and
# --interval (a bare number: seconds on both); -y/-n on reap and -V; --color=auto|always|never;
# a device filter -i N on ps, info, check and watch (one that does not exist: exit 2); on the host backend without a GPU, `ps --json` lists no
# device (the simulated one holds nothing) and exits 3 like `ps`; `plot` runs GPUGUARD_PYTHON.
# Arguments: build dir, source dir.
set -euo pipefail
unset GPUGUARD_PID_NS NO_COLOR
build=$1
g=$build/gpuguard
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() { # rc, command...
  local want=$1; shift
  set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
  [ $rc = "$want" ] || { cat "$tmp/out" "$tmp/err"; fail "'$*' exited $rc, wanted $want"; }
}
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1

# Durations: units on both, bare numbers as before, nonsense refused naming the option.
for v in 200ms 0.2s 0.2; do expect_rc 0 $g watch --interval $v --count 1; done
for v in 10ms 2h 5x ms '' -1s 1e3 nan inf 0x10; do expect_rc 2 $g watch --interval "$v" --count 1; done
grep -q "\-\-interval" "$tmp/err" || fail "a bad --interval does not name the option"
expect_rc 0 $g run --pid-ns=off --grace 300ms -- sh -c 'trap "" TERM; sleep 5 & sleep 0.1; kill -TERM $$ 2>/dev/null; exit 0'
expect_rc 0 $g run --pid-ns=off --grace 1s -- true
expect_rc 0 $g run --pid-ns=off --grace 1.5 -- true
for v in 11m 2ks -5ms 1.5.0s; do expect_rc 2 $g run --grace "$v" -- true; done
grep -q "\-\-grace '1.5.0s'" "$tmp/err" || fail "a bad --grace is not named"
expect_rc 0 $g reap --grace 250ms --dry-run

# Short options.
expect_rc 0 $g -V; grep -qx "gpuguard [0-9.]*" "$tmp/out" || fail "-V prints no version"
expect_rc 0 $g reap -n; expect_rc 0 $g reap -y
expect_rc 2 $g reap -n -y; grep -q "exclusive" "$tmp/err" || fail "reap -n -y not refused"

# --color: always colours even into a file, never and auto (not a terminal) do not.
expect_rc 0 $g watch --count 1 --interval 50ms --color=always; grep -q $'\e\[' "$tmp/out" || fail "--color=always gave no colour"
for c in never auto; do
  expect_rc 0 $g watch --count 1 --interval 50ms --color=$c; ! grep -q $'\e\[' "$tmp/out" || fail "--color=$c coloured a file"
done
expect_rc 2 $g watch --color=sometimes --count 1; grep -q "auto, always or never" "$tmp/err" || fail "bad --color"
expect_rc 2 $g ps --color=bogus

# -i N: device 0 is there, device 5 is not; the filter is a number.
expect_rc 0 $g info -i 0; grep -q "^0 " "$tmp/out" || fail "info -i 0 shows no device 0"
expect_rc 2 $g info -i 5; grep -q "no such device" "$tmp/err" || fail "info -i 5"
expect_rc 2 $g info -i x; grep -q "device number" "$tmp/err" || fail "info -i x"
expect_rc 0 $g info --id 0
expect_rc 0 $g watch -i 0 --count 1 --interval 50ms; grep -q "gpuguard host device" "$tmp/out" || fail "watch -i 0"
expect_rc 2 $g watch -i 3 --count 1 --interval 50ms; grep -q "no such GPU" "$tmp/err" || fail "watch -i 3"
expect_rc 2 $g check -i 3; grep -q "no such GPU" "$tmp/err" || fail "check -i 3"
expect_rc 2 $g ps -i 3; grep -q "no such GPU" "$tmp/err" || fail "ps -i 3"
expect_rc 2 $g watch -i 3 --listen 127.0.0.1:0; grep -q "no such GPU" "$tmp/err" || fail "watch -i 3 --listen"
expect_rc 3 $g ps -i 0

# No GPU: ps and ps --json agree, and the JSON names no (simulated) device.
expect_rc 3 $g ps --json
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["devices"] == [] and d["processes"] == [], d' "$tmp/out"
grep -q "no NVIDIA GPU" "$tmp/err" || fail "ps --json without a GPU says nothing"

# plot runs the interpreter named by GPUGUARD_PYTHON (the wheel's command sets it to its own).
printf '#!/bin/sh\necho "stand-in python: $2" | head -c 40 >"%s/ran"\n' "$tmp" >"$tmp/py"
chmod +x "$tmp/py"
echo '{}' >"$tmp/t.jsonl"
GPUGUARD_PYTHON=$tmp/py expect_rc 0 $g plot "$tmp/t.jsonl"
grep -q "stand-in python" "$tmp/ran" || fail "plot did not run GPUGUARD_PYTHON"
echo "cli_conventions: ok"
