#!/usr/bin/env bash
# ops_prometheus.sh BUILD SRC — deploy/prometheus and deploy/grafana on a real Prometheus (issue 43 §3):
#  - `promtool check rules` and `promtool test rules` on the shipped rules;
#  - a Prometheus (Debian's package) on loopback, state in a temp dir, scraping `gpuguard watch --listen`
#    every second (stand-in NVML: 2 GPUs, 70 of 80 GiB used each; processes of each class), queried over
#    its HTTP API: per-GPU memory, per-class memory, the unaccounted-memory join, the recording rules;
#  - every query of the Grafana dashboard parses and returns series (so it names metrics that exist).
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
g=$build/gpuguard
for t in prometheus promtool; do
  command -v $t >/dev/null || { echo "skipped: $t missing (Debian's prometheus package; scripts/deps.sh --tests)"; exit 77; }
done
[ "$(readlink /proc/self/ns/pid)" = "pid:[4026531836]" ] || { echo "SKIP: not in the initial PID namespace"; exit 77; }
tmp=$(mktemp -d)
chmod 755 "$tmp"
keep=()
keep_pids() { local w p; for w in "$@"; do for p in $w; do keep+=("$p"); done; done; }
cleanup() { for p in "${keep[@]}"; do kill -9 "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# 1. The rules: syntax and unit tests.
promtool check rules "$src/deploy/prometheus/gpuguard.rules.yml" | grep SUCCESS
(cd "$src/deploy/prometheus" && promtool test rules gpuguard.rules.test.yml) | grep SUCCESS

# 2. Processes of each class on the stand-in NVML's two GPUs.
unset GPUGUARD_SESSION
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
export GPUGUARD_NVML_LIBRARY=$build/tests/libfake_nvml.so FAKE_NVML_COUNT=2 FAKE_NVML_MEMORY=85899345920,75161927680
cp "$src/tests/stranded_trainer.py" "$tmp/trainer.py"
setsid sh -c "python3 '$tmp/trainer.py' '$tmp/kids' 2 & echo \$! > '$tmp/trainer'"
for _ in $(seq 1 500); do [ -s "$tmp/kids" ] && break; sleep 0.02; done
[ -s "$tmp/kids" ] || fail "the trainer never started its children"
kids=$(cat "$tmp/kids")
s1=${kids%% *} s2=${kids#* }
keep_pids "$s1" "$s2" "$(cat "$tmp/trainer")"
kill -9 "$(cat "$tmp/trainer")"
setsid sh -c "nohup sleep 81 >/dev/null 2>&1 & echo \$! > '$tmp/nohup'"
"$g" run --pid-ns=off -- sh -c "echo \$\$ > '$tmp/guarded'; exec sleep 82" 2>/dev/null &
keep_pids "$!"
sleep 83 & plain=$!
keep_pids "$plain"
for _ in $(seq 1 200); do [ -s "$tmp/nohup" ] && [ -s "$tmp/guarded" ] && break; sleep 0.02; done
nh=$(cat "$tmp/nohup"); guarded=$(cat "$tmp/guarded")
keep_pids "$nh" "$guarded"
G=1073741824
export FAKE_NVML_PROCS="$s1:$((2 * G)),$nh:$((10 * G)),$guarded:$((30 * G)),$plain:$((20 * G))"
export FAKE_NVML_PROCS_1="$s2:$((3 * G))"
"$g" ps --json | python3 -c '
import json, sys
print("classes:", sorted({p["class"] for p in json.load(sys.stdin)["processes"]}))'

# 3. The exporter and a Prometheus scraping it every second, the shipped rules loaded.
"$g" watch --listen 127.0.0.1:0 2>"$tmp/watch.err" &
keep_pids "$!"
for _ in $(seq 1 250); do grep -qs "serving http://" "$tmp/watch.err" && break; sleep 0.02; done
target=$(grep -o 'http://[^ ]*/metrics' "$tmp/watch.err" | sed 's|http://||; s|/metrics||') || fail "no exporter"
port=$(free_port)
cp "$src/deploy/prometheus/gpuguard.rules.yml" "$tmp/"
cat >"$tmp/prometheus.yml" <<YML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: [gpuguard.rules.yml]
scrape_configs:
- job_name: gpuguard
  static_configs: [{targets: ["$target"]}]
YML
prometheus --config.file="$tmp/prometheus.yml" --storage.tsdb.path="$tmp/data" \
  --web.listen-address="127.0.0.1:$port" --log.level=warn >"$tmp/prom.log" 2>&1 &
keep_pids "$!"
python3 - "http://127.0.0.1:$port" "$src/deploy/grafana/gpuguard.json" "$tmp/prom.log" <<'PY'
import json, sys, time, urllib.parse, urllib.request
base, dashboard, log = sys.argv[1:]
G = 1 << 30

def q(expr, ok_empty=False):
    url = base + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    try:
        d = json.load(urllib.request.urlopen(url, timeout=10))
    except urllib.error.HTTPError as e:  # 400: the query does not parse
        sys.exit("FAIL: %s: %s" % (expr, e.read().decode()[:300]))
    return d["data"]["result"]

def wait(expr, n=1, limit=60):
    end = time.time() + limit
    while time.time() < end:
        try:
            r = q(expr)
            if len(r) >= n:
                return r
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit("FAIL: %r gave fewer than %d series within %d s\n%s" % (expr, n, limit, open(log).read()[-2000:]))

def by(r, label):
    return {s["metric"].get(label, ""): float(s["value"][1]) for s in r}

used = by(wait("gpuguard_device_memory_used_bytes", 2), "gpu")
total = by(q("gpuguard_device_memory_total_bytes"), "gpu")
assert used == {"0": 70 * G, "1": 70 * G} and total == {"0": 80 * G, "1": 80 * G}, (used, total)
print("prometheus: per-GPU memory: used %s GiB of %s GiB" % ({k: v / G for k, v in used.items()}, {k: v / G for k, v in total.items()}))
cls = by(q('gpuguard_class_memory_used_bytes{gpu="0"} > 0'), "class")
assert cls == {"stranded": 2 * G, "detached": 10 * G, "guarded": 30 * G, "unknown": 20 * G}, cls
print("prometheus: per-class memory on GPU 0 (GiB):", {k: v / G for k, v in sorted(cls.items())})
join = by(q("gpuguard_device_memory_used_bytes - on (instance, gpu) sum by (instance, gpu) (gpuguard_class_memory_used_bytes)"), "gpu")
assert join == {"0": 8 * G, "1": 67 * G}, join
print("prometheus: unaccounted join (used - sum by gpu of class memory), GiB:", {k: v / G for k, v in join.items()})
rec = by(wait("gpuguard:unaccounted_memory_bytes", 2), "gpu")
assert rec == join, (rec, join)
stranded = by(wait("gpuguard:stranded_memory_bytes", 2), "gpu")
assert stranded == {"0": 2 * G, "1": 3 * G}, stranded
ratio = by(wait("gpuguard:memory_used:ratio", 2), "gpu")
assert ratio == {"0": 0.875, "1": 0.875}, ratio
direction = by(wait("job:gpuguard_scale_direction"), "job")
assert direction == {"gpuguard": 1}, direction
print("prometheus: rules: stranded %s GiB, unaccounted = the join, ratio 0.875, scale direction %d (up)"
      % ({k: v / G for k, v in stranded.items()}, direction["gpuguard"]))
top = wait('topk(10, gpuguard_process_memory_used_bytes * on (instance, gpu, pid) group_left (user, class) gpuguard_process_info)', 5)
print("prometheus: top holders joined with their info:", sorted((s["metric"]["class"], float(s["value"][1]) / G) for s in top))
d = json.load(open(dashboard))
exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
for e in exprs:
    r = wait(e, 1, 20)  # parses (else HTTP 400) and returns series: names only metrics that exist
print("grafana: all %d queries of %d panels parse and return series" % (len(exprs), len(d["panels"])))
PY
echo "ops_prometheus: ok"
