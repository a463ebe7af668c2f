#!/usr/bin/env bash
# scripts/demo.sh — the README's demo command: builds gpuguard, shows the devices, then runs the example
# training program (weights in an arena, one scope per step) under `gpuguard run` with a worker child,
# interrupts it part-way as Ctrl-C would, and shows the receipt and a clean `gpuguard ps`. It runs on the
# CUDA backend when a GPU is usable and on the simulated host device otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
b=build/demo
echo "==> building ($b)"
cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DGPUGUARD_BUILD_TESTS=OFF -DGPUGUARD_BUILD_BENCH=OFF >/dev/null
cmake --build $b -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
g=$b/gpuguard
echo; echo "==> gpuguard info"
$g info

if [ -x $b/examples/train ]; then trainer="$b/examples/train 1000000 500"
else trainer="$b/examples/workers"; fi  # without nvcc the .cu example is not built
echo; echo "==> gpuguard run -- (a worker: sleep 600) + $trainer, interrupted after 3 s"
# Job control on while it starts: a script's background job otherwise starts with SIGINT ignored, and
# gpuguard run keeps signals ignored at start ignored (as nohup needs), so Ctrl-C's signal would do nothing.
set -m
$g run --grace 1s --receipt $b/receipt.json -- sh -c "sleep 600 & exec $trainer" &
runner=$!
set +m
sleep 3
kill -INT $runner   # what Ctrl-C in its terminal would do
set +e; wait $runner; rc=$?; set -e
echo "gpuguard run exited $rc (128 + SIGINT)"

echo; echo "==> the receipt ($b/receipt.json): who was sent what, how each ended, device memory"
python3 - $b/receipt.json <<'PY' || cat $b/receipt.json
import json, sys
d = json.load(open(sys.argv[1]))
print(f"command: {' '.join(d['command'])}")
print(f"runner signal: {d['runner_signal']}, exit code: {d['exit_code']}")
for p in d["teardown"]["processes"]:
    print(f"  pid {p['pid']:>7}  found {p['found']:<10} sent {','.join(p['sent']) or '-':<9} -> {p['end']:<8} {p['command'][:60]}")
dev = d["device"]
if dev:
    print(f"device {dev['index']} ({dev['backend']}): free {dev['free_bytes_before'] >> 20} MiB before, "
          f"{dev['free_bytes_after'] >> 20} MiB after the teardown")
PY

echo; echo "==> gpuguard ps: nothing of the job holds GPU memory any more"
$g ps || true
echo; echo "==> gpuguard reap --dry-run: no orphans"
$g reap --dry-run
echo; echo "More: build/demo/examples/guard/guard_demo --help (Ctrl-C and crash paths), build/demo/examples/workers (kill -9 leaves nothing), the README's tour."
