#!/usr/bin/env bash
# cli_run.sh — `gpuguard run` leaves nothing behind: CMD's status comes back at once with its
# background children ended; SIGTERM to the runner ends the whole job (also children that ignore
# TERM, and a setsid double-forked grandchild); the receipt is JSON naming every process; `reap`
# ends an orphan of a SIGKILLed runner and touches nothing it cannot prove is one.
# Each part runs twice where PID namespaces are allowed: with --pid-ns=off (the design without one, which
# is also the fallback) and --pid-ns=on (the default, auto, where the system allows it): there the
# receipt names CMD only (its namespace's init ends the rest), and a SIGKILLed runner leaves nothing for
# reap because the kernel ends the namespace. Where namespaces are refused the =on runs are skipped,
# saying so.
# Arguments: build dir, source dir.
set -euo pipefail
# `run`'s default is --pid-ns=auto; the off design runs where a check says --pid-ns=off.
unset GPUGUARD_PID_NS
build=$1
g=$build/gpuguard
tmp=$(mktemp -d)
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
unset GPUGUARD_SESSION
# pids whose whole command line is $1 (a regex: its dots match themselves too), started by this test:
# they carry its registry directory in their environment (other worktrees run this script at once).
pids_of() {
  for p in $(pgrep -x -f "$1"); do
    tr '\0' '\n' </proc/$p/environ 2>/dev/null | grep -qxF "GPUGUARD_REGISTRY_DIR=$tmp/registry" && echo $p
  done
  true
}
ms() { date +%s%3N; }
modes="off on"
if ! $g run --pid-ns=on -- true 2>"$tmp/ns.err"; then
  modes=off
  echo "SKIP part: the --pid-ns=on runs: PID namespaces refused here: $(cat "$tmp/ns.err")"
fi

# 1. CMD's exit status, within a second, and no sleep left behind.
for mode in $modes; do
t0=$(ms)
set +e; $g run --pid-ns=$mode --receipt "$tmp/r1.json" -- sh -c 'sleep 61.25 & sleep 61.25 & exit 3'; rc=$?; set -e
t=$(( $(ms) - t0 ))
[ $rc = 3 ] || fail "--pid-ns=$mode: run exited $rc, wanted 3"
[ $t -lt 1000 ] || fail "--pid-ns=$mode: run took $t ms"
[ -z "$(pids_of 'sleep 61.25')" ] || fail "--pid-ns=$mode: sleeps left behind: $(pids_of 'sleep 61.25')"
python3 - "$tmp/r1.json" $mode <<'PY'
import json, sys
d, mode = json.load(open(sys.argv[1])), sys.argv[2]
assert d["exit"] == {"status": 3, "signal": None} and d["exit_code"] == 3, d
assert d["pid_ns"] is (mode == "on"), d
procs = d["teardown"]["processes"]
if mode == "off":
    # CMD and both background children (a child may be caught between fork and exec, still named "sh").
    assert len(procs) == 3 and sum(p["found"] == "tracked" for p in procs) == 1, procs
else:
    # CMD only (its keeper's host pid): the namespace's init ended the sleeps before the keeper exited.
    assert len(procs) == 1 and procs[0]["found"] == "tracked" and procs[0]["pid"] == d["pid"], procs
    assert procs[0]["command"] == "sh -c sleep 61.25 & sleep 61.25 & exit 3", procs
    assert procs[0]["end"] == "exited" and procs[0]["code"] == 3, procs
assert all(p["end"] in ("exited", "signaled", "ended") for p in procs), procs
assert d["device"]["free_bytes_after"] >= d["device"]["free_bytes_before"], d["device"]
print("run --pid-ns=%s: exit 3, both sleeps ended, the receipt says so" % mode)
PY
echo "run --pid-ns=$mode returned in $t ms"
done

