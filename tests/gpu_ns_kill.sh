#!/usr/bin/env bash
# gpu_ns_kill.sh BUILD SRC — on a real GPU: workers holding device memory run under
# `gpuguard run --pid-ns=on` (plain background processes and a setsid'd one: no death signal of their
# own), the runner is SIGKILLed, and the script prints the milliseconds until NVML lists none of them
# and the device's free memory is back (gpu_hold killwatch polls NVML every 1 ms), beside the floor:
# the same workers SIGKILLed directly. Then the same with torchrun on 2 GPUs when there are 2 and
# PyTorch is installed (an NCCL all_reduce first, so NCCL inside the namespace is exercised).
# Exits 77 without a GPU or where PID namespaces are refused.
set -euo pipefail
build=$1 # $2, the source tree, is not needed here
g=$build/gpuguard
hold=$build/tests/gpu_hold
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIP: needs an NVIDIA GPU"; exit 77; fi
"$g" run --pid-ns=on -- true 2>/dev/null || { echo "SKIP: PID namespaces refused here"; exit 77; }
tmp=$(mktemp -d)
export GPUGUARD_REGISTRY_DIR=$tmp/registry GPUGUARD_BACKEND=cuda
unset GPUGUARD_SESSION
# A failure must not leave workers behind: they would hold the GPU and ctest's output pipe.
trap 'pkill -9 -f "^$hold hold 1600" || true; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >&2 || true; exit 1; }
free_mib() { nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | sed -n "$(( ${1:-0} + 1 ))p"; }
apps() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | grep -c . || true; }

# Measures one runner: waits for `ready` lines, SIGKILLs it, polls NVML every 1 ms.
measure() { # name runner-pid ready-file lines-wanted base-free-mib [device]
  local name=$1 runner=$2 ready=$3 want=$4 base=$5 dev=${6:-0}
  local got
  ready_n() { got=$(grep -c ready "$ready" 2>/dev/null || true); echo "${got:-0}"; }
  for _ in $(seq 1 1200); do [ "$(ready_n)" -ge "$want" ] && break; sleep 0.1; done
  [ "$(ready_n)" -ge "$want" ] || fail "$name: the workers never became ready"
  echo "$name: holding $(( base - $(free_mib "$dev") )) MiB in $(apps) processes"
  "$g" ps || true
  got=$("$hold" killwatch "$runner" "$dev" $((base - 64))) || fail "$name: still held 10 s after the runner's SIGKILL ($got)"
  read -r _ t_apps t_mem <<< "$got"
  echo "$name: SIGKILL -> NVML lists no process after ${t_apps} ms, free memory back after ${t_mem} ms"
}

# 0. The floor: the same three workers SIGKILLed directly, all at once (one process group), and one
#    alone; no runner involved. What the driver itself takes to tear their contexts down.
base=$(free_mib)
setsid sh -c "$hold hold 1600 >> $tmp/ready0 & $hold hold 1600 >> $tmp/ready0 & $hold hold 1600 >> $tmp/ready0 & wait" &
floor=$!
measure "floor: 3 workers SIGKILLed directly" "-$floor" "$tmp/ready0" 3 "$base"
wait $floor 2>/dev/null || true
base=$(free_mib)
"$hold" hold 1600 >> "$tmp/ready00" &
measure "floor: 1 worker SIGKILLed directly" $! "$tmp/ready00" 1 "$base"

# 1. Three workers of 1600 MiB each, one of them setsid'd (a daemon), none with a death signal. (With
#    --pid-ns=off the runner's SIGKILL leaves them as orphans until `gpuguard reap`: the design limit
#    the namespace removes.)
base=$(free_mib)
"$g" run --pid-ns=on -- sh -c "
  $hold hold 1600 >> $tmp/ready1 &
  $hold hold 1600 >> $tmp/ready1 &
  setsid $hold hold 1600 >> $tmp/ready1 &
  wait" &
measure "spawned workers" $! "$tmp/ready1" 3 "$base"

# 2. torchrun on 2 GPUs, NCCL all_reduce, then each rank holds 1600 MiB.
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ] && python3 -c "import torch, torch.distributed" 2>/dev/null; then
  cat > "$tmp/ranks.py" <<'PY'
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("nccl")
rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(rank)
x = torch.ones(1 << 20, device="cuda"); dist.all_reduce(x); assert x[0].item() == dist.get_world_size()
hold = torch.empty(1600 << 20, dtype=torch.uint8, device="cuda"); hold.fill_(1); torch.cuda.synchronize()
with open(sys.argv[1], "a") as f: print("ready", os.getpid(), flush=True, file=f)
time.sleep(3600)
PY
  base0=$(free_mib 0)
  "$g" run --pid-ns=on -- torchrun --standalone --nproc_per_node=2 "$tmp/ranks.py" "$tmp/ready2" &
  measure "torchrun 2 GPUs (device 0)" $! "$tmp/ready2" 2 "$base0" 0
else
  echo "torchrun part skipped: needs 2 GPUs and PyTorch"
fi
echo ok
