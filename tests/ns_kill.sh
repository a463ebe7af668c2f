#!/usr/bin/env bash
# ns_kill.sh BUILD SRC — `gpuguard run --pid-ns=on`: when the runner is SIGKILLed, every process of the
# job is gone (the kernel ends the namespace), double-forked setsid daemons included; prints the time
# from SIGKILL to the last one gone. Without --pid-ns the same job outlives the runner (that is what
# `reap` is for). Skips (77) where PID namespaces are refused; `--pid-ns=auto` (the default) then says
# so once. Where it can, it also makes a place that refuses them (a user namespace whose
# user.max_user_namespaces is 0, every capability dropped) to check the fallback: one clear line, the job
# runs, its status passes; =on fails with exit 126; =off and GPUGUARD_PID_NS=off say nothing. Prints,
# for 1 and 8 sleeping children, the time from the runner's SIGKILL until no process of the job exists.
set -euo pipefail
# `run`'s default is --pid-ns=auto; the off design runs where a check says --pid-ns=off.
unset GPUGUARD_PID_NS
build=$1
g="$build/gpuguard"
tmp=$(mktemp -d)
unset GPUGUARD_SESSION
export GPUGUARD_REGISTRY_DIR="$tmp/reg"
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }
tag=$$
job="sleep 300.$tag & setsid sh -c 'sleep 301.$tag & exec sleep 302.$tag' & sleep 303.$tag & wait"
job_pids() { pgrep -f "^sleep 30[0-3]\.$tag$" || true; }
all_pids() { pgrep -f "30[0-3]\.$tag" || true; }

# The fallback where namespaces are refused: $1 is where (a command prefix, maybe empty).
check_fallback() {
  local where=$1 rc
  set +e; $where "$g" run --receipt "$tmp/fb.json" -- sh -c 'exit 5' 2>"$tmp/auto"; rc=$?; set -e
  [ $rc = 5 ] || { cat "$tmp/auto"; fail "the default (auto) where namespaces are refused: exit $rc, wanted 5"; }
  [ "$(grep -c "PID namespace" "$tmp/auto")" = 1 ] || { cat "$tmp/auto"; fail "the fallback was not said exactly once"; }
  grep -q "^gpuguard run: the job runs without a PID namespace, so if this runner is SIGKILLed .*gpuguard reap.* Why: .*unshare(CLONE_NEWPID) refused" "$tmp/auto" ||
    { cat "$tmp/auto"; fail "the fallback line does not say what it costs and why"; }
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["pid_ns"] is False and d["exit_code"]==5, d' "$tmp/fb.json"
  set +e; $where "$g" run --pid-ns=on -- true 2>"$tmp/on"; rc=$?; set -e
  [ $rc = 126 ] && grep -q "PID namespace" "$tmp/on" || { cat "$tmp/on"; fail "--pid-ns=on where refused: exit $rc"; }
  $where "$g" run --pid-ns=off -- true 2>"$tmp/off" && ! grep -q "namespace" "$tmp/off" || fail "--pid-ns=off spoke of namespaces"
  $where env GPUGUARD_PID_NS=off "$g" run -- true 2>"$tmp/off" && ! grep -q "namespace" "$tmp/off" ||
    fail "GPUGUARD_PID_NS=off spoke of namespaces"
  echo "fallback: one line: $(sed 's/ Why:.*//' "$tmp/auto" | head -1)"
}
if ! "$g" run --pid-ns=on -- true 2>"$tmp/err"; then
  check_fallback ""
  echo "SKIP: PID namespaces refused here: $(cat "$tmp/err")"; exit 77
fi
# A place that refuses them, made here: a user namespace that may make no more (its limit set to 0) and
# a process in it without capabilities (so no CLONE_NEWPID either).
refusing() {
  unshare --user --map-root-user sh -c \
    'echo 0 >/proc/sys/user/max_user_namespaces && exec setpriv --bounding-set=-all --inh-caps=-all "$@"' sh "$@"
}
if command -v setpriv >/dev/null && refusing true 2>/dev/null && ! refusing unshare --pid --fork true 2>/dev/null; then
  check_fallback refusing
else
  echo "SKIP part: the fallback: no way to make a place that refuses PID namespaces here (needs unshare --user and setpriv)"
fi

# Inside: pid 2, and ps sees the namespace only.
out=$("$g" run --pid-ns=on -- sh -c 'echo $$; ps -e -o pid= | wc -l' 2>/dev/null)
[ "$(echo "$out" | head -1)" = 2 ] || fail "the job is not pid 2 of its namespace: $out"
[ "$(echo "$out" | tail -1)" -le 5 ] || fail "ps inside sees more than the namespace: $out"
# Exit status and signals pass through the keeper and the init.
set +e; "$g" run --pid-ns=on -- sh -c 'exit 7' 2>/dev/null; rc=$?; set -e
[ $rc = 7 ] || fail "exit 7 became $rc"
set +e; "$g" run --pid-ns=on -- sh -c 'kill -TERM $$' 2>/dev/null; rc=$?; set -e
[ $rc = 143 ] || fail "death by SIGTERM became $rc"

