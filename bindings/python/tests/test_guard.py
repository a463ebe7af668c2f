"""Guards through the binding: every exit path of a Python program runs each cleanup exactly once, judged
from outside in a child interpreter (exception, KeyboardInterrupt with and without the library handling
SIGINT, SIGTERM, interpreter exit), fork, and the in-process API (ids, cancel, errors in cleanups)."""
import importlib.util
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import gpuguard

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))


def run_child(tmp_path, body, timeout=30, **popen):
    """Runs `body` in a fresh interpreter with the binding importable; `LOG` is a file path the body may
    append to. Returns the CompletedProcess and the log's lines."""
    log = tmp_path / "log.txt"
    src = textwrap.dedent(f"""
        import os, signal, sys, time
        sys.path.insert(0, {PKG!r})
        import gpuguard
        LOG = {str(log)!r}
        def mark(what):
            with open(LOG, "a") as f:
                f.write(f"{{what}} {{os.getpid()}}\\n")
    """) + textwrap.dedent(body)
    # SIGINT as an interactive shell leaves it: a runner that started these tests in the background
    # (SIGINT ignored, which a child inherits) would otherwise give the child no KeyboardInterrupt.
    popen.setdefault("preexec_fn", lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    r = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True, timeout=timeout,
                       env=dict(os.environ), **popen)
    lines = log.read_text().splitlines() if log.exists() else []
    return r, lines


def test_cleanups_lifo_ids_cancel_and_errors_inside(capfd):
    order = []
    with gpuguard.Guard(name="t") as g:
        g.on_teardown(lambda: order.append("first"), name="first")
        i = g.on_teardown(lambda: order.append("cancelled"))
        g.on_teardown(lambda: 1 / 0, name="raises")
        g.on_teardown(lambda: order.append("last"))
        assert i > 0
        g.cancel(i)
        with pytest.raises(gpuguard.NotFoundError):
            g.cancel(i)
    assert order == ["last", "first"]  # LIFO; the raising one did not stop the teardown
    err = capfd.readouterr().err
    assert "cleanup 'raises' raised" in err and "ZeroDivisionError" in err
    assert g.closed
    g.close()  # twice is fine
    with pytest.raises(gpuguard.StateError, match="closed"):
        g.on_teardown(lambda: None)


@pytest.fixture
def python_sigint():
    """Python's own SIGINT handler, also where the tests were started with SIGINT ignored."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


def test_default_signals_leave_sigint_to_python(python_sigint):
    assert not gpuguard.DEFAULT_SIGNALS & gpuguard.SIGINT
    before = signal.getsignal(signal.SIGINT)
    with gpuguard.Guard():
        assert signal.getsignal(signal.SIGINT) is before  # Python's handler, untouched
        # Python still sees its own handler at the C level too: a KeyboardInterrupt arrives as usual.
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)


def test_exception_in_with_tears_down_then_propagates(tmp_path):
    r, lines = run_child(tmp_path, """
        class Boom(Exception):
            pass
        try:
            with gpuguard.Guard() as g:
                g.on_teardown(lambda: mark("cleanup"))
                raise Boom("unchanged")
        except Boom as e:
            mark(f"caught:{e}")
    """)
    assert r.returncode == 0, r.stderr
    assert [ln.split()[0] for ln in lines] == ["cleanup", "caught:unchanged"]


def test_keyboard_interrupt_default_signals(tmp_path):
    r, lines = run_child(tmp_path, """
        with gpuguard.Guard() as g:
            g.on_teardown(lambda: mark("cleanup"))
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(10)
        mark("not reached")
    """)
    assert "KeyboardInterrupt" in r.stderr
    assert r.returncode in (-signal.SIGINT, 1), r.stderr  # Python re-raises SIGINT at exit (3.8+)
    assert [ln.split()[0] for ln in lines] == ["cleanup"]  # exactly once


def test_handle_sigint_tears_down_then_chains_to_python(tmp_path):
    r, lines = run_child(tmp_path, """
        g = gpuguard.Guard(handle_sigint=True)
        g.on_teardown(lambda: mark("cleanup"))
        try:
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):   # the teardown runs on the guard thread, then Python's handler
                time.sleep(0.01)
            mark("no KeyboardInterrupt")
        except KeyboardInterrupt:
            mark("KeyboardInterrupt")
        g.close()                  # the signal teardown ran already: only frees the handle
        mark("closed")
    """)
    assert r.returncode == 0, r.stderr
    assert [ln.split()[0] for ln in lines] == ["cleanup", "KeyboardInterrupt", "closed"]


def test_sigterm_runs_cleanup_once_and_dies_of_sigterm(tmp_path):
    ready = tmp_path / "ready"
    log = tmp_path / "log.txt"
    src = textwrap.dedent(f"""
        import os, sys, time
        sys.path.insert(0, {PKG!r})
        import gpuguard
        g = gpuguard.Guard()
        def cleanup():
            with open({str(log)!r}, "a") as f:
                f.write("cleanup\\n")
        g.on_teardown(cleanup)
        open({str(ready)!r}, "w").close()
        while True:
            time.sleep(0.05)
    """)
    p = subprocess.Popen([sys.executable, "-c", src], stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 20
    while not ready.exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert ready.exists()
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=20)
    assert p.returncode == -signal.SIGTERM, err
    assert log.read_text().splitlines() == ["cleanup"]


def test_interpreter_exit_runs_cleanups_once(tmp_path):
    r, lines = run_child(tmp_path, """
        g = gpuguard.Guard()
        g.on_teardown(lambda: mark("cleanup"))
        h = gpuguard.Guard(run_at_exit=False)
        h.on_teardown(lambda: mark("not at exit"))
        sys.exit(3)
    """)
    assert r.returncode == 3, r.stderr
    assert [ln.split()[0] for ln in lines] == ["cleanup"]


def test_forked_child_gets_state_error_and_never_runs_parent_cleanups(tmp_path):
    r, lines = run_child(tmp_path, """
        g = gpuguard.Guard()
        a = gpuguard.Arena(capacity=16 << 20)
        g.on_teardown(lambda: mark("cleanup"))
        pid = os.fork()
        if pid == 0:
            for what, call in (("guard", lambda: g.on_teardown(lambda: None)),
                               ("arena", lambda: a.alloc(256)),
                               ("spawn", lambda: gpuguard.spawn(["true"], guard=g))):
                try:
                    call()
                    mark(f"child-{what}-worked")
                except gpuguard.StateError as e:
                    mark(f"child-{what}-StateError")
            sys.exit(0)  # a normal interpreter exit: atexit hooks and finalizers run in the child
        _, status = os.waitpid(pid, 0)
        mark(f"child-exit-{os.waitstatus_to_exitcode(status)}")
        a.close()
        g.close()
    """)
    assert r.returncode == 0, r.stderr
    words = [ln.split()[0] for ln in lines]
    assert words == ["child-guard-StateError", "child-arena-StateError", "child-spawn-StateError",
                     "child-exit-0", "cleanup"], (words, r.stderr)
    child_pid = lines[0].split()[1]
    parent_pids = {ln.split()[1] for ln in lines[3:]}
    assert len(parent_pids) == 1 and child_pid not in parent_pids  # the parent ran it, the child did not


def test_arena_attached_to_guard_is_torn_down_with_it():
    g = gpuguard.Guard()
    a = gpuguard.Arena(capacity=16 << 20)
    a.alloc(1 << 20)
    g.close()
    with pytest.raises(gpuguard.StateError, match="torn down"):
        a.alloc(256)
    a.close()  # still frees the handle
