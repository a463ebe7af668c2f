#!/usr/bin/env bash
# exporter_labels.sh BUILD SRC — the exporter's per-process series are bounded, private and joinable
# (issue 43 §4, 42 item 6), with the stand-in NVML (two GPUs) and real processes:
#  - per GPU, series for the --top K largest holders and every stranded or orphaned process, the rest
#    counted (gpuguard_process_series_omitted) and summed per class (gpuguard_class_memory_used_bytes);
#  - no command label by default; another user's command line (a secret in its flags; a detached
#    program, which root does not class foreign) in none of /metrics, the textfile, `ps --json` or the
#    Python monitor's /json;
#  - hpc_job from SLURM_JOB_ID in the process's environment; pod_uid from its cgroup, pod and namespace
#    from inside its root (as root: a cgroup named as the kubelet names it, a private mount namespace).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
g=$build/gpuguard
python3 -c 'import prometheus_client' 2>/dev/null || { echo "skipped: prometheus_client missing (scripts/deps.sh --tests)"; exit 77; }
[ "$(readlink /proc/self/ns/pid)" = "pid:[4026531836]" ] || { echo "SKIP: not in the initial PID namespace"; exit 77; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
keep=()
cg=
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() {
  for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "$cg" ]; then sleep 0.2; rmdir "$cg" "${cg%/*}" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset GPUGUARD_SESSION SLURM_JOB_ID
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
export GPUGUARD_NVML_LIBRARY=$build/tests/libfake_nvml.so FAKE_NVML_COUNT=2

# Two stranded spawn children of a SIGKILLed trainer.
cp "$src/tests/stranded_trainer.py" "$tmp/trainer.py"
setsid sh -c "python3 '$tmp/trainer.py' '$tmp/kids' 2 & echo \$! > '$tmp/trainer'"
for _ in $(seq 1 500); do [ -s "$tmp/kids" ] && break; sleep 0.02; done
[ -s "$tmp/kids" ] || fail "the trainer never started its children"
kids=$(cat "$tmp/kids")
keep_pids "$kids" "$(cat "$tmp/trainer")"
kill -9 "$(cat "$tmp/trainer")"
# Twelve holders of ours, one of them in Slurm job 4242.
holders=()
for i in $(seq 1 12); do
  if [ "$i" = 12 ]; then SLURM_JOB_ID=4242 sleep 71 & else sleep 71 & fi
  holders+=("$!")
  keep_pids "$!"
done
spec=""
for k in $kids; do spec="$spec$k:1048576,"; done
for i in "${!holders[@]}"; do spec="$spec${holders[$i]}:$(( (i + 1) * 104857600 )),"; done
# Another user's detached program with a token in its flags (as root it is classed detached).
other=
if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
  other=$(cd / && setpriv --reuid=65534 --regid=65534 --clear-groups setsid sh -c \
    "nohup bash -c 'exec -a \"serve --token=hunter2\" sleep 72' >/dev/null 2>&1 & echo \$!")
  keep_pids "$other"
  for _ in $(seq 1 100); do grep -q hunter2 "/proc/$other/cmdline" 2>/dev/null && break; sleep 0.02; done
  spec="$spec$other:9999999999,"
fi
# A process in a Kubernetes pod: its cgroup named as the kubelet names it, /etc/hostname and the
# service account's namespace in a mount namespace of its own.
pod=
uid=0b6e5c3a-1f2d-4c8e-9a7b-123456789abc
if [ "$(id -u)" = 0 ] && command -v unshare >/dev/null; then
  for root in /sys/fs/cgroup/pids /sys/fs/cgroup; do
    d=$root/kubepods/pod$uid/ctr$$
    if mkdir -p "$d" 2>/dev/null; then cg=$d; break; fi
  done
  if [ -n "$cg" ]; then
    echo trainer-0 > "$tmp/hostname"
    unshare --mount sh -c "echo \$\$ > '$cg/cgroup.procs' && mount --bind '$tmp/hostname' /etc/hostname &&
      mount -t tmpfs tmpfs /run && mkdir -p /run/secrets/kubernetes.io/serviceaccount &&
      echo ml-team > /run/secrets/kubernetes.io/serviceaccount/namespace && echo \$\$ > '$tmp/pod' &&
      exec sleep 73" &
    keep_pids "$!"
    for _ in $(seq 1 200); do [ -s "$tmp/pod" ] && break; sleep 0.02; done
    pod=$(cat "$tmp/pod" 2>/dev/null || true)
  fi
fi
[ -n "$pod" ] && spec="$spec$pod:8888888888," || echo "SKIP part: the pod labels (not root, or no cgroup could be made)"
export FAKE_NVML_PROCS=${spec%,} FAKE_NVML_PROCS_1="${holders[0]}:4096"

$g watch --listen 127.0.0.1:0 --top 3 --prom-file "$tmp/gpu.prom" --interval 1 2>"$tmp/watch.err" &
keep_pids "$!"
for _ in $(seq 1 250); do grep -qs "serving http://" "$tmp/watch.err" && [ -s "$tmp/gpu.prom" ] && break; sleep 0.02; done
url=$(grep -o 'http://[^ ]*/metrics' "$tmp/watch.err") || fail "no address: $(cat "$tmp/watch.err")"
$g ps --json >"$tmp/ps.json"
python3 - "$url" "$tmp" "$kids" "${holders[*]}" "${other:-0}" "${pod:-0}" "$uid" <<'PY'
import json, sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
url, tmp, kids, holders, other, pod, uid = sys.argv[1:]
kids, holders = kids.split(), holders.split()
body = urllib.request.urlopen(url, timeout=20).read().decode()
fams = {f.name: f for f in text_string_to_metric_families(body)}
def series(name, gpu="0"):
    return [s for s in fams[name].samples if s.labels["gpu"] == gpu]
mem = {s.labels["pid"]: s.value for s in series("gpuguard_process_memory_used_bytes")}
info = {s.labels["pid"]: s.labels for s in series("gpuguard_process_info")}
# top 3 by memory among everything on GPU 0, and both stranded children however small
sizes = {h: (i + 1) * 104857600 for i, h in enumerate(holders)}
if other != "0": sizes[other] = 9999999999
if pod != "0": sizes[pod] = 8888888888
want = set(sorted(sizes, key=sizes.get, reverse=True)[:3]) | set(kids)
assert set(mem) == want and set(info) == want, (sorted(mem), sorted(want))
total = len(sizes) + len(kids)
omitted = series("gpuguard_process_series_omitted")[0].value
assert omitted == total - len(want), (omitted, total, want)
print("labels: GPU 0 has %d processes; series for %d (top 3 + %d stranded), %d omitted" % (total, len(want), len(kids), omitted))
cls = {s.labels["class"]: s.value for s in series("gpuguard_class_memory_used_bytes")}
assert cls["stranded"] == 2 * 1048576, cls
assert sum(cls.values()) == sum(sizes.values()) + 2 * 1048576, cls
print("labels: gpuguard_class_memory_used_bytes sums every process:", {k: int(v) for k, v in cls.items() if v})
assert not any("command" in l for l in info.values()), "a command label by default"
texts = {"/metrics": body, "textfile": open(tmp + "/gpu.prom").read(), "ps --json": open(tmp + "/ps.json").read()}
for where, text in texts.items():
    assert "hunter2" not in text, "another user's command line in " + where
if other != "0":
    assert info[other]["class"] == "detached" and info[other]["user"] == "nobody", info[other]
    ps = {p["pid"]: p for p in json.loads(texts["ps --json"])["processes"]}
    assert ps[int(other)]["command"] == "" and ps[int(other)]["class"] == "detached", ps[int(other)]
    print("labels: another user's detached program (--token=hunter2): in none of /metrics, textfile, ps --json")
job = [l for l in info.values() if l.get("hpc_job")]
assert [(l["pid"], l["hpc_job"]) for l in job] == [(holders[-1], "4242")], job
print("labels: hpc_job=4242 on the process with SLURM_JOB_ID=4242, on no other")
if pod != "0":
    l = info[pod]
    assert (l.get("pod_uid"), l.get("pod"), l.get("namespace")) == (uid, "trainer-0", "ml-team"), l
    print("labels: pod_uid=%s pod=%s namespace=%s from the cgroup and the pod's own root" % (uid, l["pod"], l["namespace"]))
PY
# The Python monitor's /json, as root: the other user's command line left out there too.
# A sanitizer build's library cannot be loaded into python3 (its runtime would have to come first).
sanitized=$(sed -n 's/^GPUGUARD_SANITIZE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
[ -z "$sanitized" ] || echo "SKIP part: the Python monitor (a $sanitized build's library is not loaded into python3)"
if [ -z "$sanitized" ] && [ -n "$other" ] && [ -f "$build/libgpuguard.so" ]; then
  GPUGUARD_LIBRARY=$build/libgpuguard.so PYTHONPATH=$src/bindings/python python3 - "$other" <<'PY'
import json, sys, time, urllib.request
import gpuguard
with gpuguard.monitor(interval=0.2, to="http://127.0.0.1:0") as m:
    port = m.port
    time.sleep(0.6)
    body = urllib.request.urlopen("http://127.0.0.1:%d/json" % port, timeout=10).read().decode()
    assert "hunter2" not in body, "another user's command line in the monitor's /json"
    ps = [p for p in json.loads(body).get("processes", []) if p["pid"] == int(sys.argv[1])]
    assert ps and ps[0]["command"] == "", ps
print("labels: the Python monitor's /json leaves out another user's command line")
PY
fi
echo "exporter_labels: ok"
