#!/usr/bin/env bash
# cli_nvml_gpus.sh BUILD SRC — NVML is the one truth about GPUs (issue 43 item 1, issue 42 item 21),
# with the stand-in NVML on a machine where CUDA sees no GPU: every command covers every GPU NVML
# reports, numbered as nvidia-smi numbers them, whatever CUDA_VISIBLE_DEVICES says; a stranded
# worker on each GPU is listed, checked and reaped; memory no process explains is NVML's own used
# memory; -i takes a number or a UUID and a GPU that does not exist is exit 2; a failed process
# query makes ps and check fail closed (exit 1 with the reason).
set -euo pipefail
build=$1
src=$2
g="$(cd "$build" && pwd)/gpuguard"
command -v python3 >/dev/null || { echo "SKIP: needs python3"; exit 77; }
[ "$(readlink /proc/self/ns/pid)" = "pid:[4026531836]" ] || { echo "SKIP: not in the initial PID namespace"; exit 77; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
unset GPUGUARD_SESSION GPUGUARD_BACKEND FAKE_NVML_PROCS FAKE_NVML_MEMORY FAKE_NVML_FAIL_PROCS
export GPUGUARD_REGISTRY_DIR="$tmp/reg" GPUGUARD_NVML_LIBRARY="$build/tests/libfake_nvml.so"
export FAKE_NVML_COUNT=2
kids=""
cleanup() { for p in $kids; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
expect_rc() { # rc, command...
  local want=$1; shift
  set +e; "$@" >"$tmp/out" 2>"$tmp/err"; local rc=$?; set -e
  [ $rc = "$want" ] || { cat "$tmp/out" "$tmp/err"; fail "'$*' exited $rc, wanted $want"; }
}

# A crashed trainer's two spawn workers: one holds 1 GiB on GPU 0, the other 2 GiB on GPU 1.
setsid sh -c "python3 '$src/tests/stranded_trainer.py' '$tmp/kids' 2 & echo \$! > '$tmp/trainer'"
for _ in $(seq 1 500); do [ -s "$tmp/kids" ] && break; sleep 0.02; done
[ -s "$tmp/kids" ] || fail "the trainer never started its children"
kids=$(cat "$tmp/kids")
kill -9 "$(cat "$tmp/trainer")"
sleep 0.3
read -r k0 k1 <<<"$kids"
export FAKE_NVML_PROCS="$k0:1073741824" FAKE_NVML_PROCS_1="$k1:2147483648"

# More GPUs than CUDA sees (none here), in NVML's numbering, with and without CUDA_VISIBLE_DEVICES.
for cvd in unset 1 "1,0" ""; do
  if [ "$cvd" = unset ]; then unset CUDA_VISIBLE_DEVICES; else export CUDA_VISIBLE_DEVICES=$cvd; fi
  expect_rc 0 $g ps
  grep -qE "^0 +$k0 .*STRANDED" "$tmp/out" || fail "ps (CUDA_VISIBLE_DEVICES=$cvd): no worker on GPU 0: $(cat "$tmp/out")"
  grep -qE "^1 +$k1 .* 2.0 GiB .*STRANDED" "$tmp/out" || fail "ps (CUDA_VISIBLE_DEVICES=$cvd): no worker on GPU 1: $(cat "$tmp/out")"
  expect_rc 1 $g check
  grep -q "GPU 0: stranded process $k0" "$tmp/out" && grep -q "GPU 1: stranded process $k1" "$tmp/out" ||
    fail "check (CUDA_VISIBLE_DEVICES=$cvd): $(cat "$tmp/out")"
  expect_rc 0 $g reap --dry-run
  grep -q "$k0" "$tmp/out" && grep -q "$k1" "$tmp/out" || fail "reap --dry-run: $(cat "$tmp/out")"
  expect_rc 0 $g info
  grep -qE "^1 +NVIDIA Fake GPU +nvml .*GPU-fa4e0000-0000-4000-8000-000000000001" "$tmp/out" || fail "info: $(cat "$tmp/out")"
done
unset CUDA_VISIBLE_DEVICES
echo "every command covers both GPUs NVML reports, numbered as NVML numbers them"

# -i: a number or a UUID, on the tables, on check and with --json/--prom; one that does not exist
# is a usage error.
expect_rc 0 $g ps -i 1
grep -qE "^1 +$k1 " "$tmp/out" && ! grep -qE "^0 " "$tmp/out" || fail "ps -i 1: $(cat "$tmp/out")"
expect_rc 0 $g ps -i GPU-fa4e0000-0000-4000-8000-000000000001
grep -qE "^1 +$k1 " "$tmp/out" || fail "ps -i UUID: $(cat "$tmp/out")"
expect_rc 1 $g check -i gpu-FA4E0000-0000-4000-8000-000000000000
grep -q "GPU 0: stranded" "$tmp/out" && ! grep -q "GPU 1" "$tmp/out" || fail "check -i UUID: $(cat "$tmp/out")"
expect_rc 0 $g ps --json -i 1
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert [x["index"] for x in d["devices"]] == [1] and {p["device"] for p in d["processes"]} == {1}, d' "$tmp/out" ||
  fail "ps --json -i 1: $(cat "$tmp/out")"
expect_rc 0 $g info --json -i GPU-fa4e0000-0000-4000-8000-000000000001
python3 -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert [(x["index"], x["backend"]) for x in d["devices"]] == [(1, "nvml")], d' "$tmp/out" ||
  fail "info --json -i UUID: $(cat "$tmp/out")"
expect_rc 0 $g info --prom -i 1
grep -q 'gpuguard_device_info{gpu="1"' "$tmp/out" && ! grep -q 'gpu="0"' "$tmp/out" || fail "info --prom -i 1: $(cat "$tmp/out")"
expect_rc 0 $g reap --dry-run -i 1
grep -q "$k1" "$tmp/out" && ! grep -q "$k0" "$tmp/out" || fail "reap --dry-run -i 1: $(cat "$tmp/out")"
for c in "ps" "ps --json" "check" "check --json" "info" "info --json" "info --prom" "watch --count 1" "reap -n"; do
  expect_rc 2 $g $c -i 2
  expect_rc 2 $g $c -i GPU-fa4e0000-0000-4000-8000-000000000009
done
# The exporter takes -i too: the textfile then has GPU 1's series only.
expect_rc 0 $g watch --prom-file "$tmp/one.prom" -i GPU-fa4e0000-0000-4000-8000-000000000001 --count 1
grep -q 'gpuguard_device_memory_total_bytes{gpu="1"' "$tmp/one.prom" &&
  ! grep -q '{gpu="0"' "$tmp/one.prom" || fail "watch --prom-file -i UUID: $(cat "$tmp/one.prom")"
expect_rc 2 $g watch --prom-file "$tmp/none.prom" -i 2 --count 1
echo "-i N|UUID on ps, check, info, watch (view and exporter) and reap, with --json and --prom; a GPU that does not exist is exit 2"

# Memory no process explains, from NVML's own used memory: 4 GiB used on each GPU, 2 GiB listed on
# GPU 1, 1 GiB on GPU 0.
kill -9 $kids
kids=""
sleep 0.2
export FAKE_NVML_PROCS="" FAKE_NVML_PROCS_1="" FAKE_NVML_MEMORY=85899345920,4294967296
expect_rc 1 $g check --allow 3G
grep -q "GPU 0: 4.0 GiB in use that no listed process holds" "$tmp/out" &&
  grep -q "GPU 1: 4.0 GiB in use" "$tmp/out" || fail "unaccounted: $(cat "$tmp/out")"
expect_rc 0 $g check --allow 5G
expect_rc 1 $g check --json -i 1 --allow 1G
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); p = d["problems"]
assert not d["ok"] and [(x["kind"], x["device"], x["used_bytes"]) for x in p] == [("unaccounted", 1, 4294967296)], d' "$tmp/out" ||
  fail "check --json -i 1: $(cat "$tmp/out")"
unset FAKE_NVML_MEMORY
echo "memory no process explains: NVML's used memory, on every GPU"

# The process query fails: nothing can be said, so ps and check fail closed, naming the reason.
export FAKE_NVML_FAIL_PROCS=1
expect_rc 1 $g ps
grep -q "NVML running-process query failed" "$tmp/err" || fail "ps: no reason: $(cat "$tmp/err")"
expect_rc 1 $g ps --json
grep -q "NVML running-process query failed" "$tmp/err" || fail "ps --json: no reason: $(cat "$tmp/err")"
expect_rc 1 $g check
grep -q "NVML running-process query failed" "$tmp/err" && grep -q "not ok" "$tmp/err" ||
  fail "check: no reason: $(cat "$tmp/err")"
expect_rc 1 $g check --json
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert d["ok"] is False and d["unreadable"], d' "$tmp/out" ||
  fail "check --json: $(cat "$tmp/out")"
echo "a failed NVML process query: ps and check exit 1 with the reason"
