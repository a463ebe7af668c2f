#!/usr/bin/env bash
# ns_mounts.sh BUILD SRC — `gpuguard run` with its PID namespace shares the host's mounts as before: a
# file system mounted after the job started (an automount, NFS, a scratch volume) is seen by the job, and
# the job's own /proc does not leak out to the host. Needs root (a shared mount of its own to mount on)
# and PID namespaces; skips (77) without them.
set -euo pipefail
unset GPUGUARD_PID_NS GPUGUARD_SESSION
build=$1
g="$build/gpuguard"
[ "$(id -u)" = 0 ] || { echo "SKIP: needs root to mount"; exit 77; }
tmp=$(mktemp -d)
runner=
cleanup() {
  [ -z "$runner" ] || kill -9 "$runner" 2>/dev/null || true
  umount "$tmp/shared/late" 2>/dev/null || true
  umount "$tmp/shared" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export GPUGUARD_REGISTRY_DIR="$tmp/reg" GPUGUARD_BACKEND=host
$g run --pid-ns=on -- true 2>/dev/null || { echo "SKIP: PID namespaces refused here"; exit 77; }
mkdir -p "$tmp/shared"
# A mount point of our own whose mounts propagate, as / is on a systemd host.
mount --bind "$tmp/shared" "$tmp/shared" || { echo "SKIP: cannot bind-mount here"; exit 77; }
mount --make-shared "$tmp/shared" || { echo "SKIP: cannot make a shared mount here"; exit 77; }
mkdir -p "$tmp/shared/late"
# The job waits until the test has mounted a file system after it started, then looks for its file.
job="while [ ! -e '$tmp/mounted' ]; do sleep 0.02; done; [ -e '$tmp/shared/late/here' ]"
$g run --pid-ns=on -- sh -c "echo started > '$tmp/started'; $job" 2>"$tmp/err" &
runner=$!
for _ in $(seq 1 500); do [ -s "$tmp/started" ] && break; sleep 0.02; done
[ -s "$tmp/started" ] || fail "the job never started: $(cat "$tmp/err")"
mount -t tmpfs late "$tmp/shared/late"
touch "$tmp/shared/late/here" "$tmp/mounted"
set +e; wait $runner; rc=$?; set -e
runner=
[ $rc = 0 ] || fail "the job did not see a file system mounted after it started (exit $rc)"
echo "pid-ns: a mount made after the job started is seen inside it"
# The namespace's own /proc stays inside: the host's /proc still shows the host's processes.
[ -d "/proc/$$" ] || fail "the job's /proc replaced the host's"
echo "pid-ns: the job's /proc did not leak to the host"