for mode in on off; do
  "$g" run --pid-ns=$mode -- sh -c "$job" 2>/dev/null & runner=$!
  keep_pids "$runner"
  for _ in $(seq 1 500); do [ "$(job_pids | wc -l)" = 4 ] && break; sleep 0.01; done
  pids=$(job_pids)
  [ "$(echo "$pids" | wc -l)" = 4 ] || fail "--pid-ns=$mode: the job did not start: $pids"
  keep_pids "$pids"
  # From outside every job process has its ordinary pid, and /proc shows it ours.
  for p in $pids; do [ -d /proc/$p ] || fail "pid $p not visible from outside"; done
  t0=$(now_ms)
  kill -9 $runner
  wait $runner 2>/dev/null || true
  gone=no
  for _ in $(seq 1 300); do [ -z "$(all_pids)" ] && { gone=yes; break; }; sleep 0.005; done
  t1=$(now_ms)
  if [ $mode = on ]; then
    [ $gone = yes ] || fail "--pid-ns=on: left after the runner's SIGKILL: $(job_pids)"
    echo "--pid-ns=on: runner SIGKILLed -> all 4 job processes gone in $((t1 - t0)) ms"
  else
    [ $gone = no ] || fail "--pid-ns=off: the double-forked daemon died too (the test proves nothing)"
    echo "--pid-ns=off: $(job_pids | wc -l) job processes outlive the runner (reap's job)"
    for p in $(job_pids); do kill -9 $p; done
  fi
done
# When the job ends, what is left of the namespace gets --grace after SIGTERM (it had one second once):
# a leftover that needs 1.5 s to finish after TERM finishes with --grace 4s, and is cut short by 500ms.
left='trap "sleep 1.5; echo finished > $0; exit 0" TERM; while :; do sleep 0.05; done'
for grace in 4000ms 500ms; do
  rm -f "$tmp/left.$grace"
  "$g" run --pid-ns=on --grace $grace -- sh -c "sh -c '$left' $tmp/left.$grace & sleep 0.3" 2>/dev/null ||
    fail "the job with a leftover failed (--grace $grace)"
  if [ $grace = 4000ms ]; then
    [ -e "$tmp/left.$grace" ] || fail "--pid-ns: the leftover did not get --grace 4s to finish"
  else
    [ ! -e "$tmp/left.$grace" ] || fail "--pid-ns: the leftover outlived --grace 500ms"
  fi
done
echo "--pid-ns: leftovers get --grace after SIGTERM"
# From the runner's SIGKILL until no process of the job exists (/proc polled every 0.2 ms; a zombie counts as
# gone), for 1 and 8 sleeping children; three runs each. Printed, not asserted beyond a bound (1.5 s).
for n in 1 8; do
  for _ in 1 2 3; do
    "$g" run --pid-ns=on -- sh -c "for i in \$(seq $n); do sleep 304.$tag & done; wait" 2>/dev/null & runner=$!
    keep_pids "$runner"
    for _ in $(seq 1 500); do [ "$(pgrep -f -x "sleep 304.$tag" | wc -l)" = $n ] && break; sleep 0.01; done
    pids=$(pgrep -f "30[0-4]\.$tag" | tr '\n' ' ')
    [ "$(pgrep -f -x "sleep 304.$tag" | wc -l)" = $n ] || fail "the job with $n children did not start"
    keep_pids "$pids"
    python3 - $runner $pids <<'PY' >>"$tmp/times.$n"
import os, sys, time
runner, pids = sys.argv[1], [p for p in sys.argv[2:] if p != sys.argv[1]]

def alive(p):  # a zombie holds nothing: its parent (or a container's init) may reap it late
    try:
        return open("/proc/%s/stat" % p).read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False

os.kill(int(runner), 9)
t0 = time.monotonic()
while any(alive(p) for p in pids):
    assert time.monotonic() - t0 < 1.5, "left after 1.5 s: %s" % [p for p in pids if alive(p)]
    time.sleep(0.0002)
print("%.1f" % ((time.monotonic() - t0) * 1e3))
PY
    wait $runner 2>/dev/null || true
  done
  echo "--pid-ns=on: runner SIGKILLed -> the job ($n sleeping children, plus sh, init, keeper) gone in $(tr '\n' ' ' <"$tmp/times.$n")ms"
done
set +e; "$g" run --pid-ns=bogus -- true 2>/dev/null; rc=$?; set -e
[ $rc = 2 ] || fail "--pid-ns=bogus exited $rc, wanted 2"
echo "ok"
