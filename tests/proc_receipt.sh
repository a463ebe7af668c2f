#!/usr/bin/env bash
# proc_receipt.sh — a teardown's receipt printed by proc_child is valid JSON and says what happened:
# the child ignoring SIGTERM got TERM then KILL, the others ended by TERM. Arguments: build dir, source dir.
set -euo pipefail
build=$1
command -v python3 >/dev/null || { echo "SKIP: no python3"; exit 77; }
out=$(timeout 20 "$build/tests/proc_child" receipt)
echo "$out"
printf '%s' "$out" | python3 -c '
import json, sys
d = json.load(sys.stdin)
procs = d["processes"]
assert d["alive"] == 0 and len(procs) == 3, d
assert 200 <= d["elapsed_ms"] < 1500, d["elapsed_ms"]
killed = [p for p in procs if p["sent"] == ["TERM", "KILL"]]
assert len(killed) == 1 and killed[0]["end"] == "signaled" and killed[0]["code"] == 9, procs
termed = [p for p in procs if p["sent"] == ["TERM"]]
assert len(termed) == 2 and all(p["end"] == "signaled" and p["code"] == 15 for p in termed), procs
assert any("a\"b" in p["command"] for p in procs), "quote in a command line survives escaping"
assert all(p["found"] == "tracked" and p["pid"] > 1 and p["start_time"] > 0 for p in procs)
print("receipt JSON ok: teardown took %.1f ms with a 200 ms grace" % d["elapsed_ms"])
'
