#!/usr/bin/env bash
# cli_watch.sh — `gpuguard watch` as people use it: on a pseudo-terminal (python's pty) the view fits the
# width (also after a resize), shows NVML's utilisation/temperature/power from the stand-in NVML, marks
# an orphan in red, uses the alternate screen and non-canonical input, and 'q', SIGINT or SIGTERM end it
# with the terminal settings restored; NO_COLOR and --no-color remove the colours. `watch --listen`
# answered by a real HTTP client (urllib) and parsed by prometheus_client: /metrics, 404 elsewhere,
# a silent client or an oversized request cannot stop the next scrape.
# `watch --record` and `gpuguard plot`: a timeline gpuguard.diagnostics.plot reads and draws.
# Arguments: build dir, source dir.
set -euo pipefail
# `run`'s default is --pid-ns=auto; the off design runs where a check says --pid-ns=off.
unset GPUGUARD_PID_NS
build=$1
g=$build/gpuguard
tmp=$(mktemp -d)
keep=()
# Adds to the pids killed at exit; an argument may name several, a word each (pgrep's output).
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
python3 -c 'import prometheus_client' 2>/dev/null || { echo "prometheus_client missing (scripts/deps.sh --tests installs it)"; exit 77; }
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
export GPUGUARD_NVML_LIBRARY=$build/tests/libfake_nvml.so FAKE_NVML_TELEMETRY=87,40,61,412500,700000
unset GPUGUARD_SESSION NO_COLOR COLUMNS LINES

# An orphan of a dead session: the runner (without a PID namespace, the fallback design) is SIGKILLed,
# its job's sleep lives on.
$g run --pid-ns=off -- sh -c 'sleep 68.5 & wait' &
runner=$!
keep_pids "$runner"
for _ in $(seq 1 500); do orphan=$(pgrep -f -x 'sleep 68.5' || true); [ -n "$orphan" ] && break; sleep 0.02; done
[ -n "$orphan" ] || fail "the job did not start"
keep_pids "$orphan"
kill -9 $runner; wait $runner 2>/dev/null || true
export FAKE_NVML_PROCS="$orphan:1048576"

python3 - "$g" <<'PY'
import fcntl, os, re, select, signal, struct, subprocess, sys, termios, time

g = sys.argv[1]
CSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def frames(buf):
    """The frames drawn so far: what lies between a cursor-home and the clear-to-end that ends it."""
    out = []
    for part in buf.split(b"\x1b[H")[1:]:
        if b"\x1b[J" in part:
            out.append(part.split(b"\x1b[J")[0])
    return out


def read_until(fd, buf, pred, limit=15.0):
    end = time.monotonic() + limit
    while not pred(buf):
        left = end - time.monotonic()
        assert left > 0, ("timed out", buf[-2000:])
        r, _, _ = select.select([fd], [], [], left)
        if r:
            try:
                buf += os.read(fd, 65536)
            except OSError:
                break
    return buf


def session(args, env_extra=None, cols=60, rows=30):
    m, s = os.openpty()
    fcntl.ioctl(s, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    env = dict(os.environ, TERM="xterm-256color", **(env_extra or {}))
    before = termios.tcgetattr(s)  # before the child can change anything
    p = subprocess.Popen([g, "watch", "--interval", "0.2"] + args, stdin=s, stdout=s, stderr=s, env=env)
    return p, m, s, before


def check_widths(frame, cols):
    lines = CSI.sub(b"", frame).replace(b"\r", b"").split(b"\n")
    for line in lines:
        assert len(line.decode()) <= cols, (cols, line)
    return lines


# 1. A frame fits 60 columns; NVML's readings and the orphan are there; 'q' quits and restores.
p, m, s, before = session([])
buf = read_until(m, b"", lambda b: len(frames(b)) >= 1)
assert buf.startswith(b"\x1b[?1049h"), buf[:40]  # alternate screen
assert b"\0" not in buf, "a NUL byte written to the terminal"
during = termios.tcgetattr(s)
assert not during[3] & termios.ICANON and not during[3] & termios.ECHO, during[3]
f = frames(buf)[0]
text = b"\n".join(check_widths(f, 60))
for want in (b"87%", b"40%", b"61C", b"412/700W", b"ORPHAN"):
    assert want in text, (want, text)
assert b"\x1b[1;31m" in f, "the orphan is not highlighted"
assert b"\x1b[2J" not in buf.split(b"\x1b[?1049h", 1)[1][20:], "a full-screen clear: flicker"
# A resize redraws at the new width.
fcntl.ioctl(s, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 40, 0, 0))
p.send_signal(signal.SIGWINCH)
n = len(frames(buf))
buf = read_until(m, buf, lambda b: len(frames(b)) >= n + 2)
check_widths(frames(buf)[-1], 40)
os.write(m, b"q")
assert p.wait(timeout=10) == 0
buf = read_until(m, buf, lambda b: b"\x1b[?1049l" in b)
assert buf.rstrip().endswith(b"\x1b[?25h\x1b[?1049l"), buf[-40:]
assert termios.tcgetattr(s) == before, "terminal settings not restored after q"
os.close(m), os.close(s)

