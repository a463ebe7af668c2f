#!/usr/bin/env bash
# bench_python_dry.sh — bench/bench_python.py part w without torch (--dry: made-up results): every run
# of every allocator is reported, each workload gets its table (with the host's queuing time) and a
# verdict line, gpuguard's traces are written with a step mark after each step, and bad flags are
# refused with exit 2 and a message. Arguments: build dir, source dir.
set -euo pipefail
src=$2
py=$(command -v python3) || { echo "SKIP: no python3"; exit 77; }
bench="$src/bench/bench_python.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$py" "$bench" --parts w --dry --rounds 3 --workloads gpt2,gptbf16 --trace "$tmp/tr" >"$tmp/out" 2>&1 ||
  { cat "$tmp/out"; fail "the dry run exited $?"; }
for w in gpt2 gptbf16; do
  for a in "PyTorch default" expandable_segments cudaMallocAsync gpuguard; do
    n=$(grep -c "^  run [123]: $w .*$a .*median .* ms (queued in" "$tmp/out" || true)
    [ "$n" = 3 ] || { cat "$tmp/out"; fail "$w / $a: $n runs reported, not 3"; }
    row=$(grep "^| $a | " "$tmp/out" | sed -n "$([ $w = gpt2 ] && echo 1 || echo 2)p")
    [ "$(echo "$row" | cut -d'|' -f3 | tr -cd '/' | wc -c)" = 2 ] ||
      fail "$w / $a: the table row does not list 3 runs: $row"
  done
  grep -q "^## (w) $w: " "$tmp/out" || fail "no table for $w"
  grep -q "^$w: step <= 1.00x default \(met\|NOT met\), step <= expandable_segments" "$tmp/out" ||
    fail "no verdict line for $w"
  for r in 1 2 3; do
    t="$tmp/tr/$w-r$r.trace.gz"
    [ -s "$t" ] || fail "no trace $t"
    steps=$(gzip -dc "$t" | grep -c '^# step' || true)
    [ "$steps" -ge 30 ] || fail "$t has $steps step marks, not one a step (30)"
  done
done
grep -q "host done queuing the step (ms)" "$tmp/out" || fail "no queuing column"

refused() { # expected message, flags...
  local want=$1
  shift
  set +e
  "$py" "$bench" --parts w --dry "$@" >"$tmp/bad" 2>&1
  local rc=$?
  set -e
  [ $rc = 2 ] || { cat "$tmp/bad"; fail "$* exited $rc, not 2"; }
  grep -q "$want" "$tmp/bad" || { cat "$tmp/bad"; fail "$*: no '$want' in the message"; }
}
refused "unknown workload" --workloads gpt2,nosuch
refused "unknown allocator" --allocators default,nosuch
refused "not auto, none or a list" --cpus 1,x
echo "bench_python part w (dry): 2 workloads x 4 allocators x 3 runs, tables, verdicts, traces; bad flags refused"
