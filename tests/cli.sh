#!/usr/bin/env bash
# cli.sh — the gpuguard command line on the host backend, with a stand-in NVML: usage and exit codes,
# missing option values, JSON that parses, Prometheus text that a real parser (prometheus_client)
# accepts (every series labelled gpu and UUID, no empty family, valid UTF-8), --prom-file that follows no
# planted symlink, ps that never lists itself and prints no raw control characters, `run` that checks its
# options before starting the job and writes a truthful receipt — without a PID namespace (--pid-ns=off,
# also the fallback) and, where the system allows one, with it (the default); GPUGUARD_PID_NS sets the
# default and a bad value is a usage error; `ps` from outside shows a namespaced job by its host pids.
# Arguments: build dir, source dir.
set -euo pipefail
# `run`'s default is --pid-ns=auto; the off design runs where a check says --pid-ns=off.
unset GPUGUARD_PID_NS
build=$1
g=$build/gpuguard
tmp=$(mktemp -d)
sleeper=
trap 'rm -rf "$tmp"; [ -n "$sleeper" ] && kill $sleeper 2>/dev/null; true' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() { # rc, command...
  local want=$1; shift
  set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
  [ $rc = "$want" ] || { cat "$tmp/out" "$tmp/err"; fail "'$*' exited $rc, wanted $want"; }
}
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
unset GPUGUARD_SESSION NO_COLOR

# Usage and exit codes.
expect_rc 0 $g --help; grep -q "commands:" "$tmp/out" || fail "--help lists no commands"
expect_rc 2 $g; expect_rc 2 $g frobnicate; grep -q "unknown command 'frobnicate'" "$tmp/err" || fail "unknown command not named"
for c in ps info watch; do
  expect_rc 0 $g $c --help; grep -q "usage: gpuguard $c" "$tmp/out" || fail "$c --help"
  expect_rc 2 $g $c --no-such-flag; grep -q "unknown option '--no-such-flag'" "$tmp/err" || fail "$c bad flag not named"
  grep -q "usage: gpuguard $c" "$tmp/err" || fail "$c bad flag prints no usage"
  expect_rc 2 $g $c stray-argument
