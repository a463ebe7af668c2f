"""Processes through the binding: spawn into a guard's set, teardown with a receipt, adopt (with the
start-time check that refuses a reused pid), the default set, errors, subreaper and the registry."""
import importlib.util
import os
import signal
import subprocess
import sys
import time

import pytest

import gpuguard

# The directory holding the gpuguard package under test (the checkout's, or an installed wheel's).
PKG = os.path.dirname(os.path.dirname(importlib.util.find_spec("gpuguard").origin))


def start_time_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])  # field 22 of /proc/PID/stat


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or between it and the read
        return False


def test_spawn_and_teardown_receipt(tmp_path):
    out = tmp_path / "out.txt"
    with gpuguard.Guard(child_grace_ms=500) as g:
        fd = os.open(out, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            pid = gpuguard.spawn(["sh", "-c", 'echo "$GG_TEST_VAR in $(pwd)"; exec sleep 30'], guard=g,
                                 env={"GG_TEST_VAR": "hello", "PATH": os.environ["PATH"]}, cwd=str(tmp_path),
                                 stdout=fd, new_process_group=True)
        finally:
            os.close(fd)
        deadline = time.monotonic() + 10
        while not out.read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert out.read_text().strip() == f"hello in {tmp_path}"
        r = gpuguard.teardown(g, grace_ms=1000)
        assert not alive(pid)
    assert r["alive"] == 0 and r["grace_ms"] == 1000
    (p,) = [p for p in r["processes"] if p["pid"] == pid]
    assert p["found"] == "tracked" and "TERM" in p["sent"]
    assert p["end"] == "signaled" and p["code"] == 15 and p["ppid"] == os.getpid()


def test_guard_close_ends_its_children():
    g = gpuguard.Guard(child_grace_ms=200)
    pid = gpuguard.spawn(["sleep", "30"], guard=g)
    assert alive(pid)
    g.close()
    assert not alive(pid)


def test_spawn_errors():
    with pytest.raises(gpuguard.NotFoundError):
        gpuguard.spawn(["/nonexistent/program"])
    with pytest.raises(gpuguard.InvalidArgumentError):
        gpuguard.spawn([])
    assert gpuguard.teardown(None, grace_ms=0)["processes"] == []


def test_adopt_with_start_time_and_refusal_of_a_mismatch():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        st = start_time_of(child.pid)
        with pytest.raises(gpuguard.NotFoundError):
            gpuguard.adopt(child.pid, start_time=st + 1)  # a pid that names another process: refused
        with pytest.raises(gpuguard.InvalidArgumentError):
            gpuguard.adopt(os.getpid())
        with gpuguard.Guard(child_grace_ms=500) as g:
            gpuguard.adopt(child.pid, guard=g, start_time=st)
            r = gpuguard.teardown(g, grace_ms=500)
        (p,) = [p for p in r["processes"] if p["pid"] == child.pid]
        assert p["start_time"] == st and p["end"] == "signaled" and p["code"] == 15
        assert not alive(child.pid)  # the teardown reaped it (so Popen.wait() later reads 0: ECHILD)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def test_teardown_reaches_grandchildren_with_subreaper(tmp_path):
    # A double-forked grandchild escapes the tracked set; as a subreaper we inherit and end it.
    script = tmp_path / "orphan.sh"
    pidfile = tmp_path / "pid"
    script.write_text(f"#!/bin/sh\n(sleep 30 & echo $! > {pidfile}) &\nexec sleep 30\n")
    script.chmod(0o700)
    r = subprocess.run([sys.executable, "-c", f"""
import os, sys, time
sys.path.insert(0, {PKG!r})
import gpuguard
gpuguard.set_subreaper(True)
pid = gpuguard.spawn([{str(script)!r}])
while not os.path.exists({str(pidfile)!r}) or not open({str(pidfile)!r}).read().strip():
    time.sleep(0.02)
gc = int(open({str(pidfile)!r}).read())
time.sleep(0.2)
r = gpuguard.teardown(None, grace_ms=500)
print(gc in [p["pid"] for p in r["processes"]], os.path.exists(f"/proc/{{gc}}"))
"""], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "False"]


def test_arm_child_close_device_fds_registry_and_orphans(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUGUARD_REGISTRY_DIR", str(tmp_path / "reg"))
    pid = os.fork()
    if pid == 0:
        try:
            gpuguard.arm_child()
            # In the child only: closing this process's own /dev/nvidia* descriptors would break CUDA
            # for the rest of the test run.
            os._exit(0 if gpuguard.close_device_fds() >= 0 else 2)
        except BaseException:
            os._exit(1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    monkeypatch.delenv("GPUGUARD_SESSION", raising=False)
    gpuguard.registry_register("0")
    try:
        rows = [r for r in gpuguard.registry_list() if r["pid"] == os.getpid()]
        assert rows and rows[0]["role"] == "leader" and rows[0]["devices"] == "0" and not rows[0]["stale"]
        # The C library leaves the process environment alone; the binding exports the id, so a child
        # started by subprocess (or multiprocessing's spawn) joins the session.
        session = gpuguard.registry_session()
        assert session and rows[0]["session"] == session and os.environ["GPUGUARD_SESSION"] == session
        seen = subprocess.run([sys.executable, "-c", "import os; print(os.environ.get('GPUGUARD_SESSION', ''))"],
                              capture_output=True, text=True, check=True).stdout.strip()
        assert seen == session
    finally:
        gpuguard.registry_unregister()
        os.environ.pop("GPUGUARD_SESSION", None)
    assert [r for r in gpuguard.registry_list() if r["pid"] == os.getpid()] == []
    assert isinstance(gpuguard.orphans(), list)


def test_spawn_in_a_pid_namespace_dies_with_its_keeper(tmp_path):
    """spawn(pid_ns="on"): the job is pid 2 of its own namespace; killing the keeper (what this process's
    death does through the death signal) ends every process of the job, a setsid'd one included."""
    if not gpuguard.pid_ns_probe():
        pytest.skip("PID namespaces refused here")
    out = tmp_path / "out"
    with open(out, "w") as f:
        keeper = gpuguard.spawn(["sh", "-c", "echo $$; setsid sleep 303.25 & wait"], stdout=f.fileno(),
                                pid_ns="on")
    for _ in range(500):
        if out.read_text().strip() and subprocess.run(["pgrep", "-fx", "sleep 303.25"],
                                                      capture_output=True).stdout.strip():
            break
        time.sleep(0.01)
    assert out.read_text().strip() == "2"
    daemon = int(subprocess.run(["pgrep", "-fx", "sleep 303.25"], capture_output=True, text=True).stdout.split()[0])
    os.kill(keeper, signal.SIGKILL)
    def gone(pid):  # no /proc entry (it may vanish between two looks), or a zombie
        try:
            with open("/proc/%d/stat" % pid) as f:
                return f.read().split(")")[1].split()[0] == "Z"
        except (FileNotFoundError, ProcessLookupError):  # the read of a reaped process's file: ESRCH
            return True

    for _ in range(500):
        if gone(daemon):
            break
        time.sleep(0.01)
    else:
        os.kill(daemon, signal.SIGKILL)
        raise AssertionError("the setsid'd daemon outlived the namespace's keeper")
    gpuguard.teardown(grace_ms=1000)
    with pytest.raises(gpuguard.InvalidArgumentError, match="pid_ns"):
        gpuguard.spawn(["true"], pid_ns="maybe")