# 2. SIGTERM to the runner ends the job: a TERM-ignoring shell, its children, a setsid double-fork.
for mode in $modes; do
$g run --pid-ns=$mode --grace 300ms --receipt "$tmp/r2.json" -- sh -c 'trap "" TERM; sleep 62.5 & setsid sh -c "sleep 62.5 &" ; wait' &
runner=$!
keep_pids "$runner"
for i in $(seq 1 500); do [ "$(pids_of 'sleep 62.5' | wc -l)" -ge 2 ] && break; sleep 0.02; done
[ "$(pids_of 'sleep 62.5' | wc -l)" -ge 2 ] || fail "--pid-ns=$mode: the job did not start"
t0=$(ms)
kill -TERM $runner
set +e; wait $runner; rc=$?; set -e
t=$(( $(ms) - t0 ))
# The shell ignores TERM, so the teardown's SIGKILL ends it: CMD's status is 128+9.
[ $rc = 137 ] || fail "--pid-ns=$mode: runner exited $rc after SIGTERM, wanted 137 (CMD killed)"
[ -z "$(pids_of 'sleep 62.5')" ] || fail "--pid-ns=$mode: left behind after SIGTERM: $(pids_of 'sleep 62.5')"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["runner_signal"]==15 and d["exit_code"]==137 and d["exit"]["signal"]==9 and d["pid_ns"] is (sys.argv[2]=="on"), d' "$tmp/r2.json" $mode
# A job that catches SIGTERM and exits 0 makes the runner exit 0.
$g run --pid-ns=$mode --grace 2s -- sh -c 'trap "exit 0" TERM; sleep 66 & wait' &
runner=$!
keep_pids "$runner"
for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 66')" ] && break; sleep 0.02; done
kill -TERM $runner
set +e; wait $runner; rc=$?; set -e
[ $rc = 0 ] || fail "--pid-ns=$mode: a job that exits 0 on SIGTERM made the runner exit $rc"
[ -z "$(pids_of 'sleep 66')" ] || fail "--pid-ns=$mode: its background sleep was left behind"
echo "SIGTERM (--pid-ns=$mode): job ended in $t ms (grace 300)"
done

# 3. reap: the runner is SIGKILLed; without a namespace its grandchild survives, holding the dead session.
$g run --pid-ns=off -- sh -c 'sleep 63.75 & wait' &
runner=$!
keep_pids "$runner"
for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 63.75')" ] && break; sleep 0.02; done
orphan=$(pids_of 'sleep 63.75')
[ -n "$orphan" ] || fail "the job did not start"
keep_pids "$orphan"
# Bystanders: a plain process with no session, and a worker of a live session.
sleep 64.5 & plain=$!; keep_pids "$plain"
$g run -- sleep 65.25 & live=$!; keep_pids "$live"
for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 65.25')" ] && break; sleep 0.02; done
kill -9 $runner
wait $runner 2>/dev/null || true
for i in $(seq 1 500); do grep -q "^PPid:[[:space:]]*1$" /proc/$orphan/status 2>/dev/null && break; [ -d /proc/$orphan ] || break; sleep 0.02; done
[ -d /proc/$orphan ] || fail "the worker died with its runner: nothing left to reap"
$g reap --dry-run > "$tmp/dry"
grep -q "^orphan $orphan " "$tmp/dry" || { cat "$tmp/dry"; fail "reap --dry-run does not list $orphan"; }
grep -q "^orphan $plain \|^orphan $(pids_of 'sleep 65.25') " "$tmp/dry" && fail "reap lists a process that is no orphan"
[ -d /proc/$orphan ] || fail "--dry-run ended the orphan"
$g reap --yes --grace 200ms > "$tmp/yes"
for i in $(seq 1 500); do [ -d /proc/$orphan ] || break; sleep 0.02; done
[ ! -d /proc/$orphan ] || { cat "$tmp/yes"; fail "reap --yes left $orphan alive"; }
kill -0 $plain || fail "reap ended a process with no session"
[ -n "$(pids_of 'sleep 65.25')" ] || fail "reap ended a worker of a live session"
$g reap --dry-run | grep -q "no orphans" || fail "orphans remain"
kill -TERM $live; wait $live 2>/dev/null || true
echo "reap: listed and ended the orphan, left the bystanders alone"
# With a namespace the kernel ends the whole job with its runner: nothing is left for reap.
if [ "$modes" = "off on" ]; then
  $g run --pid-ns=on -- sh -c 'setsid sh -c "sleep 63.5 &"; sleep 63.5 & wait' &
  runner=$!
  keep_pids "$runner"
  for i in $(seq 1 500); do [ "$(pids_of 'sleep 63.5' | wc -l)" = 2 ] && break; sleep 0.02; done
  [ "$(pids_of 'sleep 63.5' | wc -l)" = 2 ] || fail "--pid-ns=on: the job did not start"
  keep_pids "$(pids_of 'sleep 63.5')"
  kill -9 $runner
  wait $runner 2>/dev/null || true
  for i in $(seq 1 500); do [ -z "$(pids_of 'sleep 63.5')" ] && break; sleep 0.01; done
  [ -z "$(pids_of 'sleep 63.5')" ] || fail "--pid-ns=on: the job outlived its SIGKILLed runner"
  $g reap --dry-run > "$tmp/dry"
  grep -q "no orphans" "$tmp/dry" || { cat "$tmp/dry"; fail "--pid-ns=on: reap found something after the kernel ended the job"; }
  echo "reap: after a SIGKILLed --pid-ns=on runner nothing is left (the kernel ended the namespace)"
