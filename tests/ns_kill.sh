#!/usr/bin/env bash
# ns_kill.sh BUILD SRC — `gpuguard run --pid-ns=on`: when the runner is SIGKILLed, every process of the
# job is gone (the kernel ends the namespace), double-forked setsid daemons included; prints the time
# from SIGKILL to the last one gone. Without --pid-ns the same job outlives the runner (that is what
# `reap` is for). Skips (77) where PID namespaces are refused; `--pid-ns=auto` then says so once.
set -euo pipefail
build=$1
g="$build/gpuguard"
tmp=$(mktemp -d)
unset GPUGUARD_SESSION
export GPUGUARD_REGISTRY_DIR="$tmp/reg"
keep=()
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
now_ms() { date +%s%3N; }
tag=$$
job="sleep 300.$tag & setsid sh -c 'sleep 301.$tag & exec sleep 302.$tag' & sleep 303.$tag & wait"
job_pids() { pgrep -f "^sleep 30[0-3]\.$tag$" || true; }
all_pids() { pgrep -f "30[0-3]\.$tag" || true; }

if ! "$g" run --pid-ns=on -- true 2>"$tmp/err"; then
  "$g" run --pid-ns=auto -- true 2>"$tmp/auto" || fail "--pid-ns=auto failed where namespaces are refused"
  grep -c "no PID namespace" "$tmp/auto" | grep -qx 1 || fail "--pid-ns=auto did not say once that it fell back"
  echo "SKIP: PID namespaces refused here: $(cat "$tmp/err")"; exit 77
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
  keep+=($runner)
  for i in $(seq 1 500); do [ "$(job_pids | wc -l)" = 4 ] && break; sleep 0.01; done
  pids=$(job_pids)
  [ "$(echo "$pids" | wc -l)" = 4 ] || fail "--pid-ns=$mode: the job did not start: $pids"
  keep+=($pids)
  # From outside every job process has its ordinary pid, and /proc shows it ours.
  for p in $pids; do [ -d /proc/$p ] || fail "pid $p not visible from outside"; done
  t0=$(now_ms)
  kill -9 $runner
  wait $runner 2>/dev/null || true
  gone=no
  for i in $(seq 1 300); do [ -z "$(all_pids)" ] && { gone=yes; break; }; sleep 0.005; done
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
# a leftover that needs 1.5 s to finish after TERM finishes with --grace 4000, and is cut short by 500.
left='trap "sleep 1.5; echo finished > $0; exit 0" TERM; while :; do sleep 0.05; done'
for grace in 4000 500; do
  rm -f "$tmp/left.$grace"
  "$g" run --pid-ns=on --grace $grace -- sh -c "sh -c '$left' $tmp/left.$grace & sleep 0.3" 2>/dev/null ||
    fail "the job with a leftover failed (--grace $grace)"
  if [ $grace = 4000 ]; then
    [ -e "$tmp/left.$grace" ] || fail "--pid-ns: the leftover did not get --grace 4000 to finish"
  else
    [ ! -e "$tmp/left.$grace" ] || fail "--pid-ns: the leftover outlived --grace 500"
  fi
done
echo "--pid-ns: leftovers get --grace after SIGTERM"
set +e; "$g" run --pid-ns=bogus -- true 2>/dev/null; rc=$?; set -e
[ $rc = 2 ] || fail "--pid-ns=bogus exited $rc, wanted 2"
echo "ok"
