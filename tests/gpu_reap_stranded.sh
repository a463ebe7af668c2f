#!/usr/bin/env bash
# gpu_reap_stranded.sh BUILD SRC — on a real GPU, PyTorch jobs that never ran under gpuguard: (1) a bare
# trainer with 3 torch.multiprocessing spawn children and 2 DataLoader workers (fork, holding inherited
# device descriptors), each spawn child holding 1 GiB, SIGKILLed -> `gpuguard ps` lists them STRANDED ->
# `gpuguard reap --yes` -> every byte back with the driver (polled through NVML, time from the reap);
# (2) a nohup'd job holding 1 GiB beside it is listed as detached and left alone; (3) a torchrun job of
# 2 ranks holding 1 GiB each whose agent is SIGKILLed -> ranks STRANDED -> reaped. Prints the figures.
set -euo pipefail
build=$1
g="$(cd "$build" && pwd)/gpuguard"
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then
  echo "SKIP: needs an NVIDIA GPU and nvidia-smi"; exit 77
fi
if ! python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  echo "SKIP: needs PyTorch with CUDA"; exit 77
fi
tmp=$(mktemp -d)
unset GPUGUARD_SESSION GPUGUARD_TORCH
export GPUGUARD_REGISTRY_DIR="$tmp/reg" GPUGUARD_BACKEND=cuda
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; "$g" ps --why >&2 || true; exit 1; }
used_mib() { nvidia-smi --id=0 --query-gpu=memory.used --format=csv,noheader,nounits | tr -d ' '; }
wait_file() { for _ in $(seq 1 1200); do [ -s "$1" ] && return 0; sleep 0.1; done; fail "$1 never appeared"; }
alive() { [ -d /proc/$1 ] && ! grep -q '^State:.*Z' /proc/$1/status 2>/dev/null; }
# Memory back with the driver: polls nvidia-smi until used is within 64 MiB of $1, up to 20 s; prints ms.
wait_back() {
  local base=$1 t0=$2
  for _ in $(seq 1 2000); do
    [ $(( $(used_mib) - base )) -le 64 ] && { echo $(( ($(date +%s%N) - t0) / 1000000 )); return 0; }
    sleep 0.01
  done
  return 1
}
base=$(used_mib)
echo "GPU 0 used before: $base MiB"

cat > "$tmp/hold.py" <<'PY'
import sys, time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
open(sys.argv[1], "w").write("ready"); time.sleep(600)
PY
# (2) the nohup'd job, from a shell that is gone (a user who logged out).
setsid sh -c "nohup python3 '$tmp/hold.py' '$tmp/nohup.ready' >'$tmp/nohup.log' 2>&1 & echo \$! > '$tmp/nohup.pid'"
wait_file "$tmp/nohup.ready"
nh=$(cat "$tmp/nohup.pid"); keep_pids "$nh"
after_nohup=$(used_mib)

cat > "$tmp/trainer.py" <<'PY'
import os, sys, time, torch, torch.multiprocessing as tmp
from torch.utils.data import DataLoader, Dataset
def child(i, out):
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
    open(f"{out}.{i}", "w").write(str(os.getpid())); time.sleep(600)
class Slow(Dataset):
    def __len__(self): return 1 << 20
    def __getitem__(self, i): time.sleep(600); return i
if __name__ == "__main__":
    out = sys.argv[1]
    ctx = tmp.spawn(child, args=(out,), nprocs=3, join=False)
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
    it = iter(DataLoader(Slow(), num_workers=2, multiprocessing_context="fork"))  # fork: inherits the fds
    while not all(os.path.exists(f"{out}.{i}") for i in range(3)): time.sleep(0.1)
    time.sleep(1)
    open(out, "w").write(" ".join(open(f"{out}.{i}").read() for i in range(3)))
    time.sleep(600)
PY
# (1) the bare trainer, in a session of its own whose starter exits.
setsid sh -c "python3 '$tmp/trainer.py' '$tmp/kids' & echo \$! > '$tmp/trainer.pid'"
wait_file "$tmp/kids"
trainer=$(cat "$tmp/trainer.pid"); kids=$(cat "$tmp/kids")
workers=$(pgrep -P "$trainer" -x pt_data_worker || true)
keep_pids "$trainer" "$kids" "$workers"
echo "trainer $trainer, spawn children: $kids, DataLoader workers: ${workers:-none found}"
kill -9 "$trainer"
sleep 1
"$g" ps --why | tee "$tmp/ps"
for k in $kids; do grep -Eq "^0 +$k .*STRANDED" "$tmp/ps" || fail "spawn child $k is not listed STRANDED"; done
grep -Eq "^0 +$nh .*detached" "$tmp/ps" || fail "the nohup'd job $nh is not listed detached"
tail -1 "$tmp/ps" | grep -q "STRANDED (end them with: gpuguard reap)" || fail "footer"
before_reap=$(used_mib)
t0=$(date +%s%N)
"$g" reap --yes | tee "$tmp/reap"
for k in $kids $workers; do alive $k && fail "$k survived reap"; done
alive $nh || fail "reap ended the nohup'd job"
ms=$(wait_back "$after_nohup" "$t0") || fail "memory not back: $(used_mib) MiB used, $after_nohup expected"
echo "RESULT trainer: $(( before_reap - $(used_mib) )) MiB back with the driver ${ms} ms after reap started" \
     "(used $before_reap -> $(used_mib) MiB; the nohup'd job's ~1 GiB still held: $(( $(used_mib) - base )) MiB above the start)"

# (3) torchrun whose agent is SIGKILLed.
if python3 -c "import torch.distributed.run" 2>/dev/null; then
  cat > "$tmp/rank.py" <<'PY'
import os, sys, time, torch
x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); x.fill_(1); torch.cuda.synchronize()
open(f"{sys.argv[1]}.{os.environ['LOCAL_RANK']}", "w").write(str(os.getpid())); time.sleep(600)
PY
  setsid sh -c "python3 -m torch.distributed.run --standalone --nproc-per-node=2 '$tmp/rank.py' '$tmp/rank' >'$tmp/torchrun.log' 2>&1 & echo \$! > '$tmp/agent.pid'"
  wait_file "$tmp/rank.0"; wait_file "$tmp/rank.1"
  agent=$(cat "$tmp/agent.pid"); ranks="$(cat "$tmp/rank.0") $(cat "$tmp/rank.1")"
  keep_pids "$agent" "$ranks"
  sleep 1
  before=$(used_mib)
  kill -9 "$agent"; sleep 1
  "$g" ps --why | tee "$tmp/ps2"
  for r in $ranks; do grep -Eq "^0 +$r .*STRANDED" "$tmp/ps2" || fail "rank $r is not listed STRANDED"; done
  t0=$(date +%s%N)
  "$g" reap --yes | tee "$tmp/reap2"
  for r in $ranks; do alive $r && fail "rank $r survived reap"; done
  ms=$(wait_back "$after_nohup" "$t0") || fail "torchrun: memory not back ($(used_mib) MiB used)"
  echo "RESULT torchrun: ranks $ranks stranded and reaped; $(( before - $(used_mib) )) MiB back ${ms} ms after reap started"
else
  echo "SKIP part: torch.distributed.run is not importable"
fi
"$g" check || true
kill -9 $nh
echo "gpu_reap_stranded: ok"
