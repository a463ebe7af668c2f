#!/usr/bin/env bash
# cli_registry_squat.sh BUILD SRC — another user can create /dev/shm/gpuguard-UID before its owner does.
# The registry then falls back to a private directory outside world-writable roots, so a SIGKILLed
# runner's job is still found as an orphan by `reap`; and where no registry is usable at all, `reap`
# and `check` fail loudly instead of saying "no orphans". Runs as a user of its own (root needed to
# make it and to squat); skips (77) otherwise.
set -euo pipefail
unset GPUGUARD_PID_NS GPUGUARD_SESSION GPUGUARD_REGISTRY_DIR XDG_RUNTIME_DIR
build=$1
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null || { echo "SKIP: needs root and setpriv"; exit 77; }
[ -d /dev/shm ] || { echo "SKIP: no /dev/shm"; exit 77; }
user=gpuguard-squat
home=/var/lib/gpuguard-squat
id $user >/dev/null 2>&1 || useradd --system --home-dir $home --shell /usr/sbin/nologin $user
home=$(getent passwd $user | cut -d: -f6)
uid=$(id -u $user)
mkdir -p "$home"
chown "$uid:$(id -g $user)" "$home"
chmod 700 "$home"
# The user's programs and the stand-in NVML where the user can reach them, whatever the checkout's
# parents allow.
work=$(mktemp -d /tmp/gpuguard-squat.XXXXXX)
chmod 755 "$work"
cp "$build/gpuguard" "$build/tests/libfake_nvml.so" "$work/"
cp -L "$build/libgpuguard.so.0" "$work/"
squat=/dev/shm/gpuguard-$uid
tag=$$
runner=
job=
cleanup() {
  for p in $runner $job; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work" "$squat" "$home"/.gpuguard-registry.*
  chmod 700 "$home" 2>/dev/null || true
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
as_user() {
  setpriv --reuid="$uid" --regid="$(id -g $user)" --clear-groups env -u GPUGUARD_REGISTRY_DIR \
    -u XDG_RUNTIME_DIR HOME="$home" LD_LIBRARY_PATH="$work" GPUGUARD_BACKEND=host \
    GPUGUARD_NVML_LIBRARY="$work/libfake_nvml.so" "$@"
}
rm -rf "$squat"
mkdir -m 0777 "$squat" # root's, open to all: refused by the user, as a planted one must be
cd "$work"
# The job's shell dies with the runner (its death signal); the child it left is the orphan.
as_user "$work/gpuguard" run --pid-ns=off -- sh -c "sleep 61.$tag & wait" 2>"$work/run.err" &
runner=$!
for _ in $(seq 1 300); do pgrep -f "^sleep 61\.$tag$" >/dev/null && break; sleep 0.02; done
job=$(pgrep -f "^sleep 61\.$tag$") || fail "the job never started: $(cat "$work/run.err")"
sleep 0.2
shell=$runner
sh=$(ps -o ppid= -p "$job" | tr -d ' ')
runner=$(ps -o ppid= -p "$sh" | tr -d ' ') # the runner itself, under as_user's subshell
kill -9 "$runner"
wait $shell 2>/dev/null || true
set +e
FAKE_NVML_PROCS="$job:1048576" as_user "$work/gpuguard" reap --dry-run >"$work/reap" 2>&1
rc=$?
set -e
grep -q "^orphan $job " "$work/reap" ||
  fail "with $squat squatted, reap (exit $rc) did not find the SIGKILLed runner's job $job: $(cat "$work/reap") / run said: $(cat "$work/run.err")"
echo "squatted $squat: the registry fell back to a private directory; reap found the orphan $job"
kill -9 "$job" 2>/dev/null || true

# No private directory either (the home is open to others): reap and check say so and fail.
rm -rf "$home"/.gpuguard-registry.*
chmod 777 "$home"
for cmd in "reap --dry-run" "check"; do
  set +e
  # shellcheck disable=SC2086 # the words of the command
  FAKE_NVML_PROCS="" as_user "$work/gpuguard" $cmd >"$work/out" 2>&1
  rc=$?
  set -e
  [ $rc = 1 ] && grep -q "registry" "$work/out" ||
    fail "$cmd with no usable registry: exit $rc, wanted 1 naming the registry: $(cat "$work/out")"
done
echo "no usable registry: reap and check exit 1 and say why"
