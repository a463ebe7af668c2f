#!/usr/bin/env bash
# ops_container.sh BUILD SRC — `gpuguard run` as a container's ENTRYPOINT, where it is PID 1 (issue 43
# §5): PID 1 of a new PID namespace (`unshare --pid --fork --mount-proc`, as docker and Kubernetes
# start it), with a job that leaves zombies (grandchildren orphaned to PID 1) and a grandchild that
# calls setsid. PID 1 reaps the zombies; `docker stop`'s SIGTERM to PID 1 reaches the job once; the
# job's whole tree, the setsid grandchild included, is ended before PID 1 exits (the receipt says so),
# and the exit status is the job's. With the runner's own PID namespace (the default as root) and
# without it (--pid-ns=off).
set -euo pipefail
build=$(cd "$1" && pwd)
g=$build/gpuguard
[ "$(id -u)" = 0 ] || { echo "skipped: a new PID namespace needs root here"; exit 77; }
unshare --pid --fork --mount-proc true 2>/dev/null || { echo "skipped: unshare --pid refused here"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export GPUGUARD_BACKEND=host GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1
unset GPUGUARD_SESSION GPUGUARD_PID_NS

# The job: three grandchildren orphaned at once (each exits after 50 ms: a zombie unless PID 1 reaps
# it), one setsid grandchild that would live on, a SIGTERM handler that counts and exits 0.
cat >"$tmp/job.sh" <<'JOB'
out=$1
trap 'echo term >> "$out"; exit 0' TERM
for _ in 1 2 3; do (sleep 0.05 &); done
setsid sleep 301.5 &
sleep 0.5
echo "pid1 $(cat /proc/1/comm) zombies $(grep -l '^State:.*Z' /proc/[0-9]*/status 2>/dev/null | wc -l)" > "$out.state"
while :; do sleep 0.05; done
JOB
for mode in auto off; do
  out=$tmp/out.$mode
  : >"$out"
  GPUGUARD_PID_NS=$mode unshare --pid --fork --mount-proc \
    "$g" run --grace 5s --receipt "$tmp/receipt.$mode.json" -- bash "$tmp/job.sh" "$out" 2>"$tmp/err.$mode" &
  outer=$!
  for _ in $(seq 1 200); do [ -s "$out.state" ] && break; sleep 0.05; done
  [ -s "$out.state" ] || fail "--pid-ns=$mode: the job did not start: $(cat "$tmp/err.$mode")"
  pid1=$(pgrep -P "$outer")  # PID 1 of the new namespace, as the host numbers it
  read -r _ comm _ zombies <"$out.state"
  [ "$comm" = gpuguard ] || fail "PID 1 is $comm, not gpuguard"
  [ "$zombies" = 0 ] || fail "--pid-ns=$mode: $zombies zombies 0.5 s after their parents exited"
  kill -TERM "$pid1" # docker stop
  set +e; wait "$outer"; rc=$?; set -e
  n=$(grep -c term "$out" || true)
  python3 - "$tmp/receipt.$mode.json" "$mode" "$rc" "$n" <<'PY'
import json, sys
r, mode, rc, n = json.load(open(sys.argv[1])), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
t = r["teardown"]
print("--pid-ns=%s: PID 1 gpuguard, 0 zombies; docker stop: the job's TERM handler ran %d time(s), exit %d, "
      "teardown: %d processes, %d alive" % (mode, n, rc, len(t["processes"]), t["alive"]))
assert n == 1 and rc == 0, (n, rc)
assert t["alive"] == 0 and r["exit"]["status"] == 0, r
if mode == "off":  # the runner's own teardown found the setsid grandchild (with a namespace, its init did)
    assert any("sleep 301.5" in p["command"] for p in t["processes"]), t["processes"]
PY
done
# Nothing of either job outlived its container: the setsid grandchild included.
! pgrep -fx "sleep 301.5" >/dev/null || fail "the setsid grandchild outlived PID 1: $(pgrep -fax "sleep 301.5")"
echo "the setsid grandchildren are gone"
echo "ops_container: ok"