fi
# 4. --grace: the CLI and the library agree on one maximum (GG_PROC_GRACE_MAX_MS, 600000 ms).
set +e; $g run --grace 700000ms -- true 2>"$tmp/grace"; rc=$?; set -e
[ $rc = 2 ] || fail "run --grace 700000ms exited $rc, wanted 2 (usage)"
grep -q "0 to 600 s" "$tmp/grace" || fail "run --grace 700000ms did not say the range: $(cat "$tmp/grace")"
set +e; $g reap --grace 700000ms --dry-run >/dev/null 2>&1; rc=$?; set -e
[ $rc = 2 ] || fail "reap --grace 700000ms exited $rc, wanted 2"
$g run --grace 600 --receipt "$tmp/r4.json" -- true || fail "run --grace 600 (the maximum) failed"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["teardown"]["grace_ms"]==600000, d' "$tmp/r4.json"
echo "grace: 700000ms refused with exit 2, 600 (seconds) accepted and used"

# 5. Every signal that would end the runner by default ends the job too (forwarded, then teardown).
for mode in $modes; do
for sig in USR1 USR2 ALRM PIPE XCPU VTALRM PROF RTMIN; do
  $g run --pid-ns=$mode --grace 300ms -- sh -c 'sleep 67.5 & wait' &
  runner=$!
  keep_pids "$runner"
  for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 67.5')" ] && break; sleep 0.02; done
  [ -n "$(pids_of 'sleep 67.5')" ] || fail "the job did not start ($sig, --pid-ns=$mode)"
  kill -$sig $runner
  set +e; wait $runner; rc=$?; set -e
  [ $rc -gt 128 ] && [ $rc -lt 200 ] || fail "runner exited $rc after SIG$sig (--pid-ns=$mode)"
  for i in $(seq 1 100); do [ -z "$(pids_of 'sleep 67.5')" ] && break; sleep 0.02; done
  [ -z "$(pids_of 'sleep 67.5')" ] || fail "SIG$sig to the runner left the job's sleep running (--pid-ns=$mode)"
