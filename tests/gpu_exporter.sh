#!/usr/bin/env bash
# gpu_exporter.sh — on a real GPU machine: `gpuguard watch --listen` exports the GPUs as nvidia-smi (and
# DCGM) number them, whatever CUDA_VISIBLE_DEVICES says: gpu = NVML's index, with UUID, pci_bus_id,
# modelName and Hostname as nvidia-smi reports them; a process holding memory on the last GPU, started
# with only that GPU visible to CUDA (its CUDA device 0), is exported under that GPU's NVML index with
# nvidia-smi's memory figure; with CUDA hiding every GPU (CUDA_VISIBLE_DEVICES="", like a container with
# only the `utility` capability: NVML but no CUDA) `info --prom` still lists every GPU from NVML; promtool
# and prometheus_client read the text. Arguments: build dir, source dir.
set -euo pipefail
build=$1
g=$build/gpuguard
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: needs an NVIDIA GPU and nvidia-smi"; exit 77
fi
python3 -c 'import prometheus_client' 2>/dev/null || { echo "SKIP: needs prometheus_client"; exit 77; }
tmp=$(mktemp -d)
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
unset GPUGUARD_BACKEND GPUGUARD_NVML_LIBRARY
nvidia-smi --query-gpu=index,uuid,name,pci.bus_id --format=csv,noheader >"$tmp/smi.csv"
n=$(wc -l <"$tmp/smi.csv")
last=$((n - 1))
echo "nvidia-smi: $n GPU(s); the holder runs on NVML index $last with CUDA_VISIBLE_DEVICES=$last"

# A holder of 1 GiB on the last GPU, which CUDA calls device 0.
CUDA_VISIBLE_DEVICES=$last $build/tests/gpu_hold hold 1024 >"$tmp/hold.out" &
holder=$!
keep_pids "$holder"
for _ in $(seq 1 600); do grep -q ready "$tmp/hold.out" 2>/dev/null && break; sleep 0.1; done
grep -q ready "$tmp/hold.out" || fail "the holder never got ready"
sleep 0.5
nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits >"$tmp/apps.csv"

# The exporter itself sees only the last GPU through CUDA; its series must still follow NVML.
CUDA_VISIBLE_DEVICES=$last $g watch --listen 127.0.0.1:0 --command-labels 2>"$tmp/listen.err" &
keep_pids "$!"
for _ in $(seq 1 250); do grep -q "serving http://" "$tmp/listen.err" && break; sleep 0.02; done
url=$(grep -o 'http://[^ ]*/metrics' "$tmp/listen.err") || fail "no address: $(cat "$tmp/listen.err")"
python3 -c 'import sys, urllib.request as u; open(sys.argv[2], "wb").write(u.urlopen(sys.argv[1], timeout=30).read())' \
  "$url" "$tmp/scrape.prom"
CUDA_VISIBLE_DEVICES='' $g info --prom >"$tmp/nocuda.prom" 2>"$tmp/nocuda.err" || fail "info --prom without CUDA: $(cat "$tmp/nocuda.err")"

python3 - "$tmp/smi.csv" "$tmp/apps.csv" "$tmp/scrape.prom" "$tmp/nocuda.prom" "$holder" "$(hostname)" <<'PY'
import sys
from prometheus_client.parser import text_string_to_metric_families as parse

smi_csv, apps_csv, scrape, nocuda, holder, hostname = sys.argv[1:]
smi = {}
for line in open(smi_csv):
    idx, uuid, name, bus = [x.strip() for x in line.split(",")]
    smi[idx] = (uuid, name, bus)
apps = {}
for line in open(apps_csv):
    if line.strip():
        pid, uuid, mib = [x.strip() for x in line.split(",")]
        apps[(pid, uuid)] = int(mib) << 20
uuid_to_idx = {v[0]: k for k, v in smi.items()}


def fams(path):
    return {f.name: f for f in parse(open(path, encoding="utf-8").read())}


for label, path in (("exporter (CUDA_VISIBLE_DEVICES=last)", scrape), ("info --prom without CUDA", nocuda)):
    f = fams(path)
    dev = {s.labels["gpu"]: s.labels for s in f["gpuguard_device_info"].samples}
    assert sorted(dev) == sorted(smi), (label, sorted(dev), sorted(smi))
    for idx, (uuid, name, bus) in smi.items():
        got = dev[idx]
        assert got["UUID"] == uuid and got["modelName"] == name, (label, idx, got, smi[idx])
        assert got.get("pci_bus_id", "").upper() == bus.upper(), (label, idx, got, bus)
        assert got["Hostname"] == hostname and got["device"].startswith("nvidia"), (label, got)
    src = {s.labels["source"]: s.value for s in f["gpuguard_devices"].samples}
    assert src == {"nvml": len(smi)}, (label, src)
    ok = {s.labels["collector"]: s.value for s in f["gpuguard_scrape_collector_success"].samples}
    assert all(v == 1 for v in ok.values()), (label, ok)
    print(f"{label}: {len(smi)} GPU(s), NVML numbering and DCGM labels match nvidia-smi")

f = fams(scrape)
mine = [s for s in f["gpuguard_process_memory_used_bytes"].samples if s.labels["pid"] == holder]
assert len(mine) == 1, mine
s = mine[0]
want = [v for (pid, uuid), v in apps.items() if pid == holder]
assert want, ("nvidia-smi does not list the holder", apps)
assert s.labels["gpu"] == uuid_to_idx[s.labels["UUID"]] == str(len(smi) - 1), s.labels
assert abs(s.value - want[0]) <= 2 << 20, (s.value, want[0])
info = [x for x in f["gpuguard_process_info"].samples if x.labels["pid"] == holder]
assert info and "gpu_hold" in info[0].labels["command"], info
print(f"holder {holder}: gpu={s.labels['gpu']} (NVML), {s.value / 2**20:.0f} MiB, nvidia-smi {want[0] / 2**20:.0f} MiB")
PY
if command -v promtool >/dev/null; then
  sed 's/UUID=/uuid=/g; s/modelName=/model_name=/g; s/Hostname=/hostname=/g' "$tmp/scrape.prom" | promtool check metrics ||
    fail "promtool check metrics"
  echo "promtool check metrics: clean (DCGM's camelCase label names aside)"
fi
echo "gpu_exporter: ok"
