#!/usr/bin/env bash
# cli_check_repeat.sh BUILD SRC — `gpuguard check --interval TIME [--count N]` and `-i N` (a GPU) on
# the host backend with the stand-in NVML: --count N makes N checks, one result line each, an interval
# apart (N objects with --json); the first
# check that finds something ends it with its status (3 at once without NVML; 1 when a stranded worker
# appears between two checks, after the ok ones before it); SIGTERM and SIGINT end an endless one with
# the last status (0); -i names one GPU (one the machine lacks is a usage error); bad values are usage
# errors (exit 2).
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
bad=("--interval 0" "--interval -5" "--interval abc" "--interval 10x" "--interval 0x10" "--interval 40ms"
  "--interval 86401" "--interval 99999999999999999999" "--interval=" "--interval inf"
  "--interval 1 --count 0" "--interval 1 --count -1" "--interval 1 --count x"
  "--interval 1 --count 99999999999999999999" "--count 2" "--interval" "-c 2" "-i x" "-i -1" "-i 1024"
  "-i" "--id=")
for args in "${bad[@]}"; do
  set +e
  # shellcheck disable=SC2086 # each case is a list of words
  "$g" check $args >"$tmp/out" 2>"$tmp/err"
  rc=$?
  set -e
  [ "$rc" = 2 ] || { cat "$tmp/err"; fail "check $args: exit $rc, wanted 2"; }
  [ ! -s "$tmp/out" ] || { cat "$tmp/out"; fail "check $args printed a result"; }
  grep -q "^gpuguard check: .*\(--interval\|--count\|-i\|-c\|--id\)" "$tmp/err" || { cat "$tmp/err"; fail "check $args: no message naming the option"; }
  grep -q "^usage: gpuguard check" "$tmp/err" || fail "check $args: no usage on stderr"
done
grep -q "a duration from 0.05 to 86400 s" < <("$g" check --interval 0 2>&1) || fail "the range is not said"
echo "bad values: ${#bad[@]} cases, each exit 2 with a message naming the option and the usage"

# 2. --interval 1 --count 3: three ok lines, two intervals, exit 0; units as watch's; --json: one
# object a line.
t0=$(now_ms)
"$g" check --interval 1 --count 3 >"$tmp/three" || fail "check --interval 1 --count 3: exit $?"
took=$(($(now_ms) - t0))
[ "$(grep -cx "$ok_line" "$tmp/three")" = 3 ] && [ "$(wc -l <"$tmp/three")" = 3 ] ||
  { cat "$tmp/three"; fail "check --interval 1 --count 3: not three ok lines"; }
[ "$took" -ge 1900 ] && [ "$took" -lt 8000 ] || fail "check --interval 1 --count 3 took $took ms (two 1 s intervals)"
t0=$(now_ms)
"$g" check --interval 300ms --count 3 >"$tmp/ms" || fail "check --interval 300ms --count 3: exit $?"
took_ms=$(($(now_ms) - t0))
[ "$(grep -cx "$ok_line" "$tmp/ms")" = 3 ] || { cat "$tmp/ms"; fail "--interval 300ms: not three ok lines"; }
[ "$took_ms" -ge 550 ] && [ "$took_ms" -lt 1900 ] || fail "--interval 300ms --count 3 took $took_ms ms"
"$g" check --json --interval=1s --count=2 >"$tmp/json" || fail "check --json --interval 1s --count 2: exit $?"
python3 -c '
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
assert len(rows) == 2 and all(r["ok"] is True and r["problems"] == [] for r in rows), rows
' "$tmp/json" || fail "check --json --interval 1s --count 2: not two ok objects"
echo "count: --count 3 made 3 checks in $took ms (300ms apart: $took_ms ms); --json --count 2 printed 2 objects"

# 3. The first non-zero status ends it: without NVML or a driver, the first check exits 3.
t0=$(now_ms)
set +e
GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 "$g" check --interval 1 --count 5 >"$tmp/nogpu" 2>"$tmp/nogpu.err"
rc=$?
set -e
took=$(($(now_ms) - t0))
[ "$rc" = 3 ] || fail "check --interval 1 --count 5 without a GPU: exit $rc, wanted 3"
[ "$took" -lt 900 ] || fail "check --interval 1 without a GPU took $took ms: it did not stop at the first check"
[ "$(grep -c "no NVIDIA GPU" "$tmp/nogpu.err")" = 1 ] || { cat "$tmp/nogpu.err"; fail "not one no-GPU line"; }
echo "first non-zero: exit 3 at the first check without a GPU ($took ms)"

# 4. SIGTERM, then SIGINT (job control on, so the background check does not ignore SIGINT), end an
# endless check after its ok checks with status 0.
set -m
for sig in TERM INT; do
  "$g" check --interval 1 >"$tmp/endless.$sig" 2>&1 &
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

# 4b. -i N: GPU 0 is checked alone; GPU 1, which the stand-in NVML lacks, is a usage error.
"$g" check -i 0 >"$tmp/dev0" || { cat "$tmp/dev0"; fail "check -i 0: exit $?"; }
[ "$(cat "$tmp/dev0")" = "$ok_line" ] || { cat "$tmp/dev0"; fail "check -i 0: not one ok line"; }
set +e
"$g" check --id 1 >"$tmp/dev1" 2>"$tmp/dev1.err"
rc=$?
set -e
[ "$rc" = 2 ] && grep -q "no such GPU" "$tmp/dev1.err" || { cat "$tmp/dev1.err"; fail "check --id 1: exit $rc, wanted 2 (no such GPU)"; }
echo "device: -i 0 checks GPU 0; --id 1 is refused (no such GPU)"

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
FAKE_NVML_PROCS=${spec%,} "$g" check --interval 1 >"$tmp/stranded" 2>&1 &
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
