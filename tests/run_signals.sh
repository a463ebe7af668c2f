#!/usr/bin/env bash
# run_signals.sh BUILD SRC — where a signal comes from decides what `gpuguard run` does with it, in
# real process trees and a real pty, with --pid-ns=off and (where allowed) =on:
#  - Ctrl-C on the pty reaches CMD once (not again through the runner, the keeper and the init), and an
#    interactive program that survives it is not killed after --grace;
#  - a signal sent to the whole process group, or to each process of the job one by one (a control
#    group's stop), reaches CMD once; one sent to the runner alone is passed on, once;
#  - a signal CMD survives (SIGUSR1, a real-time one) starts no kill deadline;
#  - a runner started with SIGCHLD ignored still sees CMD end and reports its status;
#  - under nohup, a hangup leaves the job running, and CMD starts with SIGHUP ignored.
# CMD counts what it gets and exits 10 + that count, so a signal had twice or a SIGKILL shows.
set -euo pipefail
build=$1
unset GPUGUARD_PID_NS GPUGUARD_SESSION
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export GPUGUARD_BACKEND=host GPUGUARD_REGISTRY_DIR=$tmp/registry
exec python3 - "$build/gpuguard" "$tmp" <<'PY'
import os, pty, select, signal, subprocess, sys, time, json
g, tmp = sys.argv[1], sys.argv[2]

bad_ones = []
def fail(msg):
    sys.exit("FAIL: " + msg)
def bad(msg):  # a wrong outcome: said, and the other parts still run (each item shows on its own)
    print("FAIL: " + msg, file=sys.stderr)
    bad_ones.append(msg)

modes = ["off"]
probe = subprocess.run([g, "run", "--pid-ns=on", "--", "true"], capture_output=True)
if probe.returncode == 0:
    modes.append("on")
else:
    print("SKIP part: the --pid-ns=on runs: PID namespaces refused here:", probe.stderr.decode()[-200:])

# CMD: counts each signal in SIGS (blocked and waited for, so that queued copies are each counted),
# says "ready", lives `life` seconds, exits 10 + count.
def job(sigs, life=2.5):
    return ("import signal, sys, time\n"
            "sigs = %r\n"
            "signal.pthread_sigmask(signal.SIG_BLOCK, sigs)\n"
            "n = 0\n"
            "print('ready', flush=True)\n"
            "t = time.time() + %r\n"
            "while time.time() < t:\n"
            "    if signal.sigtimedwait(sigs, 0.02): n += 1\n"
            "print('count', n, flush=True)\n"
            "sys.exit(10 + n)\n" % ([int(s) for s in sigs], life))

def read_until(fd, word, limit=10):
    buf, end = b"", time.time() + limit
    while word not in buf:
        if time.time() > end:
            fail("no %r from the job: %r" % (word, buf[-400:]))
        r, _, _ = select.select([fd], [], [], 0.2)
        if r:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            buf += chunk
    return buf

def drain_wait(pid, fd, limit=15):
    end, out = time.time() + limit, b""
    while time.time() < end:
        p, st = os.waitpid(pid, os.WNOHANG)
        if p == pid:
            return os.waitstatus_to_exitcode(st), out
        r, _, _ = select.select([fd], [], [], 0.05)
        if r:
            try:
                out += os.read(fd, 4096)
            except OSError:
                pass
    os.kill(pid, signal.SIGKILL)
    fail("the runner did not end within %d s" % limit)

# 1 and 3. Ctrl-C on a real pty: CMD (python, which survives SIGINT here) gets it once and goes on.
for mode in modes:
  # --grace 10s: the count alone (item: once, not 2-3 times); --grace 300ms: no kill deadline either.
  for grace in ("10s", "300ms"):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(g, [g, "run", "--pid-ns=" + mode, "--grace", grace, "--", "python3", "-c",
                     job([signal.SIGINT])])
    read_until(fd, b"ready")
    time.sleep(0.3)
    os.write(fd, b"\x03")
    rc, out = drain_wait(pid, fd)
    if rc != 11:
        bad("--pid-ns=%s --grace %s: Ctrl-C: the runner exited %d, wanted 11 (CMD had SIGINT once and lived "
            "on; 12+: had it again through the runner/keeper/init; 137 or 143: ended after --grace)\n%s"
            % (mode, grace, rc, out.decode(errors="replace")[-600:]))
    # A program that does not catch it ends at once, with 128+2.
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(g, [g, "run", "--pid-ns=" + mode, "--", "sh", "-c", "echo ready; exec sleep 30"])
    read_until(fd, b"ready")
    time.sleep(0.3)
    t0 = time.time()
    os.write(fd, b"\x03")
    rc, _ = drain_wait(pid, fd)
    if rc != 130 or time.time() - t0 > 3:
        bad("--pid-ns=%s: Ctrl-C on sleep: exit %d after %.1f s, wanted 130 at once" % (mode, rc, time.time() - t0))
    print("pty --pid-ns=%s: Ctrl-C reached CMD once; a program that survives it was not killed" % mode)

