#!/usr/bin/env bash
# cli_reap_trust.sh BUILD SRC — `gpuguard reap --yes` kills nothing it should not:
# a live runner started with a dead session's GPUGUARD_SESSION; a live job in another PID
# namespace sharing the registry (root); another user's process in an orphan's process group
# (root, with a second uid: `gpuguard-other`, created with useradd when absent). The real
# orphan next to them is ended each time. Parts that need root are skipped, saying so, without it.
# The orphans come from runners with --pid-ns=off (the fallback design: a SIGKILLed runner leaves its job
# for reap). With a PID namespace (the default where allowed) the kernel ends the job, another user's
# process inside included, and reap finds nothing: checked last, skipped where namespaces are refused.
set -euo pipefail
# `run`'s default is --pid-ns=auto; the off design runs where a check says --pid-ns=off.
unset GPUGUARD_PID_NS
build=$1
g="$(cd "$build" && pwd)/gpuguard"
tmp=$(mktemp -d)
chmod 755 "$tmp"
unset GPUGUARD_SESSION
export GPUGUARD_REGISTRY_DIR="$tmp/reg"
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
# A SIGKILLed runner may still be writing its registry record into $tmp while rm runs: wait for our
# own jobs, and try the removal once more, so cleanup never decides the test's status.
cleanup() {
  for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait "${keep[@]}" 2>/dev/null || true
  rm -rf "$tmp" 2>/dev/null || { sleep 0.2; rm -rf "$tmp" || true; }
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
tag=$$
pids_of() { pgrep -f "^sleep $1$" || true; }
wait_for() { for _ in $(seq 1 500); do [ -n "$(pids_of "$1")" ] && return 0; sleep 0.02; done; fail "'sleep $1' never started"; }

# A dead session: its runner SIGKILLed, its job (the orphan) left behind.
"$g" run --pid-ns=off -- sh -c "sleep 71.$tag & wait" 2>/dev/null & dead_runner=$!
keep_pids "$dead_runner"
wait_for 71.$tag
orphan=$(pids_of 71.$tag); keep_pids "$orphan"
dead_session=$(tr '\0' '\n' < /proc/$orphan/environ | sed -n 's/^GPUGUARD_SESSION=//p')
[ -n "$dead_session" ] || fail "the job has no session"
kill -9 $dead_runner; wait $dead_runner 2>/dev/null || true

# Case A: a live runner given the dead session's id.
GPUGUARD_SESSION=$dead_session "$g" run -- sleep 72.$tag 2>"$tmp/spoof.err" & spoof=$!
keep_pids "$spoof"
wait_for 72.$tag
keep_pids "$(pids_of 72.$tag)"
grep -q "no live leader" "$tmp/spoof.err" || fail "the runner joined the dead session silently"

# Case B: a live job in its own PID namespace, same registry (root only).
ns=no
if [ "$(id -u)" = 0 ] && unshare --pid --fork --mount-proc true 2>/dev/null; then
  unshare --pid --fork --mount-proc "$g" run -- sleep 73.$tag 2>/dev/null & nsjob=$!
  keep_pids "$nsjob"
  wait_for 73.$tag
  keep_pids "$(pids_of 73.$tag)"
  ns=yes
else
  echo "SKIP part: a job in another PID namespace (needs root and unshare)"
fi

"$g" reap --yes --grace 300ms > "$tmp/reap" 2>&1 || { cat "$tmp/reap"; fail "reap failed"; }
for _ in $(seq 1 300); do [ -d /proc/$orphan ] || break; sleep 0.02; done
[ ! -d /proc/$orphan ] || { cat "$tmp/reap"; fail "the real orphan $orphan was not ended"; }
kill -0 $spoof 2>/dev/null || { cat "$tmp/reap"; fail "case A: reap killed the live runner given a dead session's id"; }
[ -n "$(pids_of 72.$tag)" ] || fail "case A: reap killed the live runner's job"
echo "case A: the live runner with a dead session's id and its job survive reap; the orphan was ended"
if [ $ns = yes ]; then
  [ -n "$(pids_of 73.$tag)" ] || { cat "$tmp/reap"; fail "case B: reap killed a live job of another PID namespace"; }
  echo "case B: the job in another PID namespace survives reap"
fi

# Case C: another user's process in an orphan's process group (root and a second uid).
if [ "$(id -u)" != 0 ] || ! command -v setpriv >/dev/null; then
  echo "SKIP part: another user's process in the orphan's group (needs root and setpriv)"
  exit 0
fi
id gpuguard-other >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin gpuguard-other
other=$(id -u gpuguard-other)
"$g" run --pid-ns=off -- setsid sh -c "sleep 74.$tag & setpriv --reuid=$other --regid=$other --clear-groups sleep 75.$tag & wait" \
  2>/dev/null & runner=$!
keep_pids "$runner"
wait_for 74.$tag; wait_for 75.$tag
mine=$(pids_of 74.$tag) theirs=$(pids_of 75.$tag)
keep_pids "$mine" "$theirs"
[ "$(ps -o pgid= -p $mine)" = "$(ps -o pgid= -p $theirs)" ] || fail "the two are not in one group"
kill -9 $runner; wait $runner 2>/dev/null || true
for _ in $(seq 1 300); do grep -q "^PPid:[[:space:]]*1$" /proc/$mine/status 2>/dev/null && break; sleep 0.02; done
"$g" reap --yes --grace 300ms > "$tmp/reap2" 2>&1 || { cat "$tmp/reap2"; fail "reap failed"; }
for _ in $(seq 1 300); do [ -d /proc/$mine ] || break; sleep 0.02; done
[ ! -d /proc/$mine ] || { cat "$tmp/reap2"; fail "case C: our orphan $mine was not ended"; }
kill -0 $theirs 2>/dev/null || { cat "$tmp/reap2"; fail "case C: reap signalled another user's process ($theirs)"; }
echo "case C: reap ended our orphans in the group and left uid $other's process alone"

# The same job in a PID namespace: the runner SIGKILLed, the kernel ends the namespace with both
# processes (the job started the other user's one); nothing is left for reap.
if ! "$g" run --pid-ns=on -- true 2>"$tmp/ns.err"; then
  echo "SKIP part: the job in a PID namespace: refused here: $(cat "$tmp/ns.err")"
  exit 0
fi
"$g" run --pid-ns=on -- setsid sh -c "sleep 76.$tag & setpriv --reuid=$other --regid=$other --clear-groups sleep 77.$tag & wait" \
  2>/dev/null & runner=$!
keep_pids "$runner"
wait_for 76.$tag; wait_for 77.$tag
keep_pids "$(pids_of 76.$tag)" "$(pids_of 77.$tag)"
kill -9 $runner; wait $runner 2>/dev/null || true
for _ in $(seq 1 300); do [ -z "$(pids_of 76.$tag)$(pids_of 77.$tag)" ] && break; sleep 0.01; done
[ -z "$(pids_of 76.$tag)$(pids_of 77.$tag)" ] || fail "--pid-ns=on: the job outlived its SIGKILLed runner"
"$g" reap --dry-run > "$tmp/reap3" 2>&1 || { cat "$tmp/reap3"; fail "reap --dry-run failed"; }
grep -q "no orphans" "$tmp/reap3" || { cat "$tmp/reap3"; fail "--pid-ns=on: reap found orphans after the kernel ended the job"; }
echo "pid-ns: a SIGKILLed runner's namespace ended by the kernel (uid $other's process too); nothing for reap"
