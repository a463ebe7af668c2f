#!/usr/bin/env bash
# gpu_run_job.sh — on a real GPU, with PyTorch: (1) `gpuguard run` a trainer whose spawn-method workers
# each hold 1 GiB, SIGKILL the trainer: nothing is left and the receipt shows the device's free memory
# back; (2) SIGKILL the runner itself: the workers survive as orphans of a dead session, `gpuguard ps`
# shows them as ORPHAN until `gpuguard reap --yes` ends them and the memory comes back.
# Both with --pid-ns=off: the design without a PID namespace (the fallback where namespaces are refused;
# the job's pids in the ready files are host pids only then). gpu_ns_kill.sh covers the namespace.
# Arguments: build dir, source dir.
set -euo pipefail
build=$1 src=$2
g=$build/gpuguard
if ! command -v nvidia-smi >/dev/null || ! nvidia-smi -L >/dev/null 2>&1; then echo "SKIP: needs an NVIDIA GPU"; exit 77; fi
if ! python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then echo "SKIP: needs PyTorch with CUDA"; exit 77; fi
tmp=$(mktemp -d)
export GPUGUARD_REGISTRY_DIR=$tmp/registry GPUGUARD_BACKEND=cuda
fail() { echo "FAIL: $*" >&2; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader >&2 || true; exit 1; }
free_mib() { nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1; }
holders() { nvidia-smi --query-compute-apps=pid --format=csv,noheader | tr -d ' ' | grep -xF -f <(tr ' ' '\n' < "$1") || true; }
wait_file() { for _ in $(seq 1 1200); do [ -f "$1" ] && return 0; sleep 0.1; done; fail "job never became ready"; }
ms() { date +%s%3N; }

base=$(free_mib)
echo "device free memory before: $base MiB"

# 1. The trainer is SIGKILLed under `gpuguard run`: the runner ends its workers.
$g run --pid-ns=off --grace 2s --receipt "$tmp/r1.json" -- python3 "$src/tests/gpu_job.py" "$tmp/ready1" &
runner=$!
wait_file "$tmp/ready1"
echo "job 1 holds: $(( base - $(free_mib) )) MiB (trainer + 3 workers: $(cat "$tmp/ready1"))"
trainer=$(cut -d' ' -f1 "$tmp/ready1")
t0=$(ms)
kill -9 "$trainer"
set +e; wait $runner; rc=$?; set -e
t_run=$(( $(ms) - t0 ))
[ $rc = 137 ] || fail "runner exited $rc, wanted 137 (the trainer's SIGKILL)"
for _ in $(seq 1 100); do [ -z "$(holders "$tmp/ready1")" ] && break; sleep 0.05; done
[ -z "$(holders "$tmp/ready1")" ] || fail "still holding GPU memory: $(holders "$tmp/ready1")"
t_gone=$(( $(ms) - t0 ))
python3 - "$tmp/r1.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
t = d["teardown"]; dev = d["device"]
print(f"receipt: exit {d['exit']}, {len(t['processes'])} processes, alive {t['alive']}, "
      f"free before {dev['free_bytes_before'] >> 20} MiB, after {dev['free_bytes_after'] >> 20} MiB "
      f"(waited {dev['free_after_wait_ms']} ms)")
assert t["alive"] == 0 and d["exit"]["signal"] == 9, d
assert dev["free_bytes_after"] + (64 << 20) >= dev["free_bytes_before"], dev
PY
echo "job 1: runner done ${t_run} ms after the SIGKILL; no holder left after ${t_gone} ms; free now $(free_mib) MiB"

# 2. The runner itself is SIGKILLed: the workers outlive it, holding a dead session's memory.
$g run --pid-ns=off -- python3 "$src/tests/gpu_job.py" "$tmp/ready2" &
runner=$!
wait_file "$tmp/ready2"
kill -9 $runner
wait $runner 2>/dev/null || true
sleep 1 # the trainer dies with its runner (death signal); its workers do not
workers=$(cut -d' ' -f2- "$tmp/ready2")
$g ps | tee "$tmp/ps"
for w in $workers; do
  [ -d /proc/$w ] || fail "worker $w died with its parent: nothing to reap (the trap did not spring)"
  grep -qE "^0 +$w .*ORPHAN" "$tmp/ps" || fail "worker $w not shown as ORPHAN"
done
$g reap --dry-run
t0=$(ms)
$g reap --yes --grace 1s
for _ in $(seq 1 100); do [ -z "$(holders "$tmp/ready2")" ] && break; sleep 0.05; done
[ -z "$(holders "$tmp/ready2")" ] || fail "reap left holders: $(holders "$tmp/ready2")"
for _ in $(seq 1 100); do [ "$(free_mib)" -ge $((base - 64)) ] && break; sleep 0.05; done
echo "job 2: orphans reaped; memory back after $(( $(ms) - t0 )) ms: free $(free_mib) MiB (before: $base MiB)"
[ "$(free_mib)" -ge $((base - 64)) ] || fail "memory did not come back"
rm -rf "$tmp"
echo "gpu_run_job: ok"
