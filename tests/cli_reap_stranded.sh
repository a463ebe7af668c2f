#!/usr/bin/env bash
# cli_reap_stranded.sh BUILD SRC — `ps`, `reap` and `check` on real process trees with the stand-in NVML:
# stranded multiprocessing spawn children of a SIGKILLed trainer are listed, counted by ps's footer and
# ended by `reap --yes` (one line each); a nohup'd program beside them is detached and left alone until
# named with --pid; bad --pid values are usage errors or refusals, never a signal; escape sequences in a
# command line never reach the terminal from reap; another user's stranded worker (root, second uid) is
# untouched without --all-users; check's exit codes; no GPUGUARD_TEST_* switch in the shipped library.
set -euo pipefail
build=$1
src=$2
g="$(cd "$build" && pwd)/gpuguard"
lib="$(cd "$build" && pwd)/libgpuguard.so"
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
# The stand-in NVML names pids of our /proc; outside the initial PID namespace they would not be joined.
[ "$(readlink /proc/self/ns/pid)" = "pid:[4026531836]" ] || { echo "SKIP: not in the initial PID namespace"; exit 77; }
tmp=$(mktemp -d)
unset GPUGUARD_SESSION
export GPUGUARD_REGISTRY_DIR="$tmp/reg" GPUGUARD_NVML_LIBRARY="$build/tests/libfake_nvml.so"
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
owork=
cleanup() {
  for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
  [ -z "$owork" ] || rm -rf "$owork"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
alive() { [ -d /proc/$1 ] && ! grep -q '^State:.*Z' /proc/$1/status 2>/dev/null; }

# Item 25: the shipped library reads no test switch.
if grep -qa "GPUGUARD_TEST_" "$lib"; then fail "libgpuguard.so reads GPUGUARD_TEST_* switches"; fi
echo "item 25: no GPUGUARD_TEST_* in libgpuguard.so"

cp "$src/tests/stranded_trainer.py" "$tmp/trainer.py"
# The trainer in a session of its own whose parent exits: what a crashed job leaves behind.
setsid sh -c "python3 '$tmp/trainer.py' '$tmp/kids' & echo \$! > '$tmp/trainer'" 
for _ in $(seq 1 500); do [ -s "$tmp/kids" ] && break; sleep 0.02; done
[ -s "$tmp/kids" ] || fail "the trainer never started its children"
kids=$(cat "$tmp/kids"); trainer=$(cat "$tmp/trainer")
keep_pids "$kids" "$trainer"
kill -9 "$trainer"
sleep 0.3
# A nohup'd program left running by a shell that is gone: detached.
setsid sh -c "nohup sleep 61 >/dev/null 2>&1 & echo \$! > '$tmp/nohup'"
for _ in $(seq 1 200); do [ -s "$tmp/nohup" ] && break; sleep 0.02; done
nh=$(cat "$tmp/nohup"); keep_pids "$nh"
spec=""
for k in $kids $nh; do spec="$spec$k:1073741824,"; done
export FAKE_NVML_PROCS=${spec%,}

"$g" ps --why > "$tmp/ps" || { cat "$tmp/ps"; fail "ps failed"; }
for k in $kids; do grep -q "^0 *$k .*STRANDED" "$tmp/ps" || { cat "$tmp/ps"; fail "spawn child $k is not STRANDED"; }; done
grep -q "^0 *$nh .*detached" "$tmp/ps" || { cat "$tmp/ps"; fail "the nohup'd program is not detached"; }
grep -q "why: .*spawn child" "$tmp/ps" || fail "ps --why shows no evidence"
tail -1 "$tmp/ps" | grep -q "3 STRANDED (end them with: gpuguard reap)" || { cat "$tmp/ps"; fail "footer"; }
tail -1 "$tmp/ps" | grep -q "1 detached" || { cat "$tmp/ps"; fail "footer misses the detached one"; }
"$g" ps --json | python3 -c "
import json, sys
d = json.load(sys.stdin); c = {p['pid']: p for p in d['processes']}
kids = [int(k) for k in sys.argv[1].split()]
assert all(c[k]['class'] == 'stranded' and c[k]['why'] for k in kids), c
assert c[int(sys.argv[2])]['class'] == 'detached', c
" "$kids" "$nh" || fail "ps --json classes"
echo "classes: 3 stranded spawn children, 1 detached nohup'd program; footer names gpuguard reap"

set +e
"$g" check > "$tmp/check"; rc=$?
"$g" check --json > "$tmp/check.json"; rcj=$?
"$g" check --allow lots > /dev/null 2>&1; rcu=$?
set -e
[ $rc = 1 ] && [ $rcj = 1 ] && [ $rcu = 2 ] || fail "check exit codes: $rc $rcj $rcu (want 1 1 2)"
[ "$(grep -c "stranded process" "$tmp/check")" = 3 ] || { cat "$tmp/check"; fail "check: one line per stranded process"; }
python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert not d['ok'] and len(d['problems'])==3, d" "$tmp/check.json"

# Bad --pid values: usage errors (2) or refusals (1), never a signal.
for bad in abc 0 -1 -99999999999 99999999999 12x ""; do
  set +e; "$g" reap --yes --pid "$bad" > "$tmp/bad" 2>&1; rc=$?; set -e
  [ $rc = 2 ] || { cat "$tmp/bad"; fail "--pid '$bad': exit $rc, want 2"; }
done
kthread=$(awk '$1=="2"' /proc/2/stat >/dev/null 2>&1 && echo 2)
nopid=$(( $(cat /proc/sys/kernel/pid_max) - 1 ))
while [ -d /proc/$nopid ]; do nopid=$((nopid - 1)); done
for pid in 1 $$ ${kthread:-} $nopid; do
  set +e; "$g" reap --yes --pid "$pid" > "$tmp/ref" 2>&1; rc=$?; set -e
  [ $rc = 1 ] || { cat "$tmp/ref"; fail "--pid $pid: exit $rc, want 1"; }
  grep -q "refused $pid: " "$tmp/ref" || { cat "$tmp/ref"; fail "--pid $pid: no reason"; }
done
alive "$nh" || fail "a refused --pid run signalled something"
echo "bad --pid: garbage/0/negative/out of range -> exit 2; 1, our shell, kthreadd, no such pid -> refused"

# Item 24: a command line with escape sequences is shown as safe text by reap.
setsid bash -c "exec -a \"\$(printf 'evil\033[2J\033[Hforged')\" sleep 62 & echo \$! > '$tmp/evil'"
for _ in $(seq 1 200); do [ -s "$tmp/evil" ] && break; sleep 0.02; done
evil=$(cat "$tmp/evil"); keep_pids "$evil"
# $! is known before the child has exec'd under its forged name: wait for it (a loaded machine).
for _ in $(seq 1 200); do tr '\0' ' ' <"/proc/$evil/cmdline" 2>/dev/null | grep -q '^evil' && break; sleep 0.02; done
"$g" reap --dry-run --pid "$evil" > "$tmp/esc" 2>&1 || true
grep -q $'\033' "$tmp/esc" && fail "reap printed an escape sequence"
grep -q 'evil\\x1B\[2J' "$tmp/esc" || { cat "$tmp/esc"; fail "reap did not show the command as safe text"; }
echo "item 24: reap shows escape sequences as \\xHH"

# reap: the stranded ones go, one line each; the detached one stays.
"$g" reap --dry-run > "$tmp/dry"
for k in $kids; do alive $k || fail "--dry-run ended $k"; done
"$g" reap > "$tmp/noterm" < /dev/null
grep -q "run with --yes" "$tmp/noterm" || fail "reap without a terminal did not just list"
t0=$(date +%s%N)
"$g" reap --yes --grace 500ms > "$tmp/reap" || { cat "$tmp/reap"; fail "reap --yes failed"; }
for k in $kids; do
  grep -q "^$k: sent TERM" "$tmp/reap" || { cat "$tmp/reap"; fail "no line for $k"; }
  for _ in $(seq 1 100); do alive $k || break; sleep 0.02; done
  alive $k && fail "stranded $k survived reap"
done
alive "$nh" || fail "reap ended the detached program"
echo "reap --yes: 3 stranded ended in $(( ($(date +%s%N) - t0) / 1000000 )) ms; the detached one left alone"
"$g" reap --yes --pid "$nh" > "$tmp/named"
for _ in $(seq 1 100); do alive $nh || break; sleep 0.02; done
alive "$nh" && { cat "$tmp/named"; fail "reap --pid did not end the detached program"; }
echo "reap --pid ends a detached program when named"
export FAKE_NVML_PROCS=""
set +e; "$g" check > "$tmp/ok"; rc=$?; set -e
[ $rc = 0 ] || { cat "$tmp/ok"; fail "check after reap: exit $rc"; }

set +e
GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 GPUGUARD_BACKEND=host "$g" check > /dev/null 2>&1; rc=$?
set -e
[ $rc = 3 ] || fail "check without NVML or a driver: exit $rc, want 3"
echo "check: 1 with stranded processes (one line each), 0 after reap, 2 for a bad --allow, 3 without a GPU"

# A pid reused between the listing and the answer at the terminal's prompt is never signalled (root:
# ns_last_pid gives the next fork the listed pid).
if [ -w /proc/sys/kernel/ns_last_pid ]; then
  python3 - "$g" <<'PY' || fail "pid reuse at the prompt"
import os, pty, select, signal, subprocess, sys, time
g = sys.argv[1]
victim = subprocess.Popen(["sleep", "60"])
pid, fd = pty.fork()
if pid == 0:
    os.execv(g, [g, "reap", "--pid", str(victim.pid)])
out = b""
while b"[y/N]" not in out:
    r, _, _ = select.select([fd], [], [], 10)
    assert r, out
    out += os.read(fd, 4096)
victim.kill(); victim.wait()
time.sleep(0.05)  # a new start time: at least a clock tick later
for attempt in range(50):
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(victim.pid - 1))
    new = subprocess.Popen(["sleep", "60"])
    if new.pid == victim.pid:
        break
    new.kill(); new.wait()