# 2. SIGINT and SIGTERM end it too, with the terminal restored; NO_COLOR and --no-color: no colours.
for how, args, env in ((signal.SIGINT, [], {"NO_COLOR": "1"}), (signal.SIGTERM, ["--no-color"], {})):
    p, m, s, before = session(args, env)
    buf = read_until(m, b"", lambda b: len(frames(b)) >= 1)
    assert not re.search(rb"\x1b\[[0-9;]*m", buf), ("colour despite", args, env)
    assert b"ORPHAN" in buf
    p.send_signal(how)
    assert p.wait(timeout=10) == 0, how
    buf = read_until(m, buf, lambda b: b"\x1b[?1049l" in b)
    assert termios.tcgetattr(s) == before, ("terminal settings not restored after", how)
    os.close(m), os.close(s)
# 3. --count on a terminal: the normal screen, so the last frame stays visible; the cursor comes back.
p, m, s, before = session(["--count", "2"])
assert p.wait(timeout=10) == 0
buf = read_until(m, b"", lambda b: b.endswith(b"\x1b[?25h\r\n"))
assert b"\x1b[?1049" not in buf and len(frames(buf)) == 2, buf[:80]
assert termios.tcgetattr(s) == before
os.close(m), os.close(s)
print("watch on a pty: fits 60 and 40 columns, q/SIGINT/SIGTERM restore the terminal, --count keeps its frame")
PY

# Not a terminal: no escape sequences at all, cut to COLUMNS when it is set.
COLUMNS=50 $g watch --count 1 >"$tmp/plain.txt"
! grep -q $'\e' "$tmp/plain.txt" || fail "escape sequences written to a pipe"
awk 'length($0) > 50 { exit 1 }' "$tmp/plain.txt" || fail "a line is wider than COLUMNS"
grep -q ORPHAN "$tmp/plain.txt" || fail "no orphan in the plain view"

# A live job in a PID namespace (the default where allowed): watch shows its process by its host pid,
# guarded, next to the orphan.
if $g run --pid-ns=on -- true 2>"$tmp/ns.err"; then
  $g run --pid-ns=on -- sh -c "sleep 69.$$ & wait" 2>/dev/null & nsrun=$!
  keep_pids "$nsrun"
  for _ in $(seq 1 500); do nsjob=$(pgrep -f -x "sleep 69.$$" || true); [ -n "$nsjob" ] && break; sleep 0.02; done
  [ -n "$nsjob" ] || fail "the namespaced job did not start"
  FAKE_NVML_PROCS="$orphan:1048576,$nsjob:2097152" COLUMNS=200 $g watch --count 1 >"$tmp/ns.txt"
  kill -TERM $nsrun; wait $nsrun 2>/dev/null || true
  grep -qE "^0 +$nsjob +[0-9]+ .* 2\.0 MiB +guarded +sleep 69\.$$" "$tmp/ns.txt" ||
    { cat "$tmp/ns.txt"; fail "watch does not show the namespaced job's host pid $nsjob as guarded"; }
  grep -q ORPHAN "$tmp/ns.txt" || fail "the orphan is gone from the view"
  echo "watch: a job in a PID namespace is shown by its host pid ($nsjob), guarded"
else
  echo "SKIP part: a job in a PID namespace: refused here: $(cat "$tmp/ns.err")"
fi

# --record: JSON lines that continue across runs, read by gpuguard.diagnostics.timeline.load and drawn by
# `gpuguard plot` (python3 -m gpuguard.diagnostics.plot); a clear error when Python cannot be run.
$g watch --record "$tmp/rec.jsonl" --count 3 --interval 0.05 >/dev/null
$g watch --record "$tmp/rec.jsonl" --count 2 --interval 0.05 --prom-file "$tmp/rec.prom"
# Under a sanitizer the library cannot be loaded into python3 (its runtime would have to be preloaded):
# the timeline is then read as plain JSON lines, and not drawn.
sanitized=$(sed -n 's/^GPUGUARD_SANITIZE:[A-Z]*=//p' "$build/CMakeCache.txt" 2>/dev/null || true)
reader="from gpuguard.diagnostics.timeline import load"
[ -n "$sanitized" ] && reader='import json
def load(p):
    recs = [json.loads(l) for l in open(p)]
    return {"meta": recs[0], "samples": [r for r in recs if r["type"] == "sample"]}'
PYTHONPATH=$2/bindings/python GPUGUARD_LIBRARY=$build/libgpuguard.so python3 - "$tmp/rec.jsonl" "$reader" <<'PY'
import sys
exec(sys.argv[2])
d = load(sys.argv[1])
assert d["meta"]["series"] == ["driver_used"] and d["meta"]["start"] > 0, d["meta"]
s = d["samples"]
assert len(s) == 5 and [x["step"] for x in s] == list(range(5)), s
assert all(b["t"] >= a["t"] for a, b in zip(s, s[1:])) and all(x["driver_used"] >= 0 for x in s), s
PY
if [ -z "$sanitized" ]; then
  PYTHONPATH=$2/bindings/python $g plot "$tmp/rec.jsonl" -o "$tmp/memory.html" >"$tmp/plot.out" || fail "plot failed: $(cat "$tmp/plot.out")"
  grep -q "<svg" "$tmp/memory.html" || fail "plot wrote no chart"
