#!/usr/bin/env bash
# proc_example.sh — examples/workers is SIGKILLed; every worker (fork+exec and fork-only) is gone
# within 1 s, and only its registry record (stale) stays behind. Arguments: build dir, source dir.
set -euo pipefail
build=$1
exe="$build/examples/workers"
[ -x "$exe" ] || { echo "SKIP: examples not built"; exit 77; }
reg=$(mktemp -d)
trap 'rm -rf "$reg"' EXIT
chmod 700 "$reg"
out=$(mktemp -p "$reg")
GPUGUARD_REGISTRY_DIR="$reg" "$exe" >"$out" &
trainer=$!
for _ in $(seq 1000); do grep -q workers "$out" && break; sleep 0.01; done
read -r _ tpid _ w1 w2 w3 <"$out"
[ "$tpid" = "$trainer" ]
[ -f "$reg/$trainer.rec" ]
alive() { [ -d "/proc/$1" ] && ! grep -q '^State:.*Z' "/proc/$1/status" 2>/dev/null; }
for p in $w1 $w2 $w3; do alive "$p"; done
kill -9 "$trainer"
wait "$trainer" 2>/dev/null || true
start=$(date +%s%N)
for _ in $(seq 500); do
  left=0
  for p in $w1 $w2 $w3; do alive "$p" && left=$((left + 1)); done
  [ $left -eq 0 ] && break
  sleep 0.002
done
ms=$(( ($(date +%s%N) - start) / 1000000 ))
echo "workers gone ${ms} ms after kill -9 of the trainer (bound 1000 ms); left: $left"
[ $left -eq 0 ] && [ $ms -lt 1000 ]
