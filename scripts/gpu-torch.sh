#!/usr/bin/env bash
# scripts/gpu-torch.sh — on a machine with a CUDA GPU and PyTorch: gpuguard's PyTorch backend end to end.
#   1. builds the library (Release) and runs the backend's own tests (test_torch_native.py) and the other
#      PyTorch tests of the binding;
#   2. third-party training code unchanged under GPUGUARD_TORCH=1 beside PyTorch's default allocator
#      (bench_python part w, one round: losses, peaks, memory figures);
#   3. PyTorch's own test_cuda.py, when a copy sits in .ext/ (it is PyTorch's code, never committed: fetch
#      it beside the checkout), run under each allocator with the same selection, and the counts compared;
#      expecttest comes as a wheel in .whl/ where pip cannot reach PyPI;
#   4. the workload benchmark (bench_python part w, --rounds R, default 3).
# Logs and a summary go to $OUT (or build/gpu-logs). Usage: [GG_STAGES="1 2 3 4"] scripts/gpu-torch.sh [--quick]
# Also: GG_TEST_CUDA_ALLOCS (stage 3: "default gpuguard"), GG_TEST_CUDA_TIMEOUT, GG_W_ALLOCATORS, GG_W_WORKLOADS.
# A wheel in .whl/gg/ is installed and tested as a user runs it (see below).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-build/gpu-logs}
mkdir -p "$out"
out_abs=$(cd "$out" && pwd)
quick=0
[ "${1:-}" = "--quick" ] && quick=1
stages=${GG_STAGES:-1 2 3 4} # which of the numbered parts below run
want() { case " $stages " in *" $1 "*) return 0 ;; esac; return 1; }
export PATH=/usr/local/cuda/bin:$PATH PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/gg-site .whl/*.whl &&
    export PYTHONPATH=/tmp/gg-site${PYTHONPATH:+:$PYTHONPATH}
fi
summary=()
# Part w's subset: a run of every allocator on every workload takes ~9 s a process, so a 10-minute
# call fits about 60 runs (e.g. GG_W_ALLOCATORS=default,gpuguard GG_W_WORKLOADS=gptbf16,gpt2).
wflags=()
[ -n "${GG_W_ALLOCATORS:-}" ] && wflags+=(--allocators "$GG_W_ALLOCATORS")
[ -n "${GG_W_WORKLOADS:-}" ] && wflags+=(--workloads "$GG_W_WORKLOADS")
note() { summary+=("$1"); echo "-- $1"; }
# With a gpuguard wheel in .whl/gg/ (the manylinux wheel the README's test command builds), the wheel is
# pip-installed into this Python environment, .pth hook and all, exactly as a user installs it, and every
# test below runs against the installed package; without one, the library is built here and used from
# the source tree.
wheel=$(ls .whl/gg/gpuguard-*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  python3 -m pip install -q --no-index --no-deps --force-reinstall "$wheel" >"$out/pip.log" 2>&1 ||
    { tail -20 "$out/pip.log"; exit 1; }
  note "installed: $(basename "$wheel") -> $(cd / && python3 -c 'import gpuguard; print(gpuguard.__file__)')"
  export GPUGUARD_TEST_INSTALLED=1
else
  b=build/gpu-torch
  if cmake -S . -B $b -DCMAKE_BUILD_TYPE=Release -DGPUGUARD_BUILD_TESTS=OFF -DGPUGUARD_BUILD_EXAMPLES=OFF \
       -DGPUGUARD_BUILD_BENCH=OFF >"$out/configure.log" 2>&1 && cmake --build $b -j "$(nproc)" >"$out/build.log" 2>&1; then
    note "build: ok"
  else
    tail -40 "$out/build.log" "$out/configure.log"
    exit 1
  fi
  export GPUGUARD_LIBRARY=$PWD/$b/libgpuguard.so PYTHONPATH=$PWD/bindings/python${PYTHONPATH:+:$PYTHONPATH}
fi

want 1 && {
# 1. the backend's tests (its own, PyTorch parity, prebuilt loads), then the binding's other PyTorch tests
timeout 900 python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_torch_native.py \
  bindings/python/tests/test_torch_native_parity.py bindings/python/tests/test_torch_prebuilt.py \
  2>&1 | tee "$out/pytest-native.log" | tail -25
note "test_torch_native: $(grep -E '[0-9]+ (passed|failed)' "$out/pytest-native.log" | tail -1)"
timeout 900 python3 -m pytest -q -rs -p no:cacheprovider bindings/python/tests/test_torch.py \
  2>&1 | tee "$out/pytest-torch.log" | tail -10
note "test_torch (use_arena, mem_pool): $(grep -E '[0-9]+ (passed|failed)' "$out/pytest-torch.log" | tail -1)"

}
want 2 && {
# 2. third-party code, unchanged, one round per allocator
steps=30
[ $quick = 1 ] && steps=10
timeout 900 python3 bench/bench_python.py --parts w --rounds 1 --steps $steps "${wflags[@]}" 2>&1 | tee "$out/thirdparty.log" | tail -40
note "third-party (bench_python w, 1 round): exit ${PIPESTATUS[0]}"

}
# 3. PyTorch's own CUDA tests, per allocator
if want 3 && [ -f .ext/test_cuda.py ]; then
  sel=${GG_TEST_CUDA_SELECT:-"memory or graph or stream or oom or pool or snapshot or fraction or cudnn or caching or allocator"}
  # A source checkout has no .pth hook: a sitecustomize.py with the .pth's line stands in for it, so
  # every Python process of the run (xdist's worker, which keeps a crash or a sticky CUDA error to one
  # replaced worker, and multiprocessing children) puts the backend in place as an installed wheel
  # does; the summary names the backend a process of the same environment ends up on.
  hook=$(mktemp -d)
  [ -n "$wheel" ] || cp bindings/python/gpuguard_torch.pth "$hook/sitecustomize.py"
  xdist=()
  python3 -c "import xdist" 2>/dev/null && xdist=(-n 1)
  for alloc in ${GG_TEST_CUDA_ALLOCS:-default gpuguard}; do
    m=0
    [ $alloc = gpuguard ] && m=1
    # gg_pytest_counters: after each test, what the backend still holds (pools, blocks, captures)
    (cd .ext && PYTHONPATH=$hook:$PWD/../scripts:$PYTHONPATH GPUGUARD_TORCH=$m GG_COUNTERS_LOG="$out_abs/counters-$alloc.log" \
       timeout "${GG_TEST_CUDA_TIMEOUT:-1500}" python3 -m pytest -q -p no:cacheprovider -p gg_pytest_counters \
       "${xdist[@]}" --timeout 300 -k "$sel" test_cuda.py -rfE 2>&1) >"$out/test_cuda-$alloc.log"
    backend=$(PYTHONPATH=$hook:$PYTHONPATH GPUGUARD_TORCH=$m python3 -c \
      'import torch; torch.empty(1, device="cuda"); print(torch.cuda.get_allocator_backend())' 2>&1 | tail -1)
    note "test_cuda.py ($alloc, backend $backend): $(grep -E '[0-9]+ (passed|failed)' "$out/test_cuda-$alloc.log" | tail -1)"
  done
  rm -rf "$hook"
  grep -h '^FAILED' "$out"/test_cuda-gpuguard.log | sed 's/ - .*//' | LC_ALL=C sort >"$out/failed-gpuguard.txt"
  if [ -f "$out"/test_cuda-default.log ]; then
    grep -h '^FAILED' "$out"/test_cuda-default.log | sed 's/ - .*//' | LC_ALL=C sort >"$out/failed-default.txt"
  else # gpuguard alone: the default's list of an earlier run of the same copy
    grep -v '^#' scripts/test_cuda-default-failed.txt >"$out/failed-default.txt"
    note "default's failures: scripts/test_cuda-default-failed.txt (not run here)"
  fi
  note "failing under gpuguard only: $(LC_ALL=C comm -13 "$out/failed-default.txt" "$out/failed-gpuguard.txt" | wc -l)"
else
  note "test_cuda.py: not run (no .ext/test_cuda.py beside the checkout)"
fi

# 4. the workload benchmark
if [ $quick = 0 ] && want 4; then
  timeout 1200 python3 bench/bench_python.py --parts w --rounds "${ROUNDS:-3}" "${wflags[@]}" 2>&1 | tee "$out/bench-w.log" | tail -60
  note "bench_python w: exit ${PIPESTATUS[0]}"
fi
echo
echo "== summary"
printf '%s\n' "${summary[@]}" | tee "$out/summary.txt"
