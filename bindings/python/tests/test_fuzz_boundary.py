"""A bounded fuzzer of the Python boundary: random types and values into every public function of the
gpuguard package and every public method of its objects (Arena, Allocation, ArenaScope, Guard, Monitor,
Recorder, Holders). Each call may only return or raise a documented exception (GpuGuardError and its
subclasses, TypeError, ValueError); the interpreter must not crash (it runs in a child process, judged
from outside), and at the end nothing may be left: no descriptor, no thread, no child process, no
arena memory beyond what the fuzzer still holds. FUZZ_SECONDS (default 4) and FUZZ_SEED change it.

Nothing is signalled that the fuzzer did not start: a pid argument is only ever out of range, of the
wrong type, or the pid of the fuzzer's own sleeping child."""
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

FUZZER = r'''
import gc, inspect, math, os, random, signal, subprocess, sys, threading, time
import gpuguard
from gpuguard import GpuGuardError
from gpuguard.diagnostics import holding, notebook, timeline

seed, budget = int(sys.argv[1]), float(sys.argv[2])
trace = open("calls.log", "w")  # the call in progress, should one hang (the test shows the last lines)
import faulthandler
faulthandler.dump_traceback_later(budget + 60, exit=True)
rnd = random.Random(seed)


def thread_died(a):  # a sampling thread that dies of its arguments is a failure too
    print(f"FAIL (seed {seed}): thread {a.thread.name} died: {a.exc_type.__name__}: {a.exc_value}", flush=True)
    os._exit(5)


threading.excepthook = thread_died
ALLOWED = (GpuGuardError, TypeError, ValueError)
sleeper = subprocess.Popen(["sleep", "600"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
own = sleeper.pid


def fds():
    return sorted(int(x) for x in os.listdir("/proc/self/fd"))


def kids():
    out = []
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                with open(f"/proc/{p}/stat") as f:
                    if int(f.read().rsplit(")", 1)[1].split()[1]) == os.getpid():
                        out.append(int(p))
            except (OSError, ValueError, IndexError):
                pass
    return out


INTS = [0, -1, 2, 255, 256, 4096, 1 << 20, 2**31 - 1, 2**31, 2**32, 2**32 + 5, 2**63, 2**64, 2**64 + 5,
        -2**63, -2**64]
OTHER = [None, True, False, 0.0, 1.5, -0.5, math.nan, math.inf, -math.inf, "", "x", "host", "cuda", "on", "off",
         "auto", "\0", "a\0b", "\u00e9\U0001F600", "a" * 300, "json:none", "none", b"", b"x", b"\0", bytearray(b"x"),
         [], [""], ["/nonexistent/gg-fuzz"], ["true"], [1, 2], [b"\0"], {}, {"A": "b"}, {"A": 1}, {1: "b"}, (1, 2),
         object(), (lambda: None), print, sys, type, Exception, 1j]
PIDS = [own, -1, 0, 2**31, 2**32 + own, 2**64 + own, -2**63, str(own), float(own), None, True, [own]]


def value(name):
    if name in ("pid",):
        return rnd.choice(PIDS)
    if name in ("interval",) and rnd.random() < 0.5:
        return rnd.choice([0, -1, math.nan, math.inf, 0.05, "1", None, 1e-9, 2**64, 1e300])
    if name in ("to",) and rnd.random() < 0.7:
        # (no http:// sinks: the endpoint's own tests cover them; a fuzzer must not bind ports)
        return rnd.choice([None, [], "x.jsonl", ["x.jsonl"], 5, [5], "m.prom", ["x.jsonl", 5], object()])
    if name in ("path", "leak_report", "file") and rnd.random() < 0.5:
        return rnd.choice(["fuzz.out", "", "/nonexistent/dir/x", ".", "json:fuzz.out", 5, None, b"x"])
    pool = rnd.choice((INTS, OTHER, OTHER))
    return rnd.choice(pool + extra)


extra = []  # live objects of the package, passed as arguments too
made = []   # what calls returned: closed or stopped at the end of each round


def closer(o):
    for m in ("close", "stop"):
        f = getattr(o, m, None)
        if callable(f) and not isinstance(o, type):
            try:
                f()
            except ALLOWED:
                pass
            return


def call(fn, label):
    try:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD,
                                                                      p.KEYWORD_ONLY)]
    except (TypeError, ValueError):
        params = []
    args, kwargs = [], {}
    for p in params:
        if rnd.random() < 0.35 and p.default is not p.empty:
            continue
        v = value(p.name)
        if p.kind == p.KEYWORD_ONLY or rnd.random() < 0.5:
            kwargs[p.name] = v
        elif not kwargs:
            args.append(v)
        else:
            kwargs[p.name] = v
    if rnd.random() < 0.05:
        args.append(value("extra"))  # one too many
    desc = f"{label}(*{args!r}, **{kwargs!r})"
    trace.write(desc[:400] + "\n")
    trace.flush()
    given = list(args) + list(kwargs.values())

    def judge(e, what):
        if isinstance(e, ALLOWED):
            return
        # A file that cannot be opened where a path was given: Python's own OSError, as open() says.
        if isinstance(e, OSError) and any(isinstance(v, (str, bytes)) or
                                          (isinstance(v, (list, tuple)) and any(isinstance(x, str) for x in v))
                                          for v in given):
            return
        print(f"FAIL (seed {seed}): {what}{desc} raised {type(e).__name__}: {e}", flush=True)
        sleeper.kill()
        os._exit(3)

    try:
        out = fn(*args, **kwargs)
    except BaseException as e:
        judge(e, "")
        return None
    if out is not None and hasattr(out, "__enter__") and rnd.random() < 0.5:
        try:
            with out:
                pass
        except BaseException as e:
            judge(e, "with ")
    made.append(out)
    return out


SKIP = {"load_ipython_extension", "unload_ipython_extension"}  # take a shell: fuzzed through notebook below
mod_funcs = [(n, getattr(gpuguard, n)) for n in gpuguard.__all__ if callable(getattr(gpuguard, n))
             and not (isinstance(getattr(gpuguard, n), type) and issubclass(getattr(gpuguard, n), BaseException))
             and n not in SKIP]


def methods(obj, label):
    out = []
    for n in dir(obj):
        if n.startswith("_") or n in ("close", "stop"):
            continue
        try:
            f = getattr(obj, n)
        except ALLOWED:
            continue
        if callable(f) and not isinstance(f, type):
            out.append((f"{label}.{n}", f))
    return out


def one_round(calls):
    arena = gpuguard.Arena(backend="host", capacity=32 << 20)
    block = arena.alloc(4096, tag="fuzz")
    guard = gpuguard.Guard(backend="host", leak_report="none", run_at_exit=False)
    rec = timeline.Recorder()
    ext = notebook._Extension(shell=None)
    ext.read = lambda: {"in_use": 0, "used": 0, "total": 0}
    extra[:] = [arena, block, guard, arena.scope(), rec]
    targets = (mod_funcs + methods(arena, "Arena") + methods(block, "Allocation") +
               methods(arena.scope(), "ArenaScope") + methods(guard, "Guard") + methods(rec, "Recorder") +
               methods(holding.holders(top=2), "Holders") +
               [("notebook.magic", ext.magic), ("Guard.cancel", guard.cancel), ("Arena.scope", arena.scope)])
    for _ in range(calls):
        label, fn = rnd.choice(targets)
        call(fn, label)
    for o in reversed(made):
        closer(o)
    made.clear()
    extra.clear()
    closer(rec)
    ext._stop_watch()
    guard.close()
    arena.close()
    try:
        gpuguard.teardown(grace_ms=200)  # whatever spawn() started
    except ALLOWED:
        pass



# A first round makes what the library makes once per process (its threads' pipes, the spawn thread):
# the baseline is taken after it, so what is left at the end is what the fuzzing leaked.
one_round(10)
gc.collect()
base_fds, base_threads = fds(), threading.active_count()
t_end, n = time.monotonic() + budget, 0
while time.monotonic() < t_end:
    one_round(40)
    n += 40

# Nothing left: descriptors, threads (monitors, recorders, watchers), child processes.
gc.collect()
deadline = time.monotonic() + 5
while time.monotonic() < deadline and threading.active_count() > base_threads:
    time.sleep(0.05)
left_kids = [k for k in kids() if k != own]
sleeper.kill()
sleeper.wait()
extra_fds = sorted(set(fds()) - set(base_fds))
if threading.active_count() > base_threads:
    print(f"FAIL (seed {seed}): threads left: {[t.name for t in threading.enumerate()]}", flush=True)
    os._exit(4)
if extra_fds:
    print(f"FAIL (seed {seed}): descriptors left: " +
          ", ".join(f"{fd}->{os.readlink(f'/proc/self/fd/{fd}') if os.path.exists(f'/proc/self/fd/{fd}') else '?'}"
                    for fd in extra_fds), flush=True)
    os._exit(4)
if left_kids:
    print(f"FAIL (seed {seed}): child processes left: {left_kids}", flush=True)
    os._exit(4)
print(f"fuzz_boundary: {n} calls in {budget:.0f} s, seed {seed}: only documented exceptions, nothing left")
'''


