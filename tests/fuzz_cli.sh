#!/usr/bin/env bash
# fuzz_cli.sh BUILD SRC — a bounded-time fuzzer of the command line and of the library's environment
# parsing: random commands, flags, values and GPUGUARD_* garbage against the built `gpuguard`. Each run
# must end within 10 s (no hang), by exit, not by a signal (no crash), with a status in the documented
# set: 0, 1 (failure), 2 (usage), 3 for `ps` without a GPU, and for `run` 126/127 (CMD not runnable / not found) or CMD's own
# (the fuzzer's commands exit 0, 1 or 3). Paths given to --receipt, --record and --prom-file are at times
# a FIFO, a symlink to a file that must stay untouched, or a directory (refused, never a hang), and `run`
# at times starts with SIGCHLD, SIGHUP or SIGPIPE ignored by its launcher. Nothing destructive: `reap` never gets --yes, the registry is
# always a fresh directory under a temporary one. FUZZ_SECONDS (default 25) and FUZZ_SEED change it.
set -euo pipefail
build=$1
g="$build/gpuguard"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
exec python3 - "$g" "$tmp" <<'PY'
import os, random, subprocess, sys, time
g, tmp = sys.argv[1], sys.argv[2]
seed = int(os.environ.get("FUZZ_SEED", str(int(time.time()))))
budget = float(os.environ.get("FUZZ_SECONDS", "25"))
rnd = random.Random(seed)
junk = ["", "0", "1", "-1", "2", "abc", "1e3", "4294967297", "99999999999999999999", "0x10", " 3", "3 ",
        "1K", "1M", "1G", "1T", "1P", "on", "off", "yes", "no", "auto", "=", "--", "-", "é" * 40,
        "\x1b[2J", "a,b", "map:1,", "map: 3", "map:*", "map:2+", "unmap:1=nomem", "open:1", "x" * 5000,
        "/", "/etc/passwd", "/nonexistent", "%s%n%s", "600001", "600000", "3600001", "-0", "+5"]
flags = {"ps": ["--json", "--all-users", "--device", "--help", "--bogus"],
         "info": ["--json", "--prom", "--help", "-x"],
         "watch": ["--interval", "--count", "--prom-file", "--record", "--help", "--nope"],
         "reap": ["--dry-run", "--grace", "--help", "--what"],
         "run": ["--grace", "--receipt", "--device", "--pid-ns", "--pid-ns=on", "--pid-ns=auto",
                 "--pid-ns=off", "--pid-ns=x", "--help", "--zz"]}
cmds = [["true"], ["false"], ["sh", "-c", "exit 3"], ["/nonexistent"], ["/etc/passwd"], []]
env_names = ["GPUGUARD_BACKEND", "GPUGUARD_HOST_CAPACITY", "GPUGUARD_HOST_GRANULARITY", "GPUGUARD_HOST_VMM",
             "GPUGUARD_HOST_FAULT", "GPUGUARD_HOST_POPULATE", "GPUGUARD_HOST_BUSY", "GPUGUARD_SESSION",
             "GPUGUARD_REPORT", "GPUGUARD_LOG", "GPUGUARD_PID_NS", "XDG_RUNTIME_DIR"]
allowed = {0, 1, 2}
import signal
special = os.path.join(tmp, "special")
os.makedirs(os.path.join(special, "dir"))
os.mkfifo(os.path.join(special, "fifo"))
victim = os.path.join(special, "victim")
with open(victim, "w") as f:
    f.write("precious\n")
os.symlink(victim, os.path.join(special, "link"))
specials = [os.path.join(special, n) for n in ("dir", "fifo", "link")]
ignorable = [signal.SIGCHLD, signal.SIGHUP, signal.SIGPIPE, signal.SIGINT]
t_end, n, worst = time.monotonic() + budget, 0, 0.0
while time.monotonic() < t_end:
    n += 1
    sub = rnd.choice(list(flags) + ["", "bogus"])
    argv = [g] + ([sub] if sub else [])
    for _ in range(rnd.randint(0, 4)):
        f = rnd.choice(flags.get(sub, ["--help", "-h", "--x"]))
        if f == "--count" or (sub == "watch" and f == "--interval"):
            argv += [f, rnd.choice(["1", "0", "-1", "abc", "0.01", "1e9"])]
        elif f in ("--grace", "--device", "--interval", "--prom-file", "--receipt", "--record"):
            v = rnd.choice(junk)
            if f in ("--prom-file", "--receipt", "--record") and v and v not in ("-",):
                v = os.path.join(tmp, "out", v.replace("/", "_")[:100])
            if f in ("--prom-file", "--receipt", "--record") and rnd.random() < 0.3:
                v = rnd.choice(specials)
            argv += [f, v]
        else:
            argv.append(f)
    if sub == "watch" and "--count" not in argv:
        argv += ["--count", "1", "--interval", "0.01"]
    ok = set(allowed)
    if sub == "run":
        c = rnd.choice(cmds)
        argv += ["--"] + c if rnd.random() < 0.9 else c
        ok |= {3, 126, 127}
    if sub == "ps":
        ok.add(3)  # no NVIDIA GPU on this machine (`gpuguard ps --help`)
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUGUARD_")}
    env["GPUGUARD_BACKEND"] = "host"
    for name in rnd.sample(env_names, rnd.randint(0, 4)):
        env[name] = rnd.choice(junk).replace("\0", "")
    env["GPUGUARD_REGISTRY_DIR"] = os.path.join(tmp, "reg%d" % n, rnd.choice(["", "x/", "y//"]))
    ign = rnd.sample(ignorable, rnd.randint(0, 2)) if sub == "run" and rnd.random() < 0.3 else []
    pre = (lambda: [signal.signal(s, signal.SIG_IGN) for s in ign]) if ign else None
    t0 = time.monotonic()
    try:
        p = subprocess.run(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, timeout=10, preexec_fn=pre)
    except subprocess.TimeoutExpired:
        sys.exit("FAIL (seed %d): hung: %r with %r" % (seed, argv, {k: env[k] for k in env if k.startswith("GPUGUARD_")}))
    worst = max(worst, time.monotonic() - t0)
    if open(victim).read() != "precious\n":
        sys.exit("FAIL (seed %d): written through a symlink: %r" % (seed, argv))
    if not os.path.islink(specials[2]):  # replaced by a rename (--prom-file's way): fine; plant it again
        os.unlink(specials[2]) if os.path.lexists(specials[2]) else None
        os.symlink(victim, specials[2])
    if p.returncode < 0 or p.returncode not in ok:
        sys.exit("FAIL (seed %d): exit %d: %r env %r\n%s" % (seed, p.returncode, argv,
                 {k: env[k] for k in env if k.startswith("GPUGUARD_")}, p.stderr.decode(errors="replace")[-800:]))
print("fuzz_cli: %d runs in %.0f s, seed %d, slowest %.2f s: no crash, no hang, every status documented"
      % (n, budget, seed, worst))
PY