done
expect_rc 2 $g info --json --prom
expect_rc 2 $g plot; grep -q "no timeline given" "$tmp/err" || fail "plot without a file"
expect_rc 0 $g plot --help; grep -q "usage: gpuguard plot" "$tmp/out" || fail "plot --help"
for bad in 0 -1 abc 1e9 nan ''; do expect_rc 2 $g watch --interval "$bad" --count 1; done
expect_rc 2 $g watch --count 0
expect_rc 2 $g watch --prom-file ''
# A missing value is named as such (also when "--" would have been taken for it).
for c in "watch --interval" "watch --prom-file" "watch --listen" "reap --grace" "run --grace" "run --receipt" "run --device"; do
  expect_rc 2 $g $c; opt=${c#* }
  grep -q -- "$opt needs a value" "$tmp/err" || { cat "$tmp/err"; fail "'$c' does not say the value is missing"; }
done
expect_rc 2 $g run --grace -- true; grep -q -- "--grace needs a value" "$tmp/err" || fail "'run --grace -- true' took -- as the value"

# JSON and Prometheus text, parsed by real parsers.
expect_rc 0 $g info --json
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["devices"][0]["backend"]=="host", d' "$tmp/out"
# Without NVML (no GPU here) no device series at all, never the simulated host device: a line on
# stderr and gpuguard_devices{source="none"} 0 say so.
expect_rc 0 $g info --prom
cp "$tmp/out" "$tmp/info.prom"
grep -q "no NVIDIA GPU on this machine" "$tmp/err" || fail "info --prom without a GPU says nothing on stderr"
grep -qx 'gpuguard_devices{source="none"} 0' "$tmp/info.prom" || fail "info --prom without a GPU: no gpuguard_devices 0"
! grep -q "gpuguard_device_\|host device" "$tmp/info.prom" || fail "info --prom exported the simulated host device"
cat > "$tmp/parse.py" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families
text = open(sys.argv[1], "rb").read().decode("utf-8")  # strict: the text must be valid UTF-8
fams = {f.name: f for f in text_string_to_metric_families(text)}
for name in sys.argv[2:]:
    assert name in fams, (name, sorted(fams))
for f in fams.values():
    assert f.samples, ("empty family", f.name)
    if f.name in ("gpuguard_build_info", "gpuguard_devices", "gpuguard_scrape_collector_success"):
        continue  # not about one device
    for s in f.samples:
        assert s.labels.get("gpu") == "0" and s.labels.get("UUID", "").startswith("GPU-"), s
print("parsed", len(fams), "metric families")
PY
python3 "$tmp/parse.py" "$tmp/info.prom" gpuguard_build_info gpuguard_devices

# Processes from the stand-in NVML: this shell (1 MB) and a sleeper whose memory NVML does not know.
sleep 60 & sleeper=$!
export GPUGUARD_NVML_LIBRARY=$build/tests/libfake_nvml.so FAKE_NVML_PROCS="$$:1048576,$sleeper:na"
export FAKE_NVML_TELEMETRY=87,40,61,412500,700000
expect_rc 0 $g ps
grep -qE "^0 +$$ .* 1.0 MiB" "$tmp/out" || { cat "$tmp/out"; fail "ps does not show this shell with 1.0 MiB"; }
grep -qE "^0 +$sleeper .* \? .*sleep 60" "$tmp/out" || { cat "$tmp/out"; fail "ps does not show the sleeper with unknown memory"; }
expect_rc 0 $g ps --json
python3 - "$tmp/out" $$ $sleeper <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = {p["pid"]: p for p in d["processes"]}
me, sl = int(sys.argv[2]), int(sys.argv[3])
assert rows[me]["used_bytes"] == 1048576 and rows[sl]["used_bytes"] is None, rows
assert rows[sl]["ppid"] == me and rows[sl]["command"] == "sleep 60" and rows[sl]["orphan"] is False, rows[sl]
PY
expect_rc 0 $g watch --prom-file "$tmp/gpu.prom" --count 2 --interval 0.05
[ ! -e "$tmp/gpu.prom.tmp.$$" ] && ! compgen -G "$tmp/*.tmp.*" >/dev/null || fail "temporary file left behind"
python3 "$tmp/parse.py" "$tmp/gpu.prom" gpuguard_process_memory_used_bytes gpuguard_processes
grep -q "gpuguard_process_memory_used_bytes{gpu=\"0\",UUID=\"GPU-[0-9a-f-]*\",[^}]*pid=\"$$\"" "$tmp/gpu.prom" || fail "process series missing"
python3 "$tmp/parse.py" "$tmp/gpu.prom" gpuguard_device_utilization_ratio gpuguard_device_temperature_celsius gpuguard_device_power_watts
! grep -q "gpuguard_arena_" "$tmp/gpu.prom" || fail "the CLI has no arenas, yet gpuguard_arena_* families were written"
expect_rc 1 $g watch --prom-file /nonexistent-dir/x.prom --count 1
grep -q "cannot write" "$tmp/err" || fail "unwritable --prom-file not explained"

# ps never lists itself, even where the driver names it (its own device descriptors).
self=$(sh -c 'echo $$; FAKE_NVML_PROCS="$$:4096" exec "$1" ps >"$2/self.txt"' sh $g "$tmp")
! grep -qE "^0 +$self " "$tmp/self.txt" || { cat "$tmp/self.txt"; fail "ps lists itself"; }
self=$(sh -c 'echo $$; FAKE_NVML_PROCS="$$:4096" exec "$1" ps --json >"$2/self.json"' sh $g "$tmp")
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert all(p["pid"] != int(sys.argv[2]) for p in d["processes"]), d' "$tmp/self.json" "$self"

# Command lines with control characters cannot forge rows: ESC, CR, LF come out as \xHH (a
# terminal would obey them); the Prometheus text stays valid UTF-8 with a 0xFF byte in a command line.
bash -c 'exec -a "$0" sleep 61' $'\e[2J\rEVIL\nFORGED\xff' & evil=$!
for _ in $(seq 1 100); do grep -q EVIL /proc/$evil/cmdline 2>/dev/null && break; sleep 0.02; done
FAKE_NVML_PROCS="$evil:2048" expect_rc 0 $g ps --all-users
grep -qF '\x1B[2J\x0DEVIL\x0AFORGED\xFF 61' "$tmp/out" || { cat -v "$tmp/out"; fail "control characters not escaped"; }
! grep -q $'\e\|\r' "$tmp/out" || fail "raw ESC or CR in ps output"
# (counted by what a forged row would start with: on a GPU machine real descriptor holders add rows)
[ "$(grep -c " $evil " "$tmp/out")" = 1 ] && ! grep -qE '^(EVIL|FORGED)' "$tmp/out" ||
  { cat -v "$tmp/out"; fail "a command line added rows"; }
FAKE_NVML_PROCS="$evil:2048" expect_rc 0 $g watch --prom-file "$tmp/evil.prom" --count 1
python3 "$tmp/parse.py" "$tmp/evil.prom" gpuguard_process_memory_used_bytes
kill $evil

# --prom-file follows no symlink planted where its temporary file goes (another user could make gpuguard overwrite a file): the old
# name was PATH.tmp.<pid>, planted here by the shell that then becomes gpuguard.
echo keep >"$tmp/victim"
expect_rc 0 sh -c 'ln -s "$1" "$2.tmp.$$"; exec "$3" watch --prom-file "$2" --count 1' sh "$tmp/victim" "$tmp/planted.prom" $g
[ "$(cat "$tmp/victim")" = keep ] || fail "--prom-file wrote through a planted symlink"
[ -f "$tmp/planted.prom" ] && [ ! -L "$tmp/planted.prom" ] || fail "--prom-file did not write a regular file"
[ "$(stat -c %a "$tmp/planted.prom")" = 644 ] || fail "the textfile is not readable by node_exporter"

# run: every option is checked before the job starts; exit 2, and the job never ran.
expect_rc 2 $g run --device 7 -- touch "$tmp/started"; grep -q "no such device" "$tmp/err" || fail "--device 7 not refused"
expect_rc 2 $g run --receipt /nonexistent-dir/r.json -- touch "$tmp/started"
grep -q "cannot be written" "$tmp/err" || fail "unwritable --receipt not said before the job"
mkdir "$tmp/adir"; expect_rc 2 $g run --receipt "$tmp/adir" -- touch "$tmp/started"
[ ! -e "$tmp/started" ] || fail "the job ran although an option was bad"
expect_rc 127 $g run --receipt "$tmp/never.json" -- /nonexistent/cmd
grep -q '"start_error":"' "$tmp/never.json" || fail "a job that never started has no receipt saying why"
# The receipt tells the job's truth: its command, its parent, its exit status; a background child that
# outlived it is "reparented", not "orphan"; stderr says when the grace period starts and SIGKILL goes.
tag=$$ # in the sleeps' durations: other worktrees run this script at once
job='(trap "" TERM; : >"$0/ready"; sleep 67.'$tag') & while [ ! -e "$0/ready" ]; do sleep 0.01; done; exit 3'
expect_rc 3 $g run --pid-ns=off --grace 200ms --receipt "$tmp/r.json" -- sh -c "$job" "$tmp"
grep -q "got SIGTERM and a grace period of" "$tmp/err" || { cat "$tmp/err"; fail "no line when the grace period starts"; }
grep -q "SIGKILL sent to" "$tmp/err" || { cat "$tmp/err"; fail "no line when SIGKILL is sent"; }
cat > "$tmp/receipt.py" <<'PY'
import json, sys
d, mode = json.load(open(sys.argv[1])), sys.argv[2]
procs = d["teardown"]["processes"]
job = [p for p in procs if p["pid"] == d["pid"]]
assert len(job) == 1, procs
job = job[0]
assert job["command"].startswith("sh -c (trap \"\" TERM; : >\"$0/ready\"; sleep 67."), job
assert job["ppid"] > 1 and job["end"] == "exited" and job["code"] == 3, job
assert d["exit"] == {"status": 3, "signal": None} and d["exit_code"] == 3, d
assert d["pid_ns"] is (mode == "on"), d
assert all(p["found"] != "orphan" for p in procs), procs
if mode == "off":
    assert any(p["found"] in ("descendant", "reparented") and "KILL" in p["sent"] for p in procs), procs
else:  # the namespace's init gave the leftover SIGTERM and --grace; the kernel ended it with the init
    assert len(procs) == 1, procs
PY
python3 "$tmp/receipt.py" "$tmp/r.json" off
# The same job in a PID namespace (the default where the system allows one).
rm -f "$tmp/ready"
if $g run --pid-ns=on -- true 2>"$tmp/ns.err"; then
  expect_rc 3 $g run --grace 200ms --receipt "$tmp/r.json" -- sh -c "$job" "$tmp"
  python3 "$tmp/receipt.py" "$tmp/r.json" on
  ! pgrep -x -f "sleep 67.$tag" >/dev/null || fail "--pid-ns=on: the leftover that ignores TERM outlived the job"
  # GPUGUARD_PID_NS sets the default; --pid-ns beats it.
  env -u GPUGUARD_PID_NS $g run --receipt "$tmp/e.json" -- true 2>"$tmp/err" || fail "run without GPUGUARD_PID_NS"
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["pid_ns"] is True' "$tmp/e.json" # auto by default
  ! grep -q "namespace" "$tmp/err" || fail "the default (off) spoke of namespaces: $(cat "$tmp/err")"
  GPUGUARD_PID_NS=off expect_rc 0 $g run --receipt "$tmp/e.json" -- true
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["pid_ns"] is False' "$tmp/e.json"
  GPUGUARD_PID_NS=off expect_rc 0 $g run --pid-ns --receipt "$tmp/e.json" -- true
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["pid_ns"] is True' "$tmp/e.json"
  GPUGUARD_PID_NS=on expect_rc 0 $g run --receipt "$tmp/e.json" -- true
  python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["pid_ns"] is True' "$tmp/e.json"
  ! grep -q "PID namespace" "$tmp/err" || fail "a line about namespaces where one was made: $(cat "$tmp/err")"
  # ps from outside: a namespaced job's process by its host pid, guarded (its session is live), its
  # parent the namespace's init (a host pid too), not an orphan.
  $g run -- sh -c "sleep 69.$tag & wait" 2>/dev/null & nsrun=$!
  for _ in $(seq 1 500); do nsjob=$(pgrep -x -f "sleep 69.$tag" || true); [ -n "$nsjob" ] && break; sleep 0.02; done
  [ -n "$nsjob" ] || fail "the namespaced job did not start"
  FAKE_NVML_PROCS="$nsjob:2097152" expect_rc 0 $g ps --json
  kill -TERM $nsrun; wait $nsrun 2>/dev/null || true
  python3 - "$tmp/out" $nsjob $tag <<'PY'
import json, sys
rows = {p["pid"]: p for p in json.load(open(sys.argv[1]))["processes"]}
me = int(sys.argv[2])
assert me in rows, (me, rows)
assert rows[me]["used_bytes"] == 2097152 and rows[me]["command"] == "sleep 69." + sys.argv[3], rows[me]
assert rows[me]["class"] == "guarded" and rows[me]["orphan"] is False and rows[me]["ppid"] > 1, rows[me]
PY
  echo "run --pid-ns: receipt, GPUGUARD_PID_NS, and ps from outside (host pid $nsjob, guarded)"
else
  echo "SKIP part: the job in a PID namespace: refused here: $(cat "$tmp/ns.err")"
fi
# A bad GPUGUARD_PID_NS is a usage error that names it (also next to --pid-ns), and the job never runs.
for bad in maybe ON 2 ' on'; do
  GPUGUARD_PID_NS="$bad" expect_rc 2 $g run -- touch "$tmp/started"
  grep -q "GPUGUARD_PID_NS='$bad': auto, on or off expected" "$tmp/err" || { cat "$tmp/err"; fail "GPUGUARD_PID_NS='$bad' not named"; }
  GPUGUARD_PID_NS="$bad" expect_rc 2 $g run --pid-ns=off -- touch "$tmp/started"
done
[ ! -e "$tmp/started" ] || fail "the job ran although GPUGUARD_PID_NS was bad"
GPUGUARD_PID_NS='' expect_rc 0 $g run --pid-ns=off -- true
# --torch puts GPUGUARD_TORCH=1 in the job's environment (the Python package's startup hook reads it).
env -u GPUGUARD_TORCH $g run --pid-ns=off --torch -- sh -c 'echo "T=$GPUGUARD_TORCH" >"$0"' "$tmp/torch.env" \
  >/dev/null 2>&1 || fail "run --torch failed"
grep -qx 'T=1' "$tmp/torch.env" || fail "run --torch did not set GPUGUARD_TORCH=1: $(cat "$tmp/torch.env")"
env -u GPUGUARD_TORCH $g run --pid-ns=off -- sh -c 'echo "T=${GPUGUARD_TORCH-unset}" >"$0"' "$tmp/torch.env" \
  >/dev/null 2>&1 || fail "run failed"
grep -qx 'T=unset' "$tmp/torch.env" || fail "run without --torch set GPUGUARD_TORCH"

# No GPU at all: ps says so, text and --json with the same status (3).
if ! [ -e /dev/nvidiactl ]; then
  export GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1
  expect_rc 3 $g ps; grep -q "no NVIDIA GPU" "$tmp/err" || fail "ps without a GPU says nothing clear"
  expect_rc 3 $g ps --json; grep -q "no NVIDIA GPU" "$tmp/err" || fail "ps --json without a GPU says nothing"
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["processes"] == [], d' "$tmp/out"
fi
echo "cli: ok"
