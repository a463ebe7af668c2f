#!/usr/bin/env bash
# run_receipt.sh BUILD SRC — files the CLI writes by path: `run --receipt` replaces the receipt in one
# rename (a hard link to the old one keeps the old text), removes the old receipt when the job starts
# (a SIGKILLed runner leaves none, never the previous run's), exits with CMD's status when the receipt
# cannot be written, and holds the start error when CMD cannot start; a symlink, a FIFO or a directory
# as --receipt (or as `watch --record`) is refused at once, and the file it names is left alone.
set -euo pipefail
build=$1
g=$build/gpuguard
unset GPUGUARD_PID_NS GPUGUARD_SESSION
tmp=$(mktemp -d)
runner=
cleanup() { [ -z "$runner" ] || kill -9 "$runner" 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
failed=0
bad() { echo "FAIL: $*" >&2; failed=$((failed + 1)); }

# 1. Replaced atomically: the old receipt's inode keeps the old text (a reader mid-write sees one or
# the other, never a mix), and the new one is this run's.
echo '{"old":true}' >"$tmp/r.json"
ln "$tmp/r.json" "$tmp/old-link.json"
set +e; $g run --receipt "$tmp/r.json" -- sh -c 'exit 3' 2>/dev/null; rc=$?; set -e
[ $rc = 3 ] || bad "run exited $rc, wanted 3"
grep -q '"old":true' "$tmp/old-link.json" || bad "the receipt was rewritten in place (the old inode changed)"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["exit_code"]==3, d' "$tmp/r.json" ||
  bad "the new receipt is not this run's"
[ "$(stat -c %a "$tmp/r.json")" = "$(printf '%o' $((0644 & ~0$(umask))))" ] || bad "receipt mode $(stat -c %a "$tmp/r.json")"
! compgen -G "$tmp/.r.json.*" >/dev/null || bad "a temporary file was left: $(ls -A "$tmp")"
echo "receipt: replaced by rename, mode as umask says, no temporary left"

# 2. A SIGKILLed runner leaves no receipt: not the previous run's, not an empty file.
echo '{"old":true}' >"$tmp/k.json"
$g run --receipt "$tmp/k.json" -- sleep 30 2>/dev/null &
runner=$!
for _ in $(seq 1 200); do [ -e "$tmp/k.json" ] || break; sleep 0.02; done
sleep 0.2
kill -9 $runner
wait $runner 2>/dev/null || true
runner=
[ ! -e "$tmp/k.json" ] || bad "a SIGKILLed runner left a receipt: $(head -c 100 "$tmp/k.json")"
echo "receipt: a SIGKILLed runner left none (the old one went when the job started)"

# 3. The receipt cannot be written (a file size limit of 0: every write fails): the run still exits
# with CMD's status and says why; nothing half-written is left at the path.
set +e
# (stderr through a pipe: the limit would stop a file too)
ferr=$( (ulimit -f 0; trap '' XFSZ; exec $g run --receipt "$tmp/f.json" -- sh -c 'exit 5') 2>&1 >/dev/null); rc=$?
set -e
echo "$ferr" >"$tmp/f.err"
[ $rc = 5 ] || bad "a receipt that cannot be written: run exited $rc, wanted CMD's 5"
grep -q "could not be written" "$tmp/f.err" || bad "no word on the failed receipt: $(cat "$tmp/f.err")"
[ ! -s "$tmp/f.json" ] || bad "a partial receipt was left"
echo "receipt: a failed write keeps CMD's status (5) and says so"

# 4. Not a regular file: refused at once (exit 2), nothing written through it, no hang on a FIFO.
echo "precious" >"$tmp/victim"
ln -s "$tmp/victim" "$tmp/link.json"
mkfifo "$tmp/fifo.json"
mkdir "$tmp/dir.json"
for p in link.json fifo.json dir.json; do
  set +e; timeout 10 $g run --receipt "$tmp/$p" -- true 2>"$tmp/p.err"; rc=$?; set -e
  [ $rc = 2 ] || bad "--receipt $p: exit $rc, wanted 2 (124: it hung)"
  grep -q "not a regular file" "$tmp/p.err" || bad "--receipt $p: $(cat "$tmp/p.err")"
done
[ "$(cat "$tmp/victim")" = precious ] || bad "--receipt wrote through a symlink: $(head -c 80 "$tmp/victim")"
[ -L "$tmp/link.json" ] && [ -p "$tmp/fifo.json" ] || bad "--receipt replaced what it refused"
for p in link.json fifo.json dir.json; do
  set +e; timeout 10 $g watch --record "$tmp/$p" --count 1 --interval 0.05 >/dev/null 2>"$tmp/w.err"; rc=$?; set -e
  [ $rc = 1 ] || bad "watch --record $p: exit $rc, wanted 1 (124: it hung)"
  grep -q "not a regular file\|Is a directory" "$tmp/w.err" || bad "watch --record $p: $(cat "$tmp/w.err")"
done
[ "$(cat "$tmp/victim")" = precious ] || bad "watch --record wrote through a symlink"
$g watch --record "$tmp/ok.jsonl" --count 1 --interval 0.05 >/dev/null
grep -q '"type":"meta"' "$tmp/ok.jsonl" || bad "watch --record to a new file wrote no timeline"
echo "receipt and --record: a symlink, a FIFO, a directory refused at once; the victim untouched"
# 5. A command that cannot start (not found: 127; not runnable: 126) still gets a receipt, with the
# start error, in place of the old one.
printf '#!/bin/sh\n' >"$tmp/noexec"
chmod 644 "$tmp/noexec"
for c in "$tmp/no-such-program:127" "$tmp/noexec:126"; do
  echo '{"old":true}' >"$tmp/s.json"
  set +e; $g run --pid-ns=off --receipt "$tmp/s.json" -- "${c%:*}" 2>/dev/null; rc=$?; set -e
  [ "$rc" = "${c##*:}" ] || bad "run -- ${c%:*}: exit $rc, wanted ${c##*:}"
  if [ ! -s "$tmp/s.json" ]; then
    bad "run -- ${c%:*}: no receipt after a failed start"
  else
    python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["exit_code"]==int(sys.argv[2]) and d["exit"] is None and d["start_error"] and d["teardown"] is None, d' \
      "$tmp/s.json" "${c##*:}" || bad "run -- ${c%:*}: the receipt is not the failed start's: $(cat "$tmp/s.json")"
  fi
done
echo "receipt: a command that cannot start gets one, with the start error"
[ $failed = 0 ] || { echo "run_receipt: $failed failed"; exit 1; }
echo "run_receipt: ok"