done
echo "signals (--pid-ns=$mode): USR1 USR2 ALRM PIPE XCPU VTALRM PROF RTMIN to the runner each ended the job"
# The job itself gets each one (through the namespace's keeper and init with =on): it traps it and exits
# 0, so the runner exits 0 and the receipt names the signal. A signal held or dropped on the way would
# leave the job to the teardown after --grace (exit 137); one that ended the keeper, 128+N.
for sig in USR1 ALRM PIPE XCPU VTALRM XFSZ IO PWR STKFLT RTMAX; do
  $g run --pid-ns=$mode --grace 3s --receipt "$tmp/r5.json" -- sh -c "trap 'exit 0' $(kill -l $sig); sleep 67.75 & wait" &
  runner=$!
  keep_pids "$runner"
  for i in $(seq 1 500); do [ -n "$(pids_of 'sleep 67.75')" ] && break; sleep 0.02; done
  [ -n "$(pids_of 'sleep 67.75')" ] || fail "the job did not start ($sig, --pid-ns=$mode)"
  kill -$sig $runner
  set +e; wait $runner; rc=$?; set -e
  [ $rc = 0 ] || fail "SIG$sig did not reach the job (--pid-ns=$mode): the runner exited $rc"
  python3 -c 'import json,signal,sys; d=json.load(open(sys.argv[1])); assert d["runner_signal"]==int(getattr(signal, "SIG"+sys.argv[2])) and d["exit_code"]==0 and d["pid_ns"] is (sys.argv[3]=="on"), d' "$tmp/r5.json" $sig $mode
  for i in $(seq 1 100); do [ -z "$(pids_of 'sleep 67.75')" ] && break; sleep 0.02; done
  [ -z "$(pids_of 'sleep 67.75')" ] || fail "SIG$sig: the job's sleep was left running (--pid-ns=$mode)"
done
echo "signals (--pid-ns=$mode): USR1 ALRM PIPE XCPU VTALRM XFSZ IO PWR STKFLT RTMAX reached the job"
done

# 6. UTF-8 in the receipt: command lines pass through as text, bytes that are not text become U+FFFD.
# (--pid-ns=off: the receipt lists the renamed sleep only where the runner's teardown ends it.)
for mode in $modes; do
$g run --pid-ns=$mode --grace 200ms --receipt "$tmp/r6.json" -- bash -c '(exec -a naïve-café sleep 68.5) & sleep 0.3' naïve-café $'\xff' 2>/dev/null
python3 -m json.tool "$tmp/r6.json" >/dev/null || fail "the receipt is not valid JSON"
python3 - "$tmp/r6.json" $mode <<'PY'
import json, sys
d = json.loads(open(sys.argv[1], "rb").read().decode("utf-8"))  # strict UTF-8
assert d["command"][-2:] == ["naïve-café", "\ufffd"], d["command"]
cmds = [p["command"] for p in d["teardown"]["processes"]]
assert sys.argv[2] == "on" or "naïve-café 68.5" in cmds, cmds
print("receipt (--pid-ns=%s): naïve-café round-trips, an invalid byte is U+FFFD" % sys.argv[2])
PY
[ -z "$(pids_of 'naïve-café 68.5')" ] || fail "the renamed sleep was left behind (--pid-ns=$mode)"
done
# 7. A thread that takes SIGCHLD and drops it (a CUDA driver's thread started before the runner blocks
# its signals): the runner still notices that CMD ended, and passes its status on, in both designs.
thief="$build/tests/sigchld_thief.so"
[ -e "$thief" ] || thief="$build/tests/libsigchld_thief.so"
for mode in $modes; do
  for i in 1 2 3 4 5; do
    set +e
    ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0" LD_PRELOAD="$thief" \
      timeout 20 $g run --pid-ns=$mode -- sh -c 'exit 4' 2>/dev/null
    rc=$?
    set -e
    [ $rc = 4 ] || fail "a dropped SIGCHLD (--pid-ns=$mode, try $i): exit $rc, wanted 4 (124: the runner waited forever)"
  done
done
echo "a thread that drops SIGCHLD: the runner still saw CMD end (--pid-ns: $modes)"
echo "cli_run: ok"
