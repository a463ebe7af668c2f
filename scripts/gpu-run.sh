#!/usr/bin/env bash
# scripts/gpu-run.sh — on a machine with a CUDA GPU: builds gpuguard, runs the whole CTest suite (gpu
# label included), the examples and the benchmarks, and prints a short summary last. Logs go to $OUT
# (or build/gpu-logs). CMocka may come as Debian packages in .deps/ (unpacked with dpkg -x), for
# machines where nothing can be installed.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-build/gpu-logs}
mkdir -p "$out"
if ls .deps/*.deb >/dev/null 2>&1; then
  mkdir -p /tmp/cm && for f in .deps/*.deb; do dpkg -x "$f" /tmp/cm; done
  export CMAKE_PREFIX_PATH=/tmp/cm/usr LD_LIBRARY_PATH=/tmp/cm/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
fi
export PATH=/usr/local/cuda/bin:$PATH
b=build/gpu
summary=()
note() { summary+=("$1"); }

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv,noheader | tee "$out/nvidia-smi.txt"
if cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release >"$out/configure.log" 2>&1 &&
   cmake --build $b -j "$(nproc)" >"$out/build.log" 2>&1; then
  note "build: ok"
else
  tail -50 "$out/build.log" "$out/configure.log"; note "build: FAILED"; printf '%s\n' "${summary[@]}"; exit 1
fi

# Host-side tests in parallel; the gpu ones one at a time, since they measure the device's free memory.
(cd $b && ctest --output-on-failure -LE gpu -j 8) >"$out/ctest-unit.log" 2>&1
note "ctest (not gpu): $(grep -E 'tests passed|tests failed' "$out/ctest-unit.log" | tail -1)"
(cd $b && ctest --output-on-failure -L gpu -V) >"$out/ctest-gpu.log" 2>&1
note "ctest (gpu): $(grep -E 'tests passed|tests failed' "$out/ctest-gpu.log" | tail -1)"
grep -hE '^ *[0-9]+/[0-9]+ Test' "$out/ctest-unit.log" "$out/ctest-gpu.log"
grep -hE 'FAIL|Error|error:' "$out/ctest-unit.log" | head -20
# The gpu tests print what they measured; show those lines (test number prefix stripped).
grep -hE '^[0-9]+: ' "$out/ctest-gpu.log" | grep -vE '\[ *(RUN|OK|PASSED|==========|---) *\]|^[0-9]+: Test command|Environment|Working Directory|^[0-9]+: *$' | sed -E 's/^[0-9]+: //' | head -150

for ex in devices train; do
  if [ -x $b/examples/$ex ]; then
    echo "== example $ex" | tee -a "$out/examples.log"
    timeout 120 $b/examples/$ex 2>&1 | tee -a "$out/examples.log" | tail -25
    note "example $ex: exit ${PIPESTATUS[0]}"
  fi
done
for bench in $b/bench/bench_*; do
  [ -x "$bench" ] || continue
  args=()
  # bench_replay plays the recorded PyTorch training trace through the arena, per chunk size.
  [ "$(basename "$bench")" = bench_replay ] && args=(bench/traces/transformer.trace.gz 2M 8M 64M)
  echo "== $(basename "$bench") ${args[*]}" | tee -a "$out/bench.log"
  timeout 300 "$bench" "${args[@]}" 2>&1 | tee -a "$out/bench.log"
  note "$(basename "$bench"): exit ${PIPESTATUS[0]}"
done

# Python: the binding's tests with torch/cupy on the GPU, the examples, the Python benchmark.
if command -v python3 >/dev/null; then
  export GPUGUARD_LIBRARY=$PWD/$b/libgpuguard.so PYTHONUNBUFFERED=1
  echo "== pytest (bindings/python/tests)" | tee "$out/pytest.log"
  timeout 400 python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests 2>&1 | tee -a "$out/pytest.log" | tail -30
  note "pytest: $(grep -E '[0-9]+ (passed|failed)' "$out/pytest.log" | tail -1)"
  for ex in examples/torch_train.py examples/cupy_example.py; do
    echo "== $ex" | tee -a "$out/examples.log"
    timeout 300 python3 "$ex" 2>&1 | tee -a "$out/examples.log" | tail -40
    note "$ex: exit ${PIPESTATUS[0]}"
  done
  if [ -f bench/bench_python.py ]; then
    echo "== bench_python.py ${GG_BENCH_PY_ARGS:-}" | tee -a "$out/bench.log"
    timeout "${GG_BENCH_PY_TIMEOUT:-420}" python3 bench/bench_python.py ${GG_BENCH_PY_ARGS:-} 2>&1 | tee -a "$out/bench.log"
    note "bench_python.py: exit ${PIPESTATUS[0]}"
  fi
fi

echo; echo "==== summary ===="
printf '%s\n' "${summary[@]}"