else:
    print("SKIP part: could not reuse the pid"); os.write(fd, b"n\n"); os.waitpid(pid, 0); sys.exit(0)
os.write(fd, b"y\n")
while True:
    try:
        chunk = os.read(fd, 4096)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
os.waitpid(pid, 0)
text = out.decode(errors="replace")
alive = new.poll() is None
new.kill(); new.wait()
assert alive, text
assert f"skipped {victim.pid}: its pid now names another process" in text, text
print(f"reap at a terminal: pid {victim.pid} reused before the answer: skipped, the new process untouched")
PY
else
  echo "SKIP part: pid reuse at the prompt (needs root for ns_last_pid)"
fi

# The registry stays true: a SIGKILLed runner's record goes with its orphan at reap; two jobs in PID
# namespaces that both register as pid 2 keep two records, and none is left when they end.
rm -rf "$GPUGUARD_REGISTRY_DIR"
"$g" run --pid-ns=off -- sleep 64 2>/dev/null & runner=$!
keep_pids "$runner"
for _ in $(seq 1 300); do pgrep -f "^sleep 64$" >/dev/null && break; sleep 0.02; done
keep_pids "$(pgrep -f "^sleep 64$")"
kill -9 $runner; wait $runner 2>/dev/null || true
ls "$GPUGUARD_REGISTRY_DIR"/*.rec >/dev/null 2>&1 || fail "the runner left no record to prune"
"$g" reap --yes --grace 300ms > "$tmp/r0"
[ -z "$(ls "$GPUGUARD_REGISTRY_DIR"/*.rec 2>/dev/null)" ] || { ls "$GPUGUARD_REGISTRY_DIR"; fail "reap left the dead leader's record"; }
echo "registry: reap removed the SIGKILLed runner's record with its orphan"
if ldd "$lib" 2>/dev/null | grep 'lib[at]san' >/dev/null; then # all of ldd's output read: no SIGPIPE under pipefail
  echo "SKIP part: namespaced jobs registering through ctypes (a sanitizer build's library needs its runtime preloaded)"
elif "$g" run --pid-ns=on -- true 2>/dev/null; then
  cat > "$tmp/reg.py" <<'PY'
import ctypes, sys, time
assert ctypes.CDLL(sys.argv[1]).gg_registry_register(b"0") == 0
open(sys.argv[2], "w").write("ok"); time.sleep(1.5)
PY
  "$g" run --pid-ns=on -- python3 "$tmp/reg.py" "$lib" "$tmp/j1" 2>/dev/null & j1=$!
  "$g" run --pid-ns=on -- python3 "$tmp/reg.py" "$lib" "$tmp/j2" 2>/dev/null & j2=$!
  for _ in $(seq 1 300); do [ -s "$tmp/j1" ] && [ -s "$tmp/j2" ] && break; sleep 0.02; done
  [ -s "$tmp/j1" ] && [ -s "$tmp/j2" ] || fail "the namespaced jobs did not register"
  n=$(find "$GPUGUARD_REGISTRY_DIR" -maxdepth 1 -name '2.*.rec' | grep -c '/2\.[0-9]*\.rec$' || true)
  [ "$n" = 2 ] || { ls "$GPUGUARD_REGISTRY_DIR"; fail "two jobs registered as pid 2: $n records"; }
  wait $j1 $j2
  [ -z "$(ls "$GPUGUARD_REGISTRY_DIR"/*.rec 2>/dev/null)" ] || { ls "$GPUGUARD_REGISTRY_DIR"; fail "records left after the jobs ended"; }
  echo "registry: two namespaced jobs as pid 2 kept two records; none left after they ended"
else
  echo "SKIP part: PID namespaces refused here"
fi

# Another user's stranded worker (root, a second uid): untouched without --all-users.
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
  echo "SKIP part: another user's stranded worker (needs root and setpriv)"; exit 0
fi
id gpuguard-other >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin gpuguard-other
other=$(id -u gpuguard-other)
py=/usr/bin/python3 # a shim under /root (pyenv) is not the other user's to run
setpriv --reuid=$other --regid=$other --clear-groups $py -c pass 2>/dev/null || { echo "SKIP part: uid $other cannot run $py"; exit 0; }
# The second uid works in a directory of its own that it can enter, whatever the checkout's and
# $TMPDIR's parents allow (a clone under a 0700 directory): its spawn children chdir to the trainer's
# working directory, and one it cannot enter kills them at start (PermissionError).
owork=$(mktemp -d /tmp/gpuguard-other.XXXXXX)
chmod 755 "$owork"
cp "$src/tests/stranded_trainer.py" "$owork/trainer.py"
chown "$other:$other" "$owork"
setpriv --reuid=$other --regid=$other --clear-groups sh -c "cd '$owork' && test -r trainer.py" ||
  { rm -rf "$owork"; echo "SKIP part: uid $other cannot enter $owork"; exit 0; }
setsid sh -c "cd '$owork' && setpriv --reuid=$other --regid=$other --clear-groups $py trainer.py kids & echo \$! > '$tmp/trainer'"
for _ in $(seq 1 500); do [ -s "$owork/kids" ] && break; sleep 0.02; done
[ -s "$owork/kids" ] || fail "the other user's trainer never started"
kids=$(cat "$owork/kids"); trainer=$(cat "$tmp/trainer"); keep_pids "$kids" "$trainer"
kill -9 $trainer; sleep 0.3
spec=""; for k in $kids; do spec="$spec$k:1048576,"; done
export FAKE_NVML_PROCS=${spec%,}
"$g" reap --yes --grace 300ms > "$tmp/r1"
for k in $kids; do alive $k || { cat "$tmp/r1"; fail "reap without --all-users ended uid $other's $k"; }; done
set +e; "$g" reap --yes --pid ${kids%% *} > "$tmp/r2"; rc=$?; set -e
[ $rc = 1 ] && grep -q "another user's process" "$tmp/r2" || { cat "$tmp/r2"; fail "--pid of another user's process"; }
alive ${kids%% *} || fail "--pid without --all-users ended another user's process"
"$g" reap --yes --all-users --grace 300ms > "$tmp/r3"
for k in $kids; do for _ in $(seq 1 100); do alive $k || break; sleep 0.02; done; alive $k && { cat "$tmp/r3"; fail "--all-users left $k"; }; done
echo "another user's stranded workers: untouched by reap and --pid, ended by reap --all-users as root"