# 2 and 3. A group signal, each process signalled one by one, and the runner alone: once each time;
# a real-time signal queues, so a second copy would be counted, and CMD survives it: no deadline.
rt = signal.SIGRTMIN
def start(mode, grace, extra_env=None, pre=None, cmd=None, args=()):
    env = dict(os.environ, **(extra_env or {}))
    p = subprocess.Popen([g, "run", "--pid-ns=" + mode, "--grace", grace, *args, "--"] +
                         (cmd or ["python3", "-c", job([rt, signal.SIGUSR1])]),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
                         preexec_fn=pre, env=env)
    line = p.stdout.readline()
    if b"ready" not in line:
        fail("--pid-ns=%s: the job did not start: %r %r" % (mode, line, p.stderr.read()))
    time.sleep(0.2)
    return p

def group(pgid):
    out = subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True, text=True).stdout.split()
    return [int(x) for x in out]

for mode in modes:
    # --grace 10s: how many copies arrive; --grace 300ms: a signal CMD lives through starts no deadline.
    for how, grace in (("group", "10s"), ("each", "10s"), ("runner", "10s"), ("runner", "300ms"),
                       ("usr1", "300ms"), ("group", "300ms")):
        p = start(mode, grace)
        if how == "group":
            os.killpg(p.pid, rt)
        elif how == "each":  # as a control group's stop does: every process, one after another
            for q in group(p.pid):
                os.kill(q, rt)
        elif how == "runner":
            os.kill(p.pid, rt)
        else:
            os.kill(p.pid, signal.SIGUSR1)
        try:
            out, err = p.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            bad("--pid-ns=%s %s: the runner hung" % (mode, how))
            continue
        if p.returncode != 11:
            bad("--pid-ns=%s --grace %s: a signal sent to %s: exit %d, wanted 11 (once; 12+: twice or more, "
                "137 or 143: ended after --grace though it lived on)\n%s" % (mode, grace, how, p.returncode,
                                                                          err.decode()[-600:]))
    print("--pid-ns=%s: group, one-by-one, runner-only signals each reached CMD once; no deadline" % mode)

# 5. SIGCHLD ignored by whoever started the runner: CMD's status still comes back.
for mode in modes:
    r = os.path.join(tmp, "chld-%s.json" % mode)
    try:
        p = subprocess.run([g, "run", "--pid-ns=" + mode, "--receipt", r, "--", "sh", "-c", "exit 7"],
                           preexec_fn=lambda: signal.signal(signal.SIGCHLD, signal.SIG_IGN),
                           capture_output=True, timeout=10)
    except subprocess.TimeoutExpired:
        bad("--pid-ns=%s: SIGCHLD ignored at start: the runner never saw CMD end" % mode)
        continue
    d = json.load(open(r))
    if p.returncode != 7 or d["exit"] != {"status": 7, "signal": None}:
        bad("--pid-ns=%s: SIGCHLD ignored at start: exit %d, receipt %r" % (mode, p.returncode, d["exit"]))
print("SIGCHLD ignored at start: exit 7 and the receipt says 7 (--pid-ns: %s)" % " ".join(modes))

# 6. nohup: SIGHUP ignored at start stays ignored, CMD inherits it; a hangup ends nothing.
hup_job = ("import signal, sys, time\n"
           "print('ready', signal.getsignal(signal.SIGHUP) == signal.SIG_IGN, flush=True)\n"
           "time.sleep(1.5)\n"
           "sys.exit(0)\n")
for mode in modes:
    for how in ("runner", "group"):
        p = subprocess.Popen(["nohup", g, "run", "--pid-ns=" + mode, "--grace", "300ms", "--", "python3", "-c",
                              hup_job], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        line = p.stdout.readline()
        if line.split() != [b"ready", b"True"]:
            bad("--pid-ns=%s: under nohup CMD did not start with SIGHUP ignored: %r" % (mode, line))
        time.sleep(0.2)
        if how == "runner":
            os.kill(p.pid, signal.SIGHUP)
        else:
            os.killpg(p.pid, signal.SIGHUP)
        if line.split() != [b"ready", b"True"]:
            p.kill()
            p.wait()
            continue
        out, err = p.communicate(timeout=15)
        if p.returncode != 0:
            bad("--pid-ns=%s: nohup, SIGHUP to the %s: exit %d, wanted 0\n%s" % (mode, how, p.returncode, err.decode()[-400:]))
print("nohup: CMD starts with SIGHUP ignored and a hangup ends nothing (--pid-ns: %s)" % " ".join(modes))
if bad_ones:
    sys.exit("run_signals: %d failed" % len(bad_ones))
print("run_signals: ok")
PY
