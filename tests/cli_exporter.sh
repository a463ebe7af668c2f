#!/usr/bin/env bash
# cli_exporter.sh — `gpuguard watch`'s exporter as DCGM users and a hostile network see it, with the
# stand-in NVML (two GPUs): the GPUs NVML numbers (whatever CUDA_VISIBLE_DEVICES says) with DCGM's
# labels (gpu, UUID, pci_bus_id, device, modelName, Hostname), gpuguard_build_info, a scrape-success
# gauge, no command line in any label unless asked for (--command-labels), checked with promtool's
# linter and parsed by prometheus_client; idle connections cannot delay a scrape; loopback unless an address is given, a
# warning otherwise; ports outside 0..65535 or not numbers refused naming the port; the default port;
# another user's command line left out unless --all-users; a failed --prom-file write tried again.
# Arguments: build dir, source dir.
set -euo pipefail
build=$1
g=$build/gpuguard
tmp=$(mktemp -d)
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
python3 -c 'import prometheus_client' 2>/dev/null || { echo "skipped: prometheus_client missing (scripts/deps.sh --tests installs it)"; exit 77; }
command -v promtool >/dev/null || { echo "skipped: promtool missing (Debian's prometheus package; scripts/deps.sh --tests)"; exit 77; }
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
export GPUGUARD_NVML_LIBRARY=$build/tests/libfake_nvml.so FAKE_NVML_COUNT=2 FAKE_NVML_TELEMETRY=87,40,61,412500,700000
unset GPUGUARD_SESSION
# CUDA numbers the visible devices from 0; NVML's gpu label must not follow it.
export CUDA_VISIBLE_DEVICES=1

# Serves in the background on a free loopback port; sets url.
serve() { # stderr file, args...
  local err=$1; shift
  $g watch "$@" 2>"$err" &
  keep_pids "$!"
  server=$!
  for _ in $(seq 1 250); do grep -q "serving http://" "$err" && break; sleep 0.02; done
  url=$(grep -o 'http://[^ ]*/metrics' "$err") || fail "no address on stderr: $(cat "$err")"
}

# A process of another user whose command line carries a secret (as root only: a second user).
other=
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  setpriv --reuid=65534 --regid=65534 --clear-groups bash -c 'exec -a "trainer --token=hunter2" sleep 67' &
  other=$!
  keep_pids "$other"
fi
sleep 60 & mine=$!
keep_pids "$mine"
for _ in $(seq 1 100); do [ -z "$other" ] || grep -q hunter2 /proc/$other/cmdline 2>/dev/null && break; sleep 0.02; done
export FAKE_NVML_PROCS="$mine:1048576${other:+,$other:2097152}" FAKE_NVML_PROCS_1="$mine:4096"

serve "$tmp/a.err" --listen :0
grep -q "serving http://127.0.0.1:" "$tmp/a.err" || fail "--listen :PORT did not bind loopback: $(cat "$tmp/a.err")"
! grep -q "warning" "$tmp/a.err" || fail "a loopback bind warned: $(cat "$tmp/a.err")"
python3 - "$url" "$mine" "${other:-0}" "$(hostname)" "$tmp/scrape.prom" <<'PY'
import socket, sys, time, urllib.parse, urllib.request
from prometheus_client.parser import text_string_to_metric_families

url, mine, other, hostname, out = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
u = urllib.parse.urlparse(url)
# Ten clients that connect and say nothing: the old exporter gave each 2 s in turn (20 s a scrape).
idle = [socket.create_connection((u.hostname, u.port)) for _ in range(10)]
t0 = time.monotonic()
body = urllib.request.urlopen(url, timeout=30).read()
took = time.monotonic() - t0
assert took < 1.5, f"a scrape behind 10 idle connections took {took:.2f} s"
print(f"exporter: a scrape behind 10 idle connections took {took * 1e3:.0f} ms")
open(out, "wb").write(body)
fams = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
for name in ("gpuguard_build_info", "gpuguard_devices", "gpuguard_scrape_collector_success", "gpuguard_device_info",
             "gpuguard_device_memory_used_bytes", "gpuguard_process_memory_used_bytes", "gpuguard_process_info"):
    assert name in fams, (name, sorted(fams))
assert fams["gpuguard_build_info"].samples[0].labels["version"], fams["gpuguard_build_info"]
assert {s.labels["collector"]: s.value for s in fams["gpuguard_scrape_collector_success"].samples} == {
    "devices": 1, "processes": 1, "arenas": 1}
dev = {s.labels["gpu"]: s.labels for s in fams["gpuguard_device_info"].samples}
assert sorted(dev) == ["0", "1"], dev  # NVML's numbering, not CUDA_VISIBLE_DEVICES=1's
for gpu, labels in dev.items():
    assert labels["UUID"] == "GPU-fa4e0000-0000-4000-8000-00000000000" + gpu, labels
    assert labels["modelName"] == "NVIDIA Fake GPU" and labels["Hostname"] == hostname, labels
    assert labels["device"] == "nvidia" + gpu and labels["pci_bus_id"] == f"00000000:0{int(gpu) + 1}:00.0", labels
mem = {(s.labels["gpu"], s.labels["pid"]): s for s in fams["gpuguard_process_memory_used_bytes"].samples}
assert mem[("0", mine)].value == 1048576 and mem[("1", mine)].value == 4096, mem
assert all("command" not in s.labels and "user" not in s.labels for s in mem.values()), mem
info = {(s.labels["gpu"], s.labels["pid"]): s.labels for s in fams["gpuguard_process_info"].samples}
assert all("command" not in s for s in info.values()), info  # no command label by default
if other != "0":
    assert info[("0", other)]["user"] == "nobody", info[("0", other)]
    assert b"hunter2" not in body, "another user's command line is in /metrics"
