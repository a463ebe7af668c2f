#!/usr/bin/env bash
# cli_check_interval.sh BUILD SRC — `gpuguard check -i N [-c N]` on the host backend with the stand-in
# NVML: -c N makes N checks, one result line each, an interval apart (N objects with --json); the first
# check that finds something ends it with its status (3 at once without NVML; 1 when a stranded worker
# appears between two checks, after the ok ones before it); SIGTERM and SIGINT end an endless one with
# the last status (0); values that are not a whole number in range are usage errors (exit 2).
set -euo pipefail
build=$1
src=$2
g="$(cd "$build" && pwd)/gpuguard"
tmp=$(mktemp -d)
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset GPUGUARD_SESSION FAKE_NVML_PROCS
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR="$tmp/reg" GPUGUARD_NVML_LIBRARY="$build/tests/libfake_nvml.so"
ok_line="ok: no stranded or orphaned processes, nothing held beyond the allowance"
now_ms() { date +%s%3N; }
# Waits up to 10 s for file $1 to have $2 lines.
wait_lines() { for _ in $(seq 1 500); do [ "$(wc -l <"$1")" -ge "$2" ] && return 0; sleep 0.02; done; return 1; }

# 1. Bad values: exit 2, the option named and the usage on stderr, nothing on stdout, no check made.
bad=("-i 0" "-i -5" "-i abc" "-i 1.5" "-i 30s" "-i +5" "-i 86401" "-i 99999999999999999999"
  "--interval=" "--interval=0x10" "-i 1 -c 0" "-i 1 -c -1" "-i 1 -c x" "-i 1 -c 99999999999999999999"
  "-c 2" "-i")
for args in "${bad[@]}"; do
  set +e
  # shellcheck disable=SC2086 # each case is a list of words
  "$g" check $args >"$tmp/out" 2>"$tmp/err"
  rc=$?
  set -e
  [ "$rc" = 2 ] || { cat "$tmp/err"; fail "check $args: exit $rc, wanted 2"; }
  [ ! -s "$tmp/out" ] || { cat "$tmp/out"; fail "check $args printed a result"; }
  grep -q "^gpuguard check: .*\(--interval\|--count\|-i\)" "$tmp/err" || { cat "$tmp/err"; fail "check $args: no message naming the option"; }
  grep -q "^usage: gpuguard check" "$tmp/err" || fail "check $args: no usage on stderr"
done
grep -q "a whole number of seconds from 1 to 86400" < <("$g" check -i 0 2>&1) || fail "the range is not said"
echo "bad values: ${#bad[@]} cases, each exit 2 with a message naming the option and the usage"

# 2. -i 1 -c 3: three ok lines, two intervals, exit 0; --json: one object a line.
t0=$(now_ms)
"$g" check -i 1 -c 3 >"$tmp/three" || fail "check -i 1 -c 3: exit $?"
took=$(($(now_ms) - t0))
[ "$(grep -cx "$ok_line" "$tmp/three")" = 3 ] && [ "$(wc -l <"$tmp/three")" = 3 ] ||
  { cat "$tmp/three"; fail "check -i 1 -c 3: not three ok lines"; }
[ "$took" -ge 1900 ] && [ "$took" -lt 8000 ] || fail "check -i 1 -c 3 took $took ms (two 1 s intervals)"
"$g" check --json --interval=1 --count=2 >"$tmp/json" || fail "check --json -i 1 -c 2: exit $?"
python3 -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 2 and all(r["ok"] is True and r["problems"] == [] for r in rows), rows
' "$tmp/json" || fail "check --json -i 1 -c 2: not two ok objects"
echo "count: -c 3 made 3 checks in $took ms; --json -c 2 printed 2 objects"

# 3. The first non-zero status ends it: without NVML or a driver, the first check exits 3.
t0=$(now_ms)
set +e
GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 "$g" check -i 1 -c 5 >"$tmp/nogpu" 2>"$tmp/nogpu.err"
rc=$?
set -e
took=$(($(now_ms) - t0))
[ "$rc" = 3 ] || fail "check -i 1 -c 5 without a GPU: exit $rc, wanted 3"
[ "$took" -lt 900 ] || fail "check -i 1 without a GPU took $took ms: it did not stop at the first check"
[ "$(grep -c "no NVIDIA GPU" "$tmp/nogpu.err")" = 1 ] || { cat "$tmp/nogpu.err"; fail "not one no-GPU line"; }
echo "first non-zero: exit 3 at the first check without a GPU ($took ms)"

# 4. SIGTERM, then SIGINT (job control on, so the background check does not ignore SIGINT), end an
# endless check after its ok checks with status 0.
set -m
for sig in TERM INT; do
  "$g" check -i 1 >"$tmp/endless.$sig" 2>&1 &
  pid=$!
  keep_pids "$pid"
  wait_lines "$tmp/endless.$sig" 2 || { cat "$tmp/endless.$sig"; fail "no second check within 10 s"; }
  t0=$(now_ms)
  kill -"$sig" "$pid"
  set +e
  wait "$pid"
  rc=$?
  set -e
  took=$(($(now_ms) - t0))
  [ "$rc" = 0 ] || { cat "$tmp/endless.$sig"; fail "SIG$sig: exit $rc, wanted 0 (the last check's status)"; }
  [ "$took" -lt 1500 ] || fail "SIG$sig took $took ms to end the check"
  ! grep -vqx "$ok_line" "$tmp/endless.$sig" || { cat "$tmp/endless.$sig"; fail "SIG$sig: unexpected output"; }
done
set +m
echo "signals: SIGTERM and SIGINT end an endless check with the last status, 0"

# 5. A stranded worker appears between checks: the ok checks before it, then its line, exit 1. The
# stand-in NVML names pids of our /proc, joined only in the initial PID namespace.
if [ "$(readlink /proc/self/ns/pid)" != "pid:[4026531836]" ] || ! command -v python3 >/dev/null; then
  echo "SKIP part: a worker stranded between checks (not in the initial PID namespace, or no python3)"
  exit 0
fi
setsid sh -c "python3 '$src/tests/stranded_trainer.py' '$tmp/kids' 2 & echo \$! > '$tmp/trainer'"
for _ in $(seq 1 500); do [ -s "$tmp/kids" ] && break; sleep 0.02; done
[ -s "$tmp/kids" ] || fail "the trainer never started its children"
kids=$(cat "$tmp/kids")
trainer=$(cat "$tmp/trainer")
keep_pids "$kids" "$trainer"
spec=""
for k in $kids; do spec="$spec$k:1073741824,"; done
FAKE_NVML_PROCS=${spec%,} "$g" check -i 1 >"$tmp/stranded" 2>&1 &
pid=$!
keep_pids "$pid"
wait_lines "$tmp/stranded" 1 || fail "no first check within 10 s"
kill -9 "$trainer"
set +e
wait "$pid"
rc=$?
set -e
[ "$rc" = 1 ] || { cat "$tmp/stranded"; fail "a worker stranded between checks: exit $rc, wanted 1"; }
[ "$(head -1 "$tmp/stranded")" = "$ok_line" ] || { cat "$tmp/stranded"; fail "the first check was not ok"; }
[ "$(grep -c "stranded process" "$tmp/stranded")" = 2 ] || { cat "$tmp/stranded"; fail "not one line per stranded worker"; }
echo "stranded between checks: $(grep -cx "$ok_line" "$tmp/stranded") ok check(s), then 2 stranded lines and exit 1"
