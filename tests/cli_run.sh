#!/usr/bin/env bash
# cli_run.sh — `gpuguard run` leaves nothing behind: CMD's status comes back at once with its
# background children ended; SIGTERM to the runner ends the whole job (also children that ignore
# TERM, and a setsid double-forked grandchild); the receipt is JSON naming every process; `reap`
# ends an orphan of a SIGKILLed runner and touches nothing it cannot prove is one.
# Arguments: build dir, source dir.
set -euo pipefail
build=$1
g=$build/gpuguard
tmp=$(mktemp -d)
keep=()
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
unset GPUGUARD_SESSION
# pids whose whole command line is exactly $1 (no pgrep needed)
pids_of() {
  for f in /proc/[0-9]*/cmdline; do
    [ "$({ tr '\0' ' ' <"$f"; } 2>/dev/null)" = "$1 " ] && { p=${f#/proc/}; echo "${p%/cmdline}"; }
  done
  true
}
ms() { date +%s%3N; }

# 1. CMD's exit status, within a second, and no sleep left behind.
t0=$(ms)
set +e; $g run --receipt "$tmp/r1.json" -- sh -c 'sleep 61.25 & sleep 61.25 & exit 3'; rc=$?; set -e
t=$(( $(ms) - t0 ))
[ $rc = 3 ] || fail "run exited $rc, wanted 3"
[ $t -lt 1000 ] || fail "run took $t ms"
[ -z "$(pids_of 'sleep 61.25')" ] || fail "sleeps left behind: $(pids_of 'sleep 61.25')"
python3 - "$tmp/r1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["exit"] == {"status": 3, "signal": None} and d["exit_code"] == 3, d
procs = d["teardown"]["processes"]
# CMD and both background children (a child may be caught between fork and exec, still named "sh").
assert len(procs) == 3 and sum(p["found"] == "tracked" for p in procs) == 1, procs
assert all(p["end"] in ("exited", "signaled", "ended") for p in procs), procs
assert all(p["end"] != "alive" for p in d["teardown"]["processes"]), d
assert d["device"]["free_bytes_after"] >= d["device"]["free_bytes_before"], d["device"]
print("run: exit 3, both sleeps ended and in the receipt")
PY
echo "run returned in $t ms"

# 2. SIGTERM to the runner ends the job: a TERM-ignoring shell, its children, a setsid double-fork.
$g run --grace 300 --receipt "$tmp/r2.json" -- sh -c 'trap "" TERM; sleep 62.5 & setsid sh -c "sleep 62.5 &" ; wait' &
runner=$!
keep+=($runner)
for i in $(seq 1 500); do [ "$(pids_of 'sleep 62.5' | wc -l)" -ge 2 ] && break; sleep 0.02; done
[ "$(pids_of 'sleep 62.5' | wc -l)" -ge 2 ] || fail "the job did not start"
t0=$(ms)
kill -TERM $runner
set +e; wait $runner; rc=$?; set -e
t=$(( $(ms) - t0 ))
# The shell ignores TERM, so the teardown's SIGKILL ends it: CMD's status is 128+9.
[ $rc = 137 ] || fail "runner exited $rc after SIGTERM, wanted 137 (CMD killed)"
[ -z "$(pids_of 'sleep 62.5')" ] || fail "left behind after SIGTERM: $(pids_of 'sleep 62.5')"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["runner_signal"]==15 and d["exit_code"]==137 and d["exit"]["signal"]==9, d' "$tmp/r2.json"
# A job that catches SIGTERM and exits 0 makes the runner exit 0.
$g run --grace 2000 -- sh -c 'trap "exit 0" TERM; sleep 66 & wait' &
runner=$!
keep+=($runner)
for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 66')" ] && break; sleep 0.02; done
kill -TERM $runner
set +e; wait $runner; rc=$?; set -e
[ $rc = 0 ] || fail "a job that exits 0 on SIGTERM made the runner exit $rc"
[ -z "$(pids_of 'sleep 66')" ] || fail "its background sleep was left behind"
echo "SIGTERM: job ended in $t ms (grace 300)"

# 3. reap: the runner is SIGKILLed; its grandchild survives, holding the dead session.
$g run -- sh -c 'sleep 63.75 & wait' &
runner=$!
keep+=($runner)
for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 63.75')" ] && break; sleep 0.02; done
orphan=$(pids_of 'sleep 63.75')
[ -n "$orphan" ] || fail "the job did not start"
keep+=($orphan)
# Bystanders: a plain process with no session, and a worker of a live session.
sleep 64.5 & plain=$!; keep+=($plain)
$g run -- sleep 65.25 & live=$!; keep+=($live)
for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 65.25')" ] && break; sleep 0.02; done
kill -9 $runner
wait $runner 2>/dev/null || true
for i in $(seq 1 500); do grep -q "^PPid:[[:space:]]*1$" /proc/$orphan/status 2>/dev/null && break; [ -d /proc/$orphan ] || break; sleep 0.02; done
[ -d /proc/$orphan ] || fail "the worker died with its runner: nothing left to reap"
$g reap --dry-run > "$tmp/dry"
grep -q "^orphan $orphan " "$tmp/dry" || { cat "$tmp/dry"; fail "reap --dry-run does not list $orphan"; }
grep -q "^orphan $plain \|^orphan $(pids_of 'sleep 65.25') " "$tmp/dry" && fail "reap lists a process that is no orphan"
[ -d /proc/$orphan ] || fail "--dry-run ended the orphan"
$g reap --yes --grace 200 > "$tmp/yes"
for i in $(seq 1 500); do [ -d /proc/$orphan ] || break; sleep 0.02; done
[ ! -d /proc/$orphan ] || { cat "$tmp/yes"; fail "reap --yes left $orphan alive"; }
kill -0 $plain || fail "reap ended a process with no session"
[ -n "$(pids_of 'sleep 65.25')" ] || fail "reap ended a worker of a live session"
$g reap --dry-run | grep -q "no orphans" || fail "orphans remain"
kill -TERM $live; wait $live 2>/dev/null || true
echo "reap: listed and ended the orphan, left the bystanders alone"
# 4. --grace: the CLI and the library agree on one maximum (GG_PROC_GRACE_MAX_MS, 600000 ms).
set +e; $g run --grace 700000 -- true 2>"$tmp/grace"; rc=$?; set -e
[ $rc = 2 ] || fail "run --grace 700000 exited $rc, wanted 2 (usage)"
grep -q "0 to 600000" "$tmp/grace" || fail "run --grace 700000 did not say the range: $(cat "$tmp/grace")"
set +e; $g reap --grace 700000 --dry-run >/dev/null 2>&1; rc=$?; set -e
[ $rc = 2 ] || fail "reap --grace 700000 exited $rc, wanted 2"
$g run --grace 600000 --receipt "$tmp/r4.json" -- true || fail "run --grace 600000 (the maximum) failed"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["teardown"]["grace_ms"]==600000, d' "$tmp/r4.json"
echo "grace: 700000 refused with exit 2, 600000 accepted and used"

# 5. Every signal that would end the runner by default ends the job too (forwarded, then teardown).
for sig in USR1 USR2 ALRM PIPE XCPU VTALRM PROF RTMIN; do
  $g run --grace 300 -- sh -c 'sleep 67.5 & wait' &
  runner=$!
  keep+=($runner)
  for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 67.5')" ] && break; sleep 0.02; done
  [ -n "$(pids_of 'sleep 67.5')" ] || fail "the job did not start ($sig)"
  kill -$sig $runner
  set +e; wait $runner; rc=$?; set -e
  [ $rc -gt 128 ] && [ $rc -lt 200 ] || fail "runner exited $rc after SIG$sig"
  for i in $(seq 1 100); do [ -z "$(pids_of 'sleep 67.5')" ] && break; sleep 0.02; done
  [ -z "$(pids_of 'sleep 67.5')" ] || fail "SIG$sig to the runner left the job's sleep running"
done
echo "signals: USR1 USR2 ALRM PIPE XCPU VTALRM PROF RTMIN to the runner each ended the job"

# 6. UTF-8 in the receipt: command lines pass through as text, bytes that are not text become U+FFFD.
$g run --grace 200 --receipt "$tmp/r6.json" -- bash -c '(exec -a naïve-café sleep 68.5) & sleep 0.3' naïve-café $'\xff' 2>/dev/null
python3 -m json.tool "$tmp/r6.json" >/dev/null || fail "the receipt is not valid JSON"
python3 - "$tmp/r6.json" <<'PY'
import json, sys
d = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))  # strict UTF-8
assert d["command"][-2:] == ["naïve-café", "\ufffd"], d["command"]
cmds = [p["command"] for p in d["teardown"]["processes"]]
assert "naïve-café 68.5" in cmds, cmds
print("receipt: naïve-café round-trips, an invalid byte is U+FFFD")
PY
[ -z "$(pids_of 'naïve-café 68.5')" ] || fail "the renamed sleep was left behind"
echo "cli_run: ok"
