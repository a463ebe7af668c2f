#!/usr/bin/env bash
# scripts/demo.sh — the README's demo command: builds gpuguard and runs the example training program,
# on the CUDA backend when a GPU is usable and on the simulated host device otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
echo "==> building (build/demo)"
cmake -S . -B build/demo -DCMAKE_BUILD_TYPE=Release -DGPUGUARD_BUILD_TESTS=OFF >/dev/null
cmake --build build/demo -j "$(nproc 2>/dev/null || echo 2)" >/dev/null
echo "==> devices"
build/demo/examples/devices
if [ -x build/demo/examples/train ]; then
  echo "==> example training program: weights in an arena, one scope per step"
  build/demo/examples/train
fi
