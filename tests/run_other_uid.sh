#!/usr/bin/env bash
# run_other_uid.sh BUILD SRC — `gpuguard run` as root without a PID namespace: a job whose entrypoint
# drops privileges (setpriv, as gosu and su-exec do) leaves descendants running as another uid; they
# are the job's, and the teardown ends them, and the summary and the receipt count what is left
# truthfully. Needs root and setpriv; skips (77) without.
set -euo pipefail
unset GPUGUARD_PID_NS GPUGUARD_SESSION
build=$1
g="$(cd "$build" && pwd)/gpuguard"
[ "$(id -u)" = 0 ] && command -v setpriv >/dev/null || { echo "SKIP: needs root and setpriv"; exit 77; }
id gpuguard-other >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin gpuguard-other
other=$(id -u gpuguard-other)
tmp=$(mktemp -d)
chmod 755 "$tmp"
tag=$$
cleanup() { pkill -KILL -f "^sleep 30[01]\.$tag$" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export GPUGUARD_REGISTRY_DIR="$tmp/reg" GPUGUARD_BACKEND=host
# The job drops to uid $other and leaves a daemon (setsid) and a background child behind as it exits.
cd "$tmp"
set +e
$g run --pid-ns=off --grace 300 --receipt "$tmp/r.json" -- setpriv --reuid="$other" --regid="$other" \
  --clear-groups sh -c "setsid sleep 300.$tag & sleep 301.$tag & sleep 0.2; exit 0" 2>"$tmp/err"
rc=$?
set -e
[ $rc = 0 ] || { cat "$tmp/err"; fail "run exited $rc"; }
left=$(pgrep -f "^sleep 30[01]\.$tag$" | tr '\n' ' ' || true)
summary=$(grep "teardown:" "$tmp/err" || true)
[ -z "$left" ] || fail "uid $other's descendants of the job left running: $left (the runner said: $summary)"
python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
t = d["teardown"]
ended = [p for p in t["processes"] if p["command"].startswith("sleep 30")]
assert len(ended) == 2 and all(p["end"] != "skipped" for p in ended), t
assert t["alive"] == 0, t
' "$tmp/r.json" || fail "the receipt: $(cat "$tmp/r.json")"
echo "run as root: the job's descendants running as uid $other were ended; $summary"