def test_fuzz_the_python_boundary(tmp_path):
    seed = int(os.environ.get("FUZZ_SEED", str(int(time.time()))))
    budget = os.environ.get("FUZZ_SECONDS", "4")
    env = dict(os.environ, GPUGUARD_REGISTRY_DIR=str(tmp_path / "registry"))
    if os.environ.get("GPUGUARD_TEST_INSTALLED") != "1":  # else the installed package, as conftest says
        env["PYTHONPATH"] = os.path.dirname(HERE)
    out = tmp_path / "fuzz.out"
    with open(out, "w") as f:  # a file, not a pipe: a child that outlives the fuzzer cannot hold it open
        try:
            rc = subprocess.run([sys.executable, "-c", FUZZER, str(seed), budget], cwd=tmp_path, stdout=f,
                                stderr=subprocess.STDOUT, timeout=float(budget) + 120, env=env).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout (a call hung)"
    calls = (tmp_path / "calls.log").read_text().splitlines() if (tmp_path / "calls.log").exists() else []
    text = out.read_text()
    tail = text[-3000:] + "\nlast calls:\n" + "\n".join(calls[-5:])

    class r:
        returncode, stdout = rc, text
    assert r.returncode == 0, f"exit {r.returncode} (negative: killed by a signal, a crash)\n{tail}"
    assert "nothing left" in r.stdout, tail
    print(r.stdout.strip().splitlines()[-1])