print("exporter: NVML numbering, DCGM labels, build info, collector success, _info series")
PY
# promtool: the text parses, and lints clean once DCGM's own camelCase label names (kept so that the
# series join DCGM's) are renamed.
promtool check metrics <"$tmp/scrape.prom" >"$tmp/lint.txt" 2>&1 || true
! grep -v "label names should be written in 'snake_case' not 'camelCase'" "$tmp/lint.txt" | grep -q . ||
  { cat "$tmp/lint.txt"; fail "promtool: problems beside DCGM's label names"; }
sed 's/UUID=/uuid=/g; s/modelName=/model_name=/g; s/Hostname=/hostname=/g' "$tmp/scrape.prom" |
  promtool check metrics || fail "promtool check metrics"
echo "exporter: promtool check metrics clean"
# --command-labels: this user's command lines as labels, never another user's.
serve "$tmp/b0.err" --listen 127.0.0.1:0 --command-labels
python3 - "$url" "$mine" <<'PY' || fail "--command-labels"
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
body = urllib.request.urlopen(sys.argv[1], timeout=20).read().decode()
assert "hunter2" not in body, "another user's command line with --command-labels"
info = [s.labels for f in text_string_to_metric_families(body) if f.name == "gpuguard_process_info" for s in f.samples]
assert any(l["pid"] == sys.argv[2] and l.get("command") == "sleep 60" for l in info), info
PY
echo "exporter: --command-labels gives this user's command lines, no other user's"
if [ -n "$other" ]; then
  serve "$tmp/b.err" --listen 127.0.0.1:0 --all-users
  python3 -c 'import sys, urllib.request as u; b = u.urlopen(sys.argv[1], timeout=20).read(); assert b"hunter2" in b' "$url" ||
    fail "--all-users did not include the other user's command line"
  echo "exporter: another user's command line only with --all-users"
else
  echo "note: not root; the other-user case was skipped"
fi

# A non-loopback address is said to be one.
serve "$tmp/c.err" --listen 0.0.0.0:0
grep -q "warning: 0.0.0.0 is not a loopback address" "$tmp/c.err" || fail "no warning on 0.0.0.0: $(cat "$tmp/c.err")"

# Ports: outside 0..65535 or not a number, refused naming the port (getaddrinfo took 74937 as 9401).
for spec in 127.0.0.1:74937 :99999 127.0.0.1:abc 127.0.0.1:-1 127.0.0.1:9402x; do
  set +e; timeout 5 $g watch --listen "$spec" --count 1 2>"$tmp/p.err"; rc=$?; set -e
  [ $rc = 2 ] && grep -q "the port '.*' is not a number from 0 to 65535" "$tmp/p.err" ||
    fail "--listen $spec: exit $rc: $(cat "$tmp/p.err")"
done
# No port: the default, 9402 (DCGM's exporter has 9400).
set +e; timeout 1 $g watch --listen 127.0.0.1 2>"$tmp/d.err"; set -e
grep -q "http://127.0.0.1:9402/metrics\|127.0.0.1': Address already in use" "$tmp/d.err" || fail "default port: $(cat "$tmp/d.err")"
echo "exporter: loopback by default, a warning on 0.0.0.0, ports checked, default port 9402"

# A --prom-file write that fails (its directory is not there yet) is said and tried again.
(sleep 0.6; mkdir "$tmp/later") &
set +e; $g watch --prom-file "$tmp/later/gpu.prom" --interval 100ms --count 15 2>"$tmp/f.err"; rc=$?; set -e
[ $rc = 0 ] || fail "watch --prom-file ended $rc after a failed write: $(cat "$tmp/f.err")"
grep -q "trying again" "$tmp/f.err" && grep -q "written again" "$tmp/f.err" || fail "retry not said: $(cat "$tmp/f.err")"
grep -q gpuguard_device_info "$tmp/later/gpu.prom" || fail "the textfile was not written once the directory came"
echo "exporter: a failed --prom-file write is said and retried"

# NVML but no CUDA (a DaemonSet container with only the `utility` capability), gpuguard left to choose
# its backend: JSON lists NVML's GPUs, not the simulated device; the table says they are there.
env -u GPUGUARD_BACKEND $g info --json >"$tmp/nvml.json"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); b = [x["backend"] for x in d["devices"]]
assert b == ["nvml", "nvml"], d' "$tmp/nvml.json" || fail "info --json without CUDA: $(cat "$tmp/nvml.json")"
env -u GPUGUARD_BACKEND $g info >"$tmp/nvml.txt"
grep -qE "^1 +NVIDIA Fake GPU +nvml " "$tmp/nvml.txt" || fail "info without CUDA: $(cat "$tmp/nvml.txt")"
echo "exporter: NVML without CUDA: info and info --json list NVML's GPUs"

# No GPU at all: no device series, one line on stderr.
serve "$tmp/e.err" --listen 127.0.0.1:0
kill "$server"
GPUGUARD_NVML_LIBRARY=/nonexistent/libnvidia-ml.so.1 serve "$tmp/e.err" --listen 127.0.0.1:0
grep -q "no NVIDIA GPU on this machine" "$tmp/e.err" || fail "no stderr line without a GPU"
python3 -c 'import sys, urllib.request as u; b = u.urlopen(sys.argv[1], timeout=20).read().decode()
assert "gpuguard_devices{source=\"none\"} 0" in b and "gpuguard_device_info" not in b, b' "$url" ||
  fail "the exporter exported a device without a GPU"
echo "exporter: without a GPU, no device series and a line on stderr"
echo "cli_exporter: ok"
