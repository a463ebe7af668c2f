"""bench_scrape.py BUILD [N] — what one /metrics scrape of `gpuguard watch --listen` costs on a busy node:
N (default 200) real processes of ours holding GPU 0 through the stand-in NVML (tests/libfake_nvml.so),
scraped 40 times after a warm-up, for the default bound (--top 10), no bound (--top N) and with command
labels. Prints a table: median and 90th-percentile wall time per scrape (client side, loopback), the
answer's size and its per-process series. Figures are for reading, not asserted."""
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request


def main() -> None:
    build = os.path.abspath(sys.argv[1])
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    g = os.path.join(build, "gpuguard")
    kids = [subprocess.Popen(["sleep", "300"]) for _ in range(n)]
    tmp = tempfile.mkdtemp()
    env = dict(os.environ, GPUGUARD_BACKEND="host", GPUGUARD_REGISTRY_DIR=tmp + "/reg",
               GPUGUARD_NVML_LIBRARY=os.path.join(build, "tests", "libfake_nvml.so"), FAKE_NVML_COUNT="2",
               FAKE_NVML_PROCS=",".join("%d:%d" % (k.pid, (i + 1) << 20) for i, k in enumerate(kids)))
    rows = []
    try:
        for name, args in (("--top 10 (default)", []), ("--top %d" % n, ["--top", str(n)]),
                           ("--top 10 --command-labels", ["--command-labels"])):
            err = open(os.path.join(tmp, "err"), "w+")
            w = subprocess.Popen([g, "watch", "--listen", "127.0.0.1:0", *args], stderr=err, env=env)
            url = None
            for _ in range(500):
                err.seek(0)
                text = err.read()
                if "serving http://" in text:
                    url = text.split("serving ")[1].split()[0]
                    break
                time.sleep(0.01)
            assert url, "the exporter did not start"
            times, body = [], b""
            for i in range(45):
                t0 = time.perf_counter()
                body = urllib.request.urlopen(url, timeout=30).read()
                if i >= 5:
                    times.append((time.perf_counter() - t0) * 1e3)
            w.terminate()
            w.wait()
            per_proc = sum(1 for line in body.decode().splitlines()
                           if line.startswith(("gpuguard_process_memory_used_bytes{", "gpuguard_process_info{")))
            times.sort()
            rows.append((name, statistics.median(times), times[int(len(times) * 0.9)], len(body), per_proc))
    finally:
        for k in kids:
            k.kill()
            k.wait()
    print("scrape of %d processes on GPU 0 (stand-in NVML), %d scrapes each, loopback" % (n, 40))
    print("| exporter | median ms | p90 ms | bytes | per-process series |")
    print("|---|---:|---:|---:|---:|")
    for name, med, p90, size, per in rows:
        print("| %s | %.1f | %.1f | %d | %d |" % (name, med, p90, size, per))


if __name__ == "__main__":
    main()
