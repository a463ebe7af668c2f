#!/usr/bin/env bash
# run_canary_pid.sh BUILD SRC — `gpuguard run` never signals a pid it has reaped: its canary (the child
# that tells group signals from signals to the runner alone) killed early is reaped by the runner's wait
# loop, and its pid, taken meanwhile by another process, must not get the canary's SIGKILL when the job
# ends. Needs root (ns_last_pid picks the pid of the next fork); skips (77) without.
set -euo pipefail
unset GPUGUARD_PID_NS GPUGUARD_SESSION
build=$1
g="$(cd "$build" && pwd)/gpuguard"
[ -w /proc/sys/kernel/ns_last_pid ] || { echo "SKIP: needs root (ns_last_pid)"; exit 77; }
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
command -v pgrep >/dev/null || { echo "SKIP: needs pgrep"; exit 77; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GPUGUARD_REGISTRY_DIR="$tmp/reg" GPUGUARD_BACKEND=host
python3 - "$g" "$tmp" <<'PY'
import os, subprocess, sys, time
g, tmp = sys.argv[1], sys.argv[2]
# The job: find the canary (the runner's child that is not the job), SIGKILL it, wait until the
# runner has reaped it, say so, and end once the test has put another process at its pid.
job = f"""
c=$(pgrep -P $PPID | grep -vx $$ | head -1)
echo $c > {tmp}/canary
kill -9 $c
while [ -e /proc/$c ]; do sleep 0.01; done
touch {tmp}/reaped
while [ ! -e {tmp}/ready ]; do sleep 0.01; done
"""
runner = subprocess.Popen([g, "run", "--pid-ns=off", "--", "sh", "-c", job], stderr=subprocess.PIPE)
path = os.path.join(tmp, "reaped")
for _ in range(500):
    if os.path.exists(path):
        break
    time.sleep(0.02)
else:
    runner.kill()
    sys.exit("FAIL: the job never found and killed the canary")
canary = int(open(os.path.join(tmp, "canary")).read())
victim = None
for attempt in range(100):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(canary - 1))
    p = subprocess.Popen(["sleep", "60"])
    if p.pid == canary:
        victim = p
        break
    p.kill()
    p.wait()
open(os.path.join(tmp, "ready"), "w").close()
runner.wait(timeout=30)
if victim is None:
    print(f"SKIP part: pid {canary} could not be taken again")
    sys.exit(0)
time.sleep(0.1)
alive = victim.poll() is None
victim.kill()
victim.wait()
if not alive:
    sys.exit(f"FAIL: the runner SIGKILLed pid {canary}, its reaped canary's, now another process's"
             f" (it ended by signal {-victim.returncode})")
print(f"run: the canary's pid {canary}, reaped and taken by another process, was left alone")
PY
