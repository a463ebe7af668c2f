#!/usr/bin/env bash
# run_grace.sh BUILD SRC — durations and the end of a job that outlives its grace period:
#  - a bare number is seconds on every duration flag (run --grace, reap --grace, watch --interval,
#    check --interval); ms, s and m are units; a bare --grace above 600 is refused (exit 2) with
#    "did you mean Nms?" (old scripts wrote milliseconds);
#  - a job that catches SIGTERM and lives on gets SIGTERM once, then SIGKILL after the grace period
#    (its handler once ran 2-3 times: the teardown sent TERM again, through the keeper and the init
#    of a PID namespace too), with --pid-ns=off and =on, signalled alone or as a group.
set -euo pipefail
build=$1
g=$build/gpuguard
unset GPUGUARD_PID_NS GPUGUARD_SESSION
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() { # rc, command...
  local want=$1; shift
  set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
  [ $rc = "$want" ] || { cat "$tmp/out" "$tmp/err"; fail "'$*' exited $rc, wanted $want"; }
}
grace_ms() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["teardown"]["grace_ms"])' "$1"; }

# 1. Durations: what each spelling means, read back from the receipt.
for spec in 30:30000 1.5:1500 250ms:250 2s:2000 1m:60000 600:600000 0:0; do
  expect_rc 0 "$g" run --pid-ns=off --grace "${spec%%:*}" --receipt "$tmp/r.json" -- true
  got=$(grace_ms "$tmp/r.json")
  [ "$got" = "${spec#*:}" ] || fail "--grace ${spec%%:*} gave grace_ms $got, wanted ${spec#*:}"
done
echo "run --grace: 30 -> 30000 ms, 1.5 -> 1500, 250ms -> 250, 2s -> 2000, 1m -> 60000, 600 -> 600000"
for cmd in "run --grace 5000 -- true" "reap --grace 5000 --dry-run"; do
  read -ra argv <<<"$cmd"
  expect_rc 2 "$g" "${argv[@]}"
  grep -q "did you mean 5000ms?" "$tmp/err" || fail "'$cmd': no hint: $(cat "$tmp/err")"
done
echo "a bare --grace 5000 (run, reap): exit 2, $(grep -o "did you mean 5000ms?" "$tmp/err")"
expect_rc 2 "$g" run --grace 601 -- true
expect_rc 2 "$g" run --grace 601s -- true
expect_rc 0 "$g" run --pid-ns=off --grace 5000ms -- true
expect_rc 0 "$g" reap --grace 2 --dry-run
expect_rc 0 "$g" watch --interval 1 --count 1 --color=never
expect_rc 0 "$g" watch --interval 0.05 --count 1 --color=never
expect_rc 2 "$g" watch --interval 0.01 --count 1
expect_rc 2 "$g" check --interval 0.01 --count 1
echo "watch/check --interval: a bare number is seconds (1 and 0.05 taken, 0.01 below the 50 ms floor)"

# 2. SIGTERM once, then SIGKILL. The job counts each SIGTERM in a file and lives on.
modes=(off)
if "$g" run --pid-ns=on -- true 2>/dev/null; then modes+=(on); else echo "SKIP part: --pid-ns=on refused here"; fi
job='trap "echo term >> $0" TERM; echo ready >> $0.ready; while :; do sleep 0.05; done'
for mode in "${modes[@]}"; do
  for how in runner group; do
    f=$tmp/count.$mode.$how
    : >"$f"
    setsid "$g" run --pid-ns="$mode" --grace 1s -- sh -c "$job" "$f" 2>"$tmp/err.$mode.$how" &
    runner=$!
    for _ in $(seq 200); do [ -s "$f.ready" ] && break; sleep 0.05; done
    [ -s "$f.ready" ] || fail "--pid-ns=$mode: the job did not start"
    if [ $how = runner ]; then kill -TERM "$runner"; else kill -TERM -- "-$runner"; fi
    set +e; wait "$runner"; rc=$?; set -e
    n=$(grep -c term "$f" || true)
    echo "--pid-ns=$mode, SIGTERM to the $how: the job's handler ran $n time(s), exit $rc"
    [ "$n" = 1 ] || { cat "$tmp/err.$mode.$how"; fail "--pid-ns=$mode $how: SIGTERM handler ran $n times, wanted 1"; }
    [ $rc = 137 ] || { cat "$tmp/err.$mode.$how"; fail "--pid-ns=$mode $how: exit $rc, wanted 137 (SIGKILL)"; }
    grep -q "what is left of the job gets SIGKILL" "$tmp/err.$mode.$how" || fail "no SIGKILL announced"
  done
done
echo "run_grace: ok"