fi
set +e; PATH=/nonexistent $g plot "$tmp/rec.jsonl" 2>"$tmp/plot.err"; rc=$?; set -e
[ $rc = 127 ] && grep -q "cannot run python3" "$tmp/plot.err" || fail "plot without python3: exit $rc, $(cat "$tmp/plot.err")"
set +e; PYTHONPATH=/nonexistent PYTHONNOUSERSITE=1 $g plot "$tmp/rec.jsonl" 2>"$tmp/plot.err"; rc=$?; set -e
if ! python3 -c 'import gpuguard' 2>/dev/null; then
  [ $rc = 1 ] && grep -q "pip install ./bindings/python" "$tmp/plot.err" || fail "plot without the package: exit $rc"
fi

# The exporter over HTTP.
$g watch --listen 127.0.0.1:0 2>"$tmp/listen.err" &
server=$!
keep_pids "$server"
keep_pids "$server"
for _ in $(seq 1 250); do grep -q "serving http://" "$tmp/listen.err" && break; sleep 0.02; done
url=$(grep -o 'http://[^ ]*/metrics' "$tmp/listen.err") || fail "no address on stderr: $(cat "$tmp/listen.err")"
python3 - "$url" <<'PY'
import socket, sys, urllib.error, urllib.parse, urllib.request
from prometheus_client.parser import text_string_to_metric_families

url = sys.argv[1]
host, port = urllib.parse.urlparse(url).hostname, urllib.parse.urlparse(url).port


def get(path, method="GET"):
    req = urllib.request.Request(url.replace("/metrics", path), method=method)
    try:
        with urllib.request.urlopen(req, timeout=20) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


# A client that connects and says nothing, and one that sends an endless header: neither stops others.
silent = socket.create_connection((host, port))
big = socket.create_connection((host, port))
try:
    big.sendall(b"GET /metrics HTTP/1.1\r\nX-Fill: " + b"a" * 20000)
except OSError:
    pass
for _ in range(3):  # several clients, one after another
    status, headers, body = get("/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4"), (status, headers)
    fams = {f.name: f for f in text_string_to_metric_families(body.decode("utf-8"))}
    for name in ("gpuguard_device_memory_total_bytes", "gpuguard_device_utilization_ratio",
                 "gpuguard_device_power_watts", "gpuguard_process_memory_used_bytes", "gpuguard_processes"):
        assert name in fams, (name, sorted(fams))
    for f in fams.values():
        assert f.samples, f.name
        if f.name in ("gpuguard_build_info", "gpuguard_devices", "gpuguard_scrape_collector_success"):
            continue  # not about one device
        for s in f.samples:
            assert s.labels["gpu"] == "0" and s.labels["UUID"].startswith("GPU-"), s
    assert not any(n.startswith("gpuguard_arena_") for n in fams), sorted(fams)
    assert fams["gpuguard_device_temperature_celsius"].samples[0].value == 61
big.settimeout(20)
reply = b""
try:
    while True:
        chunk = big.recv(4096)
        if not chunk:
            break
        reply += chunk
except OSError:
    pass
assert reply == b"" or reply.startswith(b"HTTP/1.1 431"), reply[:80]
silent.close(), big.close()
status, headers, page = get("/")  # a page for people, linking the metrics
assert status == 200 and headers["Content-Type"].startswith("text/html") and b'href="/metrics"' in page, page
assert get("/metric")[0] == 404 and get("/metrics/x")[0] == 404
assert get("/metrics?x=1")[0] == 200
assert get("/metrics", "POST")[0] == 405
status, headers, body = get("/metrics", "HEAD")
assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0
print("exporter: /metrics parsed with gpu/UUID on every series; 404, 405, HEAD; slow clients survived")
PY
kill -TERM $server
set +e; wait $server; rc=$?; set -e
[ $rc = 0 ] || fail "the exporter exited $rc on SIGTERM"
$g watch --listen 127.0.0.1:0 --count 2 2>"$tmp/listen2.err" &
server=$!
keep_pids "$server"
keep_pids "$server"
for _ in $(seq 1 250); do grep -q "serving http://" "$tmp/listen2.err" && break; sleep 0.02; done
url=$(grep -o 'http://[^ ]*/metrics' "$tmp/listen2.err")
python3 -c 'import sys,urllib.request as u; [u.urlopen(sys.argv[1], timeout=20).read() for _ in range(2)]' "$url"
set +e; wait $server; rc=$?; set -e
[ $rc = 0 ] || fail "--count 2 with --listen: exited $rc"
set +e; $g watch --listen '[::1' 2>"$tmp/bad.err"; rc=$?; set -e
[ $rc = 2 ] && grep -q "in brackets" "$tmp/bad.err" || fail "a bad --listen is not explained"
echo "cli_watch: ok"
