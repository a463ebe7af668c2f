#!/usr/bin/env bash
# gpu_ps.sh — on a real GPU: a process holding 2 GiB of device memory through PyTorch shows up in
# `gpuguard ps` with the memory nvidia-smi reports for it. Arguments: build dir, source dir.
set -euo pipefail
build=$1
g=$build/gpuguard
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: needs an NVIDIA GPU and nvidia-smi"; exit 77
fi
if ! python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "SKIP: needs PyTorch with CUDA"; exit 77
fi
ready=$(mktemp)
trap 'rm -f "$ready"' EXIT
# The holder says when it is done allocating: its memory is stable from then on (cuBLAS and the
# context grow it for a while after the first tensor).
python3 -c "import torch, time, sys; x = torch.empty(2 << 30, dtype=torch.uint8, device='cuda'); x.fill_(1); torch.cuda.synchronize(); open(sys.argv[1], 'w').write('ready'); time.sleep(60)" "$ready" &
holder=$!
trap 'kill $holder 2>/dev/null || true; wait $holder 2>/dev/null || true; rm -f "$ready"' EXIT
for _ in $(seq 1 600); do   # up to 60 s for CUDA to start
  [ -s "$ready" ] && break
  sleep 0.1
done
[ -s "$ready" ] || { echo "FAIL: the holder never got ready"; exit 1; }
sleep 0.5
smi=$(nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', ' -v p=$holder '$1==p {print $2}')
[ -n "$smi" ] || { echo "FAIL: nvidia-smi never listed pid $holder"; exit 1; }
GPUGUARD_BACKEND=cuda $g ps
GPUGUARD_BACKEND=cuda $g ps --json > /tmp/gg_ps.json
python3 - /tmp/gg_ps.json $holder "$smi" <<'PY'
import json, sys
d = json.load(open(sys.argv[1])); pid = int(sys.argv[2]); smi_mib = int(sys.argv[3])
rows = [p for p in d["processes"] if p["pid"] == pid]
assert rows, f"pid {pid} missing from gpuguard ps: {d['processes']}"
mib = rows[0]["used_bytes"] / 1048576
print(f"gpuguard ps: pid {pid} holds {mib:.0f} MiB; nvidia-smi says {smi_mib} MiB")
assert abs(mib - smi_mib) <= 2, (mib, smi_mib)
assert "python3" in rows[0]["command"], rows[0]
PY
echo "gpu_ps: ok"
